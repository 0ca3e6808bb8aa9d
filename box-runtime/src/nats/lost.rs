//! Deliveries lost on the way, read from the stream itself.
//!
//! async-nats drops its connection when a delivered message's header block is not text it can
//! read (bytes that are not UTF-8, which only a hand-written client can publish): the message
//! never reaches the reader, and JetStream delivers it again after its acknowledgement wait,
//! with the same result. The reader notices that its consumer delivered past what it handed on
//! and reads what it lost through the stream's message-get API
//! (`$JS.API.STREAM.MSG.GET.<stream>`): a plain request whose JSON reply carries the headers and
//! the payload in base64, so async-nats never parses them. Its acknowledgement is made here
//! too: the consumer's acknowledgement subject, with the message's stream sequence.

use async_nats::jetstream::message::Acker;
use async_nats::jetstream::Context;

use super::headers::{self, Headers};

/// A message read from the stream.
pub(super) struct Lost {
    /// Its stream sequence.
    pub(super) sequence: u64,
    /// Its headers as the engine reads them.
    pub(super) headers: Headers,
    /// Whether async-nats could have read its headers.
    pub(super) readable: bool,
    pub(super) payload: Vec<u8>,
}

/// The messages of `subject` in `stream` after the sequence `after` up to `until` (both
/// stream sequences, `until` included), in order; `None` when there are more than `limit`.
pub(super) async fn read(
    js: &Context,
    stream: &str,
    subject: &str,
    after: u64,
    until: u64,
    limit: usize,
) -> Result<Option<Vec<Lost>>, String> {
    let mut lost = Vec::new();
    let mut from = after + 1;
    while from <= until {
        let Some(message) = get(js, stream, subject, from).await? else {
            break;
        };
        if message.sequence > until {
            break;
        }
        if lost.len() == limit {
            return Ok(None);
        }
        from = message.sequence + 1;
        lost.push(message);
    }
    Ok(Some(lost))
}

/// The first message of `subject` at or after the sequence `from`, if any.
async fn get(js: &Context, stream: &str, subject: &str, from: u64) -> Result<Option<Lost>, String> {
    let request = serde_json::json!({ "seq": from, "next_by_subj": subject });
    let reply: serde_json::Value = js
        .request(format!("STREAM.MSG.GET.{stream}"), &request)
        .await
        .map_err(|e| format!("reading stream {stream} at {from}: {e}"))?;
    if let Some(error) = reply.get("error") {
        // 404: no message of the subject at or after `from`.
        if error.get("code").and_then(serde_json::Value::as_u64) == Some(404) {
            return Ok(None);
        }
        return Err(format!("reading stream {stream} at {from}: {error}"));
    }
    let message = &reply["message"];
    let field = |name: &str| {
        let text = message[name].as_str().unwrap_or("");
        base64(text).ok_or_else(|| format!("stream {stream} at {from}: `{name}` is not base64"))
    };
    let sequence = message["seq"]
        .as_u64()
        .ok_or_else(|| format!("stream {stream} at {from}: a reply without a sequence"))?;
    let (headers, readable) = headers::raw(&field("hdrs")?);
    Ok(Some(Lost {
        sequence,
        headers,
        readable,
        payload: field("data")?,
    }))
}

/// The acknowledgement of a message of sequence `sequence` delivered by `consumer` as its
/// delivery `delivery`: the subject JetStream gives its deliveries as their reply
/// (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream sequence>.<delivery sequence>.<time>.<pending>`).
/// With the consumer acknowledging all, the server moves its floor to the stream sequence and
/// the delivery sequence; `delivery` must therefore never exceed the real one (a later
/// acknowledgement at or below it would be ignored).
pub(super) fn acker(
    js: &Context,
    stream: &str,
    consumer: &str,
    sequence: u64,
    delivery: u64,
) -> Acker {
    let reply = format!("$JS.ACK.{stream}.{consumer}.1.{sequence}.{delivery}.0.0");
    Acker::new(js.clone(), Some(reply.into()))
}

/// Standard base64 (with or without padding); `None` when `text` is not base64.
fn base64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0u32);
    for c in text.trim_end_matches('=').bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push(u8::try_from((bits >> count) & 0xff).unwrap_or(0));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_decodes_what_the_server_encodes() {
        assert_eq!(base64("").as_deref(), Some(&b""[..]));
        assert_eq!(base64("Zg==").as_deref(), Some(&b"f"[..]));
        assert_eq!(base64("Zm8=").as_deref(), Some(&b"fo"[..]));
        assert_eq!(base64("Zm9v").as_deref(), Some(&b"foo"[..]));
        assert_eq!(base64("Zm9vYg").as_deref(), Some(&b"foob"[..]));
        assert_eq!(base64("/+8A").as_deref(), Some(&[0xff, 0xef, 0x00][..]));
        assert_eq!(base64("not base64!"), None);
    }
}
