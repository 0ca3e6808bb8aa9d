//! SQL identifiers that come from configuration: validated once, always quoted.

use std::fmt;

/// A validated SQL identifier (a table or schema name): ASCII letters, digits and `_`, not
/// starting with a digit, at most 63 bytes. Rendered double-quoted, so it is never interpolated
/// unchecked.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ident(String);

/// A configured name is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid SQL identifier `{name}`: {reason} (use ASCII letters, digits and `_`, not starting with a digit, at most 63 bytes)")]
pub struct IdentError {
    /// The rejected name.
    pub name: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Ident {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, IdentError> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > 63 {
            Some("it is longer than 63 bytes")
        } else if name.as_bytes()[0].is_ascii_digit() {
            Some("it starts with a digit")
        } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            Some("it contains a character other than a letter, a digit or `_`")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(IdentError { name, reason }),
            None => Ok(Self(name)),
        }
    }

    /// The bare name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Ident {
    /// Writes the identifier double-quoted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

/// Any name read from a database catalog (not validated: it may hold any character), quoted for
/// a statement, its own double quotes doubled.
pub(crate) fn quote_name(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A table name, optionally qualified by a schema.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<Ident>,
    name: Ident,
}

impl TableName {
    /// A table in `schema` (or on the search path when `None`).
    pub fn new(schema: Option<Ident>, name: Ident) -> Self {
        Self { schema, name }
    }

    /// The unqualified name.
    pub fn name(&self) -> &Ident {
        &self.name
    }

    /// The schema, if qualified.
    pub fn schema(&self) -> Option<&Ident> {
        self.schema.as_ref()
    }

    /// A derived name for an index or constraint of this table: `<table>_<suffix>`, unqualified.
    pub fn derived(&self, suffix: &str) -> String {
        let mut base = format!("{}_{}", self.name.as_str(), suffix);
        base.truncate(63);
        format!("\"{base}\"")
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_identifiers_and_quotes_them() {
        let t = TableName::new(
            Some(Ident::new("app").unwrap()),
            Ident::new("inoutbox_inbox").unwrap(),
        );
        assert_eq!(t.to_string(), "\"app\".\"inoutbox_inbox\"");
    }

    #[test]
    fn rejects_everything_that_could_inject() {
        for bad in [
            "",
            "1abc",
            "a-b",
            "a\"b",
            "a;drop table x",
            "a b",
            "ä",
            &"x".repeat(64),
        ] {
            assert!(Ident::new(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
