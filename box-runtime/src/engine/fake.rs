//! A store and a partition link for the engine's unit tests: a store that panics or blocks
//! where a test says, outside the handler's guard.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::engine::config::{InboxConfig, Ordering};
use crate::engine::Inbox;
use crate::handler::{DispatchTable, HandlerRegistration};
use crate::message::Delivery;
use crate::store::{
    Claim, ClaimRequest, DeadLetter, InboxKey, InboxStore, LeaseRequest, ReceivedRow, StoreError,
    StoredDeadLetter, Tables,
};
use crate::transport::PartitionLink;

/// A store whose dead letters are all a test needs (the messages have no event id): it panics
/// on the message at `panic_at`, and never finishes the one at `block_at`, holding `held`'s
/// sender until its future is dropped.
#[derive(Default)]
pub(crate) struct Faulty {
    pub(crate) tables: Tables,
    pub(crate) panic_at: Option<i64>,
    pub(crate) block_at: Option<i64>,
    pub(crate) held: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    /// The received row a two-phase worker claims (once); its handler's transaction never
    /// gets past the lease check, holding `held`'s sender.
    pub(crate) received: Mutex<Option<ReceivedRow>>,
    /// The due deferred row the deferred worker claims (once); its run gets no further than
    /// the received row's.
    pub(crate) due: Mutex<Option<ReceivedRow>>,
}

impl InboxStore for Faulty {
    type Tx = ();
    const NAME: &'static str = "faulty";
    const TWO_PHASE: bool = true;
    const EFFECTS: bool = true;
    const DEFERRAL: bool = true;

