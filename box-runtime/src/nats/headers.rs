//! Headers in and out of async-nats: NATS headers are text lines, so a name or value it cannot
//! carry (control characters, `:` in a name, a line break in a value) is left out, logged.

use std::str::FromStr;

use async_nats::header::{HeaderName, HeaderValue};
use async_nats::HeaderMap;

/// Headers as the engine reads them: names, and values as bytes.
pub(super) type Headers = Vec<(String, Option<Vec<u8>>)>;

/// The headers of an outgoing message; those NATS cannot carry are left out (logged).
pub(super) fn outgoing<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        match (HeaderName::from_str(name), HeaderValue::from_str(value)) {
            (Ok(name), Ok(value)) => map.append(name, value),
            _ => tracing::debug!(target: "inoutbox::nats", header = %name.escape_debug(),
                "header left out: NATS cannot carry its name or value"),
        }
    }
    map
}

/// The headers of a received message as the engine reads them (sorted by name: NATS keeps no
/// order between names; the values of one name keep theirs).
pub(super) fn incoming(headers: Option<&HeaderMap>) -> Headers {
    let Some(headers) = headers else {
        return Vec::new();
    };
    // Sized up front (one value a name, as CloudEvents headers are): collecting the nested
    // iterator would grow the vector from nothing, a reallocation or two a message.
    let mut out: Headers = Vec::with_capacity(headers.len());
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        out.extend(
            values
                .iter()
                .map(|v| (name.to_owned(), Some(v.as_str().as_bytes().to_vec()))),
        );
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A raw header block (`NATS/1.0`, then `name: value` lines) as the engine reads it: values
/// are its bytes as they are (trimmed of the spaces around them, continuation lines joined),
/// names are text (bytes that are not UTF-8 replaced), sorted by name as [`incoming`] sorts
/// them. The flag says whether async-nats hands such a message on: UTF-8, its version line
/// without a status, and a name it accepts on each line. An empty block has no headers and is
/// readable.
pub(super) fn raw(block: &[u8]) -> (Headers, bool) {
    if block.is_empty() {
        return (Vec::new(), true);
    }
    let mut readable = std::str::from_utf8(block).is_ok();
    let mut lines = block
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    // A status after the version (`NATS/1.0 408`) makes async-nats's pull take the message
    // for one of the server's own (a timeout, a heartbeat) and never hand it on.
    readable &= lines.next().is_some_and(|version| {
        version
            .strip_prefix(b"NATS/1.0")
            .is_some_and(|rest| rest.trim_ascii().is_empty())
    });
    let mut out = Headers::new();
    for line in lines.filter(|line| !line.is_empty()) {
        if line[0].is_ascii_whitespace() {
            if let Some((_, Some(value))) = out.last_mut() {
                value.extend_from_slice(line);
            }
            continue;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            readable = false;
            out.push((String::from_utf8_lossy(line).into_owned(), None));
            continue;
        };
        let name = String::from_utf8_lossy(&line[..colon]).into_owned();
        readable &= HeaderName::from_str(&name).is_ok();
        out.push((name, Some(line[colon + 1..].trim_ascii_start().to_vec())));
    }
    for (_, value) in &mut out {
        if let Some(value) = value {
            value.truncate(value.trim_ascii_end().len());
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    (out, readable)
}

#[cfg(test)]
mod tests {
    use super::raw;

    #[test]
    fn a_raw_block_keeps_its_bytes_and_says_whether_async_nats_reads_it() {
        let (headers, readable) = raw(b"NATS/1.0\r\nce_type: Order\r\nce_id:  a\xff\r\n\r\n");
        assert!(!readable);
        assert_eq!(
            headers,
            vec![
                ("ce_id".to_owned(), Some(b"a\xff".to_vec())),
                ("ce_type".to_owned(), Some(b"Order".to_vec())),
            ]
        );
        let (headers, readable) = raw(b"NATS/1.0\r\nx: one\r\n two\r\n\r\n");
        assert!(readable);
        assert_eq!(headers, vec![("x".to_owned(), Some(b"one two".to_vec()))]);
        assert!(raw(b"").1);
        assert!(!raw(b"NATS/1.0\r\nno colon\r\n\r\n").1);
        assert!(!raw(b"HTTP/1.1\r\nx: y\r\n\r\n").1);
        assert!(!raw(b"NATS/1.0 408 Request Timeout\r\nx: y\r\n\r\n").1);
    }
}
