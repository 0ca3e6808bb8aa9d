//! Text for people: aligned tables, cells made safe to print.

use std::fmt::Write as _;

/// `text` on one line and at most `max` characters: control characters (a newline or an
/// escape sequence in an error or an id) are shown escaped, never sent to the terminal.
pub(super) fn cell(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Text shown on lines of its own (an error chain, a payload): control characters other than
/// newlines and tabs escaped, every line indented by two spaces.
pub(super) fn block(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        out.push_str("  ");
        for c in line.chars() {
            if c.is_control() && c != '\t' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// An aligned table with a header line.
pub(super) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, c) in cells.enumerate() {
            let pad = widths[i].saturating_sub(c.chars().count());
            let _ = write!(text, "{c}{}  ", " ".repeat(pad));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// Seconds as people read an age: `45s`, `12m 5s`, `3h 20m`, `2d 4h`.
pub(super) fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `Some(text)` or `-`.
pub(super) fn or_dash(text: Option<&str>, max: usize) -> String {
    text.map_or_else(|| "-".to_owned(), |t| cell(t, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(cell("a\nb\x1b[31m", 80), "a\\nb\\u{1b}[31m");
        assert_eq!(cell("abcdef", 3), "abc…");
        assert_eq!(block("x\ny\x07"), "  x\n  y\\u{7}\n");
    }

    #[test]
    fn tables_align_their_columns() {
        let t = table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    LONG\nxyz  1\n");
    }
}
