//! Text that goes into the database is made safe first: PostgreSQL text cannot hold NUL, an
//! index entry has a size limit, and an error message can be arbitrarily long. Raw bytes are
//! never altered: payloads, keys and header values are stored as bytes.

use std::borrow::Cow;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

/// Longest event id (or source) stored as it is in the inbox key; longer ones are stored as
/// their digest (see [`inbox_id`]).
pub const MAX_ID_BYTES: usize = 200;

/// Longest error text stored (attempts and dead letters).
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// Longest other text stored from a message (e.g. an event type header in a dead letter).
pub const MAX_LABEL_BYTES: usize = 1024;

/// `text` with every NUL replaced by U+FFFD and cut to at most `max` bytes (at a character
/// boundary, with a note of how much was cut).
pub fn safe_text(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max && !text.contains('\0') {
        return Cow::Borrowed(text);
    }
    let clean = text.replace('\0', "\u{FFFD}");
    if clean.len() <= max {
        return Cow::Owned(clean);
    }
    let note = format!("… [{} bytes cut]", clean.len());
    let mut end = max.saturating_sub(note.len());
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{note}", &clean[..end]))
}

/// The form of an event id (or source) the inbox keys on: the id itself when it is at most
/// [`MAX_ID_BYTES`] long and holds no NUL, else `sha256:<64 hex digits>` of its bytes. Distinct
/// ids stay distinct (an id cannot start with `sha256:` and be that long without being
/// hashed itself), and the same id always gives the same key.
pub fn inbox_id(id: &str) -> Cow<'_, str> {
    let looks_hashed = id.len() == 71 && id.starts_with("sha256:");
    if id.len() <= MAX_ID_BYTES && !id.contains('\0') && !looks_hashed {
        return Cow::Borrowed(id);
    }
    Cow::Owned(format!("sha256:{}", sha256_hex(id.as_bytes())))
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A header name as text: itself when it is UTF-8, else with each invalid byte written as
/// `\xHH` (header names reach inoutbox as bytes; the raw value bytes are kept as they are).
pub fn header_name(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let mut out = String::with_capacity(bytes.len() + 8);
            for chunk in bytes.utf8_chunks() {
                out.push_str(chunk.valid());
                for b in chunk.invalid() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_replaced_and_length_bounded() {
        assert_eq!(safe_text("a\0b", 10), "a\u{FFFD}b");
        let long = "é".repeat(1000);
        let cut = safe_text(&long, 100);
        assert!(cut.len() <= 100, "{}", cut.len());
        assert!(cut.ends_with("[2000 bytes cut]"), "{cut}");
        assert!(matches!(safe_text("fine", 10), Cow::Borrowed(_)));
    }

    #[test]
    fn long_or_nul_ids_are_hashed_and_stay_distinct() {
        assert_eq!(inbox_id("order-1"), "order-1");
        assert_eq!(inbox_id("  X  "), "  X  ", "ids are taken verbatim");
        let long = "x".repeat(5000);
        let key = inbox_id(&long);
        assert_eq!(key.len(), 71);
        assert!(key.starts_with("sha256:"));
        assert_eq!(inbox_id(&long), key, "stable");
        assert_ne!(inbox_id(&"y".repeat(5000)), key);
        assert_ne!(inbox_id("a\0b"), inbox_id("a\0c"));
        assert!(!inbox_id("a\0b").contains('\0'));
        // An id that looks like a digest is hashed too, so it cannot collide with one.
        assert_ne!(inbox_id(&key), key);
    }

    #[test]
    fn invalid_header_names_are_escaped() {
        assert_eq!(header_name(b"ce_id"), "ce_id");
        assert_eq!(header_name(b"x-\xff\xfe"), "x-\\xff\\xfe");
    }
}
