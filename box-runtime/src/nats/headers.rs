//! Headers in and out of async-nats: NATS headers are text lines, so a name or value it cannot
//! carry (control characters, `:` in a name, a line break in a value) is left out, logged.

use std::str::FromStr;

use async_nats::header::{HeaderName, HeaderValue};
use async_nats::HeaderMap;

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
pub(super) fn incoming(headers: Option<&HeaderMap>) -> Vec<(String, Option<Vec<u8>>)> {
    let Some(headers) = headers else {
        return Vec::new();
    };
    let mut out: Vec<(String, Option<Vec<u8>>)> = headers
        .iter()
        .flat_map(|(name, values)| {
            let name: &str = name.as_ref();
            values
                .iter()
                .map(move |v| (name.to_owned(), Some(v.as_str().as_bytes().to_vec())))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
