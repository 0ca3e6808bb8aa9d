//! "did you mean `event`?" for unknown keys: known aliases first, then the closest key by edit
//! distance.

/// The key `unknown` was probably meant to be: an alias's target (`consumer_group` -> `group`),
/// else the key at the smallest edit distance when that distance is small for the word's length.
pub(crate) fn closest(
    unknown: &str,
    keys: &[&'static str],
    aliases: &[(&str, &'static str)],
) -> Option<&'static str> {
    if let Some((_, key)) = aliases.iter().find(|(alias, _)| *alias == unknown) {
        return Some(key);
    }
    let lower = unknown.to_ascii_lowercase().replace('-', "_");
    keys.iter()
        .map(|key| (edit_distance(&lower, key), *key))
        .filter(|(distance, key)| *distance <= threshold(key.len().max(lower.len())))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, key)| key)
}

/// How many edits still look like a typo of a word of this length.
fn threshold(len: usize) -> usize {
    match len {
        0..=4 => 1,
        5..=8 => 2,
        _ => 3,
    }
}

/// Levenshtein distance (insertions, deletions, substitutions), on bytes: keys are ASCII.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &[&str] = &["event", "group", "crate"];

    #[test]
    fn typos_find_the_key() {
        assert_eq!(closest("evnt", KEYS, &[]), Some("event"));
        assert_eq!(closest("grup", KEYS, &[]), Some("group"));
        assert_eq!(closest("Event", KEYS, &[]), Some("event"));
        assert_eq!(closest("events", KEYS, &[]), Some("event"));
    }

    #[test]
    fn aliases_win_over_distance() {
        assert_eq!(
            closest("consumer_group", KEYS, &[("consumer_group", "group")]),
            Some("group")
        );
    }

    #[test]
    fn unrelated_words_find_nothing() {
        assert_eq!(closest("topic", KEYS, &[]), None);
        assert_eq!(closest("retries", KEYS, &[]), None);
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", "abc"), 0);
    }
}
