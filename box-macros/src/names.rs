//! Which names the macros accept for event types, topics and consumer groups.

/// The characters allowed in event types, topics and groups, for messages.
pub(crate) const ALLOWED: &str = "ASCII letters, digits, `.`, `_` and `-`";

/// The longest name accepted (Kafka's limit for topic names).
pub(crate) const MAX_LEN: usize = 249;

/// Why `value` is not a valid name for `what` (`event`, `group`, ...), or `None` when it is.
pub(crate) fn invalid_name(what: &str, value: &str, example: &str) -> Option<String> {
    if value.is_empty() {
        return Some(format!(
            "`{what}` is empty: write a name, e.g. `{what} = \"{example}\"`"
        ));
    }
    if value.len() > MAX_LEN {
        return Some(format!(
            "`{what}` is longer than {MAX_LEN} bytes: use a shorter name"
        ));
    }
    if let Some(bad) = value.chars().find(|c| !allowed(*c)) {
        return Some(format!(
            "`{what}` contains {}: use only {ALLOWED}, e.g. `{what} = \"{example}\"`",
            describe(bad)
        ));
    }
    None
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

fn describe(c: char) -> String {
    if c == ' ' {
        "a space".to_owned()
    } else if c.is_control() || c.is_whitespace() {
        format!("the character {c:?}")
    } else {
        format!("`{c}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_letters_digits_dot_underscore_dash() {
        assert_eq!(invalid_name("group", "billing-v2.eu_west", "billing"), None);
    }

    #[test]
    fn rejects_empty_space_and_slash() {
        assert!(invalid_name("group", "", "billing")
            .unwrap()
            .contains("is empty"));
        assert!(invalid_name("group", "a b", "billing")
            .unwrap()
            .contains("a space"));
        assert!(invalid_name("event", "a/b", "X").unwrap().contains("`/`"));
        assert!(invalid_name("event", &"x".repeat(250), "X")
            .unwrap()
            .contains("longer"));
    }
}