    fn tables(&self) -> &Tables {
        &self.tables
    }
    async fn claim_received(
        &self,
        _: &LeaseRequest<'_>,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        Ok(self.received.lock().unwrap().take())
    }
    async fn claim_deferred(
        &self,
        _: &str,
        _: &str,
        _: Duration,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        Ok(self.due.lock().unwrap().take())
    }
    async fn renew_lease(&self, _: &InboxKey, _: &str, _: Duration) -> Result<bool, StoreError> {
        Ok(true)
    }
    async fn release_lease(&self, _: &InboxKey, _: &str) -> Result<(), StoreError> {
        Ok(())
    }
    async fn check_lease(
        &self,
        _: &mut (),
        _: &InboxKey,
        _: &str,
    ) -> Result<Option<u32>, StoreError> {
        let _held = self.held.lock().unwrap().take();
        std::future::pending().await
    }
    async fn begin(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn commit(&self, _: ()) -> Result<(), StoreError> {
        Ok(())
    }
    async fn rollback(&self, _: ()) -> Result<(), StoreError> {
        Ok(())
    }
    async fn claim(
        &self,
        _: &mut (),
        _: &InboxKey,
        _: &str,
        _: &Delivery,
    ) -> Result<Claim, StoreError> {
        Ok(Claim::New { attempts: 0 })
    }
    async fn claim_batch(
        &self,
        _: &mut (),
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<Claim>, StoreError> {
        Ok(vec![Claim::New { attempts: 0 }; requests.len()])
    }
    async fn expire_business_keys(
        &self,
        _: &mut (),
        _: &[&InboxKey],
        _: Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    async fn release_claims(&self, _: &mut (), _: &[&InboxKey]) -> Result<(), StoreError> {
        Ok(())
    }
    async fn mark_processed(&self, _: &mut (), _: &InboxKey, _: bool) -> Result<(), StoreError> {
        Ok(())
    }
    async fn record_failure(&self, _: &InboxKey, _: &str) -> Result<u32, StoreError> {
        Ok(1)
    }
    async fn dead_letter(&self, letter: &DeadLetter<'_>) -> Result<i64, StoreError> {
        let offset = letter.delivery.offset;
        assert!(self.panic_at != Some(offset), "the store fails at {offset}");
        if self.block_at == Some(offset) {
            let _held = self.held.lock().unwrap().take();
            std::future::pending::<()>().await;
        }
        Ok(offset)
    }
    async fn load_dead_letter(
        &self,
        _: &str,
        _: i64,
    ) -> Result<Option<StoredDeadLetter>, StoreError> {
        Ok(None)
    }
    async fn mark_replayed(&self, _: i64) -> Result<(), StoreError> {
        Ok(())
    }
    async fn delete_processed(&self, _: Duration, _: u32) -> Result<u64, StoreError> {
        Ok(0)
    }
    async fn count_stuck(&self, _: Duration) -> Result<i64, StoreError> {
        Ok(0)
    }
    async fn count_dead_letters(&self, _: &str) -> Result<i64, StoreError> {
        Ok(0)
    }
}

/// A link that owns its partition for ever and records the positions committed.
#[derive(Default)]
pub(crate) struct Recorder(pub(crate) Mutex<Vec<i64>>);

impl PartitionLink for Arc<Recorder> {
    fn owned(&self) -> bool {
        true
    }
    fn commit(&self, position: i64) -> bool {
        self.0.lock().unwrap().push(position);
        true
    }
    async fn commit_now(&self, position: i64) -> Result<(), String> {
        self.commit(position);
        Ok(())
    }
    async fn dead_lettered(&self, _: &Delivery, _: &str, _: i64) {}
    fn name(&self) -> String {
        "t/0".to_owned()
    }
}

/// The group's one handler; the test's messages never reach it.
static UNUSED: HandlerRegistration = HandlerRegistration::new(
    "Unused",
    "g",
    "unused",
    file!(),
    line!(),
    std::any::TypeId::of::<()>,
    never_called,
);

fn never_called<'a>(
    _: &'a [u8],
    _: &'a mut (dyn std::any::Any + Send),
    _: &'a crate::handler::MessageMeta,
) -> crate::handler::HandlerFuture<'a> {
    Box::pin(async { Ok(()) })
}

pub(crate) fn inbox(store: Faulty, ordering: Ordering) -> Arc<Inbox<Faulty>> {
    let config = InboxConfig::default()
        .ordering(ordering)
        .key_lanes(2)
        .max_wait(Duration::ZERO);
    let handlers = DispatchTable::from_registrations("g", [&UNUSED]).expect("a table");
    Arc::new(Inbox::with_handlers(store, handlers, config).expect("inbox"))
}

/// Messages `offsets` of partition `t/0`, each with its own key and no event id (so each is
/// dead-lettered through the store).
pub(crate) fn send(tx: &mpsc::Sender<Arc<Delivery>>, offsets: std::ops::Range<i64>) {
    for offset in offsets {
        let d = Delivery {
            topic: "t".into(),
            partition: 0,
            offset,
            key: Some(format!("k{offset}").into_bytes()),
            payload: Some(b"{}".to_vec()),
            headers: Vec::new(),
        };
        tx.try_send(Arc::new(d)).expect("room in the channel");
    }
}

/// A two-phase handler of group `g2`; the test's row never reaches it.
static SLOW: HandlerRegistration = HandlerRegistration::new(
    "Slow",
    "g2",
    "slow",
    file!(),
    line!(),
    std::any::TypeId::of::<()>,
    never_called,
)
.two_phase(false);

/// The inbox of group `g2` (one two-phase handler) on `store`, with `config`.
pub(crate) fn two_phase_inbox(store: Faulty, config: InboxConfig) -> Arc<Inbox<Faulty>> {
    let handlers = DispatchTable::from_registrations("g2", [&SLOW]).expect("a table");
    Arc::new(Inbox::with_handlers(store, handlers, config).expect("inbox"))
}

/// A received row of the `Slow` handler.
pub(crate) fn slow_row() -> ReceivedRow {
    ReceivedRow {
        key: InboxKey {
            group: "g2".into(),
            source: String::new(),
            event_id: "e-1".into(),
            business_key: None,
        },
        delivery: Delivery {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: Some(b"{}".to_vec()),
            headers: vec![
                ("ce_id".into(), Some(b"e-1".to_vec())),
                ("ce_type".into(), Some(b"Slow".to_vec())),
            ],
        },
    }
}
