//! [`MessageMeta`]: what a handler may know about the message it handles.

/// What a handler may know about the message it handles (its optional third parameter,
/// `meta: &MessageMeta`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageMeta {
    /// The consumer group handling the message.
    pub group: String,
    /// The event id the inbox deduplicates on.
    pub event_id: String,
    /// The event source, when the consumer is configured to key the inbox by (source, id).
    pub source: Option<String>,
    /// The event type (`ce_type`).
    pub event_type: String,
    /// Broker coordinates.
    pub topic: String,
    /// Broker coordinates.
    pub partition: i32,
    /// Broker coordinates.
    pub offset: i64,
    /// The message key, if any.
    pub key: Option<Vec<u8>>,
    /// The message headers, in broker order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Which attempt this is: 1 for the first delivery, 2 for the first retry, ...
    pub attempt: u32,
    /// The effects table of the store the handler runs on (`None`: the default name).
    pub(crate) effects_table: Option<std::sync::Arc<str>>,
}

impl MessageMeta {
    /// Metadata for calling a handler directly (in tests): the given group, event id and event
    /// type; no source, key or headers; empty topic, partition 0, offset 0; attempt 1.
    pub fn new(
        group: impl Into<String>,
        event_id: impl Into<String>,
        event_type: impl Into<String>,
    ) -> Self {
        Self {
            group: group.into(),
            event_id: event_id.into(),
            source: None,
            event_type: event_type.into(),
            topic: String::new(),
            partition: 0,
            offset: 0,
            key: None,
            headers: Vec::new(),
            attempt: 1,
            effects_table: None,
        }
    }

    /// The first header with this name, as bytes.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }
}
