//! Messages as a hostile producer can send them: any bytes in header names and values, in the
//! key and in the payload, or none of them at all.

use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedHeaders, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// A message as raw bytes. `headers` are `(name, value)` pairs, in order; an empty list sends a
/// message without headers.
#[derive(Clone, Debug, Default)]
pub struct RawMsg {
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl RawMsg {
    /// A CloudEvents binary-mode message with this id, type and payload (no key).
    pub fn cloudevent(id: &[u8], event_type: &[u8], payload: Vec<u8>) -> Self {
        Self::default()
            .header(b"ce_id", Some(id))
            .header(b"ce_type", Some(event_type))
            .header(b"ce_source", Some(b"hostile-tests"))
            .header(b"ce_specversion", Some(b"1.0"))
            .payload(Some(payload))
    }

    /// Adds a header.
    pub fn header(mut self, name: &[u8], value: Option<&[u8]>) -> Self {
        self.headers
            .push((name.to_vec(), value.map(<[u8]>::to_vec)));
        self
    }

    /// Sets the payload (`None`: a tombstone).
    pub fn payload(mut self, payload: Option<Vec<u8>>) -> Self {
        self.payload = payload;
        self
    }

    /// Sets the key.
    pub fn key(mut self, key: &[u8]) -> Self {
        self.key = Some(key.to_vec());
        self
    }
}

/// Headers whose names may be any bytes. rdkafka's `OwnedHeaders::insert` takes the name as
/// `&str`, so each header is added through librdkafka's `rd_kafka_header_add` with an explicit
/// name length instead.
pub fn raw_headers(headers: &[(Vec<u8>, Option<Vec<u8>>)]) -> OwnedHeaders {
    let owned = OwnedHeaders::new_with_capacity(headers.len().max(1));
    // `as_borrowed` is a pointer cast of the native headers object: this is that pointer.
    let native = owned.as_borrowed() as *const BorrowedHeaders as *mut rd::rd_kafka_headers_t;
    for (name, value) in headers {
        let (value_ptr, value_len) = match value {
            Some(v) => (v.as_ptr() as *const std::ffi::c_void, v.len() as isize),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `native` is the live, writable headers object owned by `owned`; librdkafka
        // copies `name.len()` bytes of name and `value_len` bytes of value.
        let err = unsafe {
            rd::rd_kafka_header_add(
                native,
                name.as_ptr().cast(),
                name.len() as isize,
                value_ptr,
                value_len,
            )
        };
        assert_eq!(
            err,
            rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
            "rd_kafka_header_add"
        );
    }
    owned
}

/// A producer for Tansu that accepts messages up to `max_bytes`.
pub fn producer(brokers: &str, max_bytes: usize) -> FutureProducer {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .set("message.max.bytes", max_bytes.to_string())
        .create()
        .expect("producer")
}

/// Sends `msg` to `topic`/`partition`; returns its offset, or the broker's error.
pub async fn send(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    msg: &RawMsg,
) -> Result<i64, rdkafka::error::KafkaError> {
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).partition(partition);
    if !msg.headers.is_empty() {
        record = record.headers(raw_headers(&msg.headers));
    }
    if let Some(key) = &msg.key {
        record = record.key(key.as_slice());
    }
    if let Some(payload) = &msg.payload {
        record = record.payload(payload.as_slice());
    }
    let delivered = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)?;
    assert_eq!(delivered.partition, partition);
    Ok(delivered.offset)
}
