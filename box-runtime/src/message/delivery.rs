//! One message as a transport hands it to the engine.

use std::sync::Arc;
/// One message as the broker delivered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Topic.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
    /// The key, if any.
    pub key: Option<Vec<u8>>,
    /// The payload, if any (a tombstone has none).
    pub payload: Option<Vec<u8>>,
    /// Headers in broker order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Delivery {
    /// The first header with this name.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The first header with this name as UTF-8, exactly as sent (never trimmed); `None` when
    /// missing, empty or not UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header_text(name).ok().flatten()
    }

    /// The first header with this name as UTF-8, exactly as sent: `Ok(None)` when missing or
    /// empty, `Err(())` when its bytes are not UTF-8.
    pub(crate) fn header_text(&self, name: &str) -> Result<Option<&str>, ()> {
        match self.header(name) {
            None | Some([]) => Ok(None),
            Some(bytes) => std::str::from_utf8(bytes).map(Some).map_err(|_| ()),
        }
    }

    /// `topic/partition@offset`, for messages.
    pub fn coordinates(&self) -> String {
        self.at().to_string()
    }

    /// The same as [`Delivery::coordinates`], written only where it is displayed: a log field
    /// that is filtered out costs no allocation.
    pub(crate) fn at(&self) -> impl std::fmt::Display + '_ {
        Coordinates(self)
    }
}

/// [`Delivery::at`]'s display.
struct Coordinates<'a>(&'a Delivery);

impl std::fmt::Display for Coordinates<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        write!(f, "{}/{}@{}", d.topic, d.partition, d.offset)
    }
}
