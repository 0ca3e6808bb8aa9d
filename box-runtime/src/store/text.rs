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

/// A header name as text, losslessly and injectively: the name itself when it is UTF-8 with
/// neither a backslash nor a NUL, else with each NUL and each byte that is not UTF-8 written as
/// `\xHH` and each backslash doubled (`\\`), so a literal name that looks like an escape
/// (`x-\xff`) stays distinct from the byte it spells, and [`header_name_bytes`] gives the bytes
/// back. (Header names reach inoutbox as bytes; the raw value bytes are kept as they are.)
pub fn header_name(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes) {
        if !s.contains(['\\', '\0']) {
            return s.to_owned();
        }
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\0' => out.push_str("\\x00"),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// The bytes of a header name written by [`header_name`]. A name that [`header_name`] cannot
/// have written (a lone backslash, a bad escape) is taken as it is.
pub fn header_name_bytes(name: &str) -> Cow<'_, [u8]> {
    if !name.contains('\\') {
        return Cow::Borrowed(name.as_bytes());
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'\\')) => {
                out.push(b'\\');
                i += 2;
            }
            (b'\\', Some(b'x')) => {
                let hex = bytes
                    .get(i + 2..i + 4)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 4;
                    }
                    None => return Cow::Borrowed(name.as_bytes()),
                }
            }
            (b'\\', _) => return Cow::Borrowed(name.as_bytes()),
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

/// Headers as JSON text, `[[name, "hex" | null], ...]`: exact for any bytes, for the stores that
/// keep a message's headers in one text column (SQLite, MySQL).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn encode_headers(headers: &[(String, Option<Vec<u8>>)]) -> String {
    let list: Vec<(&str, Option<String>)> = headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str(),
                v.as_ref()
                    .map(|b| b.iter().map(|x| format!("{x:02x}")).collect()),
            )
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".to_owned())
}

/// The headers [`encode_headers`] wrote.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn decode_headers(text: &str) -> Vec<(String, Option<Vec<u8>>)> {
    let list: Vec<(String, Option<String>)> = serde_json::from_str(text).unwrap_or_default();
    list.into_iter()
        .map(|(n, v)| {
            let bytes = v.map(|hex| {
                (0..hex.len() / 2)
                    .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
                    .collect()
            });
            (n, bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    #[test]
    fn headers_round_trip_exactly() {
        let headers = vec![
            ("ce_id".to_owned(), Some(b"abc".to_vec())),
            ("bin".to_owned(), Some(vec![0, 255, 10, 34])),
            ("none".to_owned(), None),
            ("empty".to_owned(), Some(Vec::new())),
        ];
        assert_eq!(decode_headers(&encode_headers(&headers)), headers);
    }

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

    #[test]
    fn header_names_with_a_nul_or_that_look_like_escapes_stay_distinct_and_come_back() {
        // A NUL is kept (escaped), not cut; a literal name that spells an escape differs from
        // the byte it spells.
        assert_eq!(header_name(b"a\0b"), "a\\x00b");
        assert_ne!(header_name(b"a\0b"), header_name(b"a"));
        assert_ne!(header_name(b"x-\xff"), header_name(b"x-\\xff"));
        assert_ne!(header_name(b"a\0b"), header_name(b"a\\x00b"));
        assert_eq!(header_name(b"x-\\xff"), "x-\\\\xff");
        for name in [
            &b"ce_id"[..],
            b"a\0b",
            b"\0",
            b"x-\xff\xfe",
            b"x-\\xff",
            b"\\",
            b"\\\\x00",
            b"caf\xc3\xa9\\",
            b"",
        ] {
            let text = header_name(name);
            assert!(!text.contains('\0'), "{text:?}");
            assert_eq!(&*header_name_bytes(&text), name, "{text:?}");
        }
    }
}
