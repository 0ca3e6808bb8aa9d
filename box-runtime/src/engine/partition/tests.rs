//! A partition run over a store that panics or blocks outside the handler's guard.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::run;
use crate::engine::config::Ordering;
use crate::engine::fake::{inbox, send, Faulty, Recorder};
use crate::shutdown::CancellationToken;

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
        assert!(
            !health.live(),
            "{ordering:?}: the consumer is no longer live"
        );
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
