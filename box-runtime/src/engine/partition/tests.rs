//! A partition run over a store that panics or blocks outside the handler's guard.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::run;
use crate::engine::config::{InboxConfig, Ordering};
use crate::engine::Inbox;
use crate::handler::{DispatchTable, HandlerRegistration};
use crate::message::Delivery;
use crate::shutdown::CancellationToken;
use crate::store::{
    Claim, ClaimRequest, DeadLetter, InboxKey, InboxStore, StoreError, StoredDeadLetter, Tables,
};
use crate::transport::PartitionLink;

/// A store whose dead letters are all a test needs (the messages have no event id): it panics
/// on the message at `panic_at`, and never finishes the one at `block_at`, holding `held`'s
/// sender until its future is dropped.
#[derive(Default)]
struct Faulty {
    tables: Tables,
    panic_at: Option<i64>,
    block_at: Option<i64>,
    held: Arc<Mutex<Option<oneshot::Sender<()>>>>,
}

impl InboxStore for Faulty {
    type Tx = ();
    const NAME: &'static str = "faulty";

    fn tables(&self) -> &Tables {
        &self.tables
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
struct Recorder(Mutex<Vec<i64>>);

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

fn inbox(store: Faulty, ordering: Ordering) -> Arc<Inbox<Faulty>> {
    let mut config = InboxConfig::default();
    config.ordering = ordering;
    config.key_lanes = 2;
    config.max_wait = Duration::ZERO;
    let handlers = DispatchTable::from_registrations("g", [&UNUSED]).expect("a table");
    Arc::new(Inbox::with_handlers(store, handlers, config).expect("inbox"))
}

/// Messages `offsets` of partition `t/0`, each with its own key and no event id (so each is
/// dead-lettered through the store).
fn send(tx: &mpsc::Sender<Arc<Delivery>>, offsets: std::ops::Range<i64>) {
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

#[tokio::test]
async fn a_panic_outside_the_handler_halts_the_partition_and_never_commits_past_it() {
    for ordering in [Ordering::Partition, Ordering::Key] {
        let store = Faulty {
            panic_at: Some(2),
            ..Faulty::default()
        };
        let inbox = inbox(store, ordering);
        let health = inbox.health();
        health.set_live(true);
        let (tx, rx) = mpsc::channel(64);
        let link = Arc::new(Recorder::default());
        let stop = CancellationToken::new();
        send(&tx, 0..6);
        let handle = tokio::spawn(run(inbox, rx, link.clone(), stop.clone(), None));
        // Until the run halts (it says so through health) or ends.
        while health.live() && !handle.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !handle.is_finished(),
            "{ordering:?}: the run halts while the partition is owned; it does not end (a \
             transport would start a fresh run whose position passes offset 2)"
        );
        assert!(!health.live(), "{ordering:?}: the consumer is no longer live");
        send(&tx, 6..8);
        stop.cancel();
        let ended = handle.await;
        assert!(
            ended.is_err_and(|e| e.is_panic()),
            "{ordering:?}: the run ends by the panic, for the transport to report"
        );
        let committed = link.0.lock().unwrap().clone();
        assert!(
            committed.iter().all(|&p| p <= 2),
            "{ordering:?}: nothing past offset 2 is committed: {committed:?}"
        );
    }
}

#[tokio::test]
async fn aborting_a_key_ordered_run_aborts_its_lanes() {
    let (held, dropped) = oneshot::channel::<()>();
    let held = Arc::new(Mutex::new(Some(held)));
    let store = Faulty {
        block_at: Some(1),
        held: held.clone(),
        ..Faulty::default()
    };
    let (tx, rx) = mpsc::channel(64);
    send(&tx, 0..4);
    let link = Arc::new(Recorder::default());
    let stop = CancellationToken::new();
    let handle = tokio::spawn(run(inbox(store, Ordering::Key), rx, link, stop, None));
    // Until a lane is stuck in the store on offset 1 (it took the sender).
    while held.lock().unwrap().is_some() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // What a transport does at the end of the grace period.
    handle.abort();
    let _ = handle.await;
    // The lane's work is dropped with the run (the sender with it), not left running on.
    let after = tokio::time::timeout(Duration::from_secs(30), dropped).await;
    assert!(
        matches!(after, Ok(Err(_))),
        "the lane still runs after its partition's run was aborted"
    );
}
