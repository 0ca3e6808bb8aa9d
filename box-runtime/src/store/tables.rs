//! The names of inoutbox's tables, shared by every store.

use super::StoreError;
use crate::ident::{Ident, IdentError, TableName};
use crate::names;

/// The names derived from table names by the shipped migrations (`{table:suffix}`): checked by
/// [`Tables::validate`], and kept in step with the migrations by a test.
pub(crate) const DERIVED: &[(&str, &str)] = &[
    ("inbox", "unprocessed_idx"),
    ("inbox", "processed_idx"),
    ("inbox", "received_idx"),
    ("inbox", "received_key_idx"),
    ("effects", "key_idx"),
    ("effects", "pending_idx"),
    ("effects", "done_idx"),
    ("inbox", "business_key_idx"),
    ("inbox", "due_idx"),
    // The partitioned inbox (`PgStore::partitioned_by_day`): its default partition, and its
    // daily partitions `<inbox>_pYYYYMMDD` (this entry stands for the length of each).
    ("inbox", "default"),
    ("inbox", "p20000101"),
    ("dead_letters", "group_idx"),
    ("dead_letters", "event_idx"),
    ("outbox", "pending_idx"),
    ("outbox", "pending_key_idx"),
    ("outbox", "published_idx"),
    ("outbox", "parked_idx"),
    ("outbox", "relay_locks"),
    ("outbox", "fresh_idx"),
    ("outbox", "retry_idx"),
    ("outbox", "slot"),
    ("outbox", "order"),
    ("outbox", "ready_idx"),
    ("outbox", "scheduled_idx"),
];

/// The names of inoutbox's tables. Every name is a validated identifier; set a schema to keep
/// inoutbox's tables (and tests) apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    /// Inbox rows: `(consumer_group, source, event_id)`.
    pub inbox: TableName,
    /// Failed attempts, kept outside the handler's transaction.
    pub attempts: TableName,
    /// Dead letters.
    pub dead_letters: TableName,
    /// Outbox rows.
    pub outbox: TableName,
    /// Applied migrations.
    pub migrations: TableName,
    /// Effects scheduled by handlers to run after their transaction commits.
    pub effects: TableName,
}

impl Default for Tables {
    fn default() -> Self {
        Self::in_schema(None)
    }
}

fn default_table(schema: Option<&Ident>, name: &str) -> TableName {
    TableName::new(
        schema.cloned(),
        Ident::new(name).expect("default table names are valid"),
    )
}

impl Tables {
    fn in_schema(schema: Option<&Ident>) -> Self {
        Self {
            inbox: default_table(schema, names::INBOX_TABLE),
            attempts: default_table(schema, names::ATTEMPTS_TABLE),
            dead_letters: default_table(schema, names::DEAD_LETTER_TABLE),
            outbox: default_table(schema, names::OUTBOX_TABLE),
            migrations: default_table(schema, names::MIGRATIONS_TABLE),
            effects: default_table(schema, names::EFFECTS_TABLE),
        }
    }

    /// The default table names inside `schema` (created by [`PgStore::migrate`](crate::PgStore::migrate) if missing).
    pub fn with_schema(schema: &str) -> Result<Self, IdentError> {
        Ok(Self::in_schema(Some(&Ident::new(schema)?)))
    }

    /// The schema the tables live in, if set.
    pub fn schema(&self) -> Option<&Ident> {
        self.inbox.schema()
    }

    fn table(&self, name: &str) -> Result<TableName, IdentError> {
        Ok(TableName::new(self.schema().cloned(), Ident::new(name)?))
    }

    /// Checks that the tables and the names derived from them (indexes, the SQLite relay's
    /// lease table) are all distinct and fit PostgreSQL's 63-byte identifiers, so that no
    /// migration silently skips an object whose name collides with another's.
    pub fn validate(&self) -> Result<(), StoreError> {
        let mut seen: Vec<(String, String)> = Vec::new();
        let mut claim = |name: String, what: String| match seen.iter().find(|(n, _)| *n == name) {
            Some((_, other)) => Err(StoreError::Config(format!(
                "{what} and {other} would both be named `{name}`: give the tables distinct names"
            ))),
            None => {
                seen.push((name, what));
                Ok(())
            }
        };
        for (role, table) in self.roles() {
            claim(
                table.name().as_str().to_owned(),
                format!("the {role} table"),
            )?;
        }
        for (role, suffix) in DERIVED {
            let table = self
                .by_placeholder(role)
                .expect("DERIVED names known tables");
            let name = format!("{}_{suffix}", table.name().as_str());
            if name.len() > 63 {
                return Err(StoreError::Config(format!(
                    "the {role} table name `{}` is too long: `{name}`, derived from it, exceeds \
                     63 bytes; use a name of at most {} bytes",
                    table.name().as_str(),
                    62 - suffix.len()
                )));
            }
            claim(name, format!("the `{suffix}` of the {role} table"))?;
        }
        Ok(())
    }

    /// The table a migration template names `{name}` (see `store::migrate`).
    pub(crate) fn by_placeholder(&self, name: &str) -> Option<&TableName> {
        self.roles()
            .into_iter()
            .find_map(|(role, table)| (role == name).then_some(table))
    }

    /// Every table with its role, the name migrations give it in braces (`{inbox}`).
    pub(crate) fn roles(&self) -> [(&'static str, &TableName); 6] {
        [
            ("inbox", &self.inbox),
            ("attempts", &self.attempts),
            ("dead_letters", &self.dead_letters),
            ("outbox", &self.outbox),
            ("migrations", &self.migrations),
            ("effects", &self.effects),
        ]
    }

    /// The default tables in this one's schema.
    pub(crate) fn defaults(&self) -> Self {
        Self::in_schema(self.schema())
    }

    /// Renames the inbox table.
    pub fn inbox(mut self, name: &str) -> Result<Self, IdentError> {
        self.inbox = self.table(name)?;
        Ok(self)
    }

    /// Renames the attempts table.
    pub fn attempts(mut self, name: &str) -> Result<Self, IdentError> {
        self.attempts = self.table(name)?;
        Ok(self)
    }

    /// Renames the dead-letter table.
    pub fn dead_letters(mut self, name: &str) -> Result<Self, IdentError> {
        self.dead_letters = self.table(name)?;
        Ok(self)
    }

    /// Renames the outbox table.
    pub fn outbox(mut self, name: &str) -> Result<Self, IdentError> {
        self.outbox = self.table(name)?;
        Ok(self)
    }

    /// Renames the effects table.
    pub fn effects(mut self, name: &str) -> Result<Self, IdentError> {
        self.effects = self.table(name)?;
        Ok(self)
    }

    /// Renames the migrations table.
    pub fn migrations(mut self, name: &str) -> Result<Self, IdentError> {
        self.migrations = self.table(name)?;
        Ok(self)
    }
}
