use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

/// A unit struct is an event without a payload (JSON `null`) and without a key.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "CacheFlushed", topic = "ops")]
pub struct CacheFlushed;

#[inbox_handler(event = "CacheFlushed", group = "cache")]
async fn flush(_event: CacheFlushed, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {
    assert_eq!(CacheFlushed::EVENT_TYPE, "CacheFlushed");
    assert_eq!(CacheFlushed.key(), None);
    let _ = flush;
}
