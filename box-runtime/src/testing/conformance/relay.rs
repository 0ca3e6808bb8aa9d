//! The rules of the outbox writer and the relay store: rows commit with their transaction,
//! a slot has one session at a time, rows are read per key in `seq` order, published rows are
//! gone from the reads and a parked row holds the later rows of its key.

use std::time::Duration;

use uuid::Uuid;

use super::suite::{Checked, Conformance, ConformanceError, Suite};
use crate::outbox::{NewRow, OutboxTx};
use crate::relay::{Failure, PendingRow, RelaySession, RelayStore};
use crate::store::InboxStore;

/// Runs the outbox and relay rules: rows enqueued through `store`'s transactions
/// ([`OutboxTx`]) and read, claimed and marked through `relay` (a [`RelayStore`] on the same
/// database, with no relay running on it). Returns the rules passed, or the first one broken.
pub async fn relay_conformance<S, R>(store: &S, relay: &R) -> Result<Conformance, ConformanceError>
where
    S: InboxStore,
    S::Tx: OutboxTx,
    R: RelayStore,
{
    let s = Suite::new(store);
    let mut done = Conformance::default();
    let topic = format!("{}-topic", s.group);
    let before = relay.backlog().await.map_err(s.failed(WRITE))?.unpublished;
    let held = enqueue(&s, &topic, "held", 3, true).await?;
    enqueue(&s, &topic, "rolled-back", 1, false).await?;
    let after = relay.backlog().await.map_err(s.failed(WRITE))?.unpublished;
    s.ensure(WRITE, after - before == 3, || {
        format!(
            "3 rows committed and 1 rolled back changed the backlog by {}",
            after - before
        )
    })?;
    done.passed.push(WRITE);
    let all: Vec<u32> = (0..relay.slots()).collect();
    let mut a = relay.open().await.map_err(s.failed(SLOTS))?;
    let result = sessions(&s, relay, &mut a, &all, &topic, &held, &mut done).await;
    a.close().await;
    result?;
    let mut c = relay.open().await.map_err(s.failed(CLOSED))?;
    let claimed = c.claim(&all, all.len()).await;
    c.close().await;
    let claimed = claimed.map_err(s.failed(CLOSED))?;
    s.ensure(CLOSED, claimed.len() == all.len(), || {
        format!(
            "after the holder closed, a session claimed {claimed:?} of {} slots",
            all.len()
        )
    })?;
    done.passed.push(CLOSED);
    Ok(done)
}

const WRITE: &str = "outbox.rows_commit_with_their_transaction";
const SLOTS: &str = "relay.one_session_per_slot";
const READ: &str = "relay.reads_a_key_in_seq_order";
const PUBLISHED: &str = "relay.published_rows_are_not_read_again";
const PARKED: &str = "relay.a_parked_row_holds_its_key";
const CLOSED: &str = "relay.a_closed_session_frees_its_slots";

/// Enqueues `n` rows of key `key` on `topic` in one transaction; returns their ids.
async fn enqueue<S: InboxStore>(
    s: &Suite<'_, S>,
    topic: &str,
    key: &str,
    n: i64,
    commit: bool,
) -> Checked<Vec<Uuid>>
where
    S::Tx: OutboxTx,
{
    let rows: Vec<NewRow> = (0..n)
        .map(|i| NewRow {
            id: Uuid::now_v7(),
            event_type: "ConformanceEvent".to_owned(),
            topic: topic.to_owned(),
            key: Some(key.to_owned()),
            aggregate_type: None,
            aggregate_id: None,
            payload: format!("{{\"key\":\"{key}\", \"n\":{i}}}"),
            headers: serde_json::Map::new(),
            due_at: None,
        })
        .collect();
    let mut tx = s.store.begin().await.map_err(s.failed(WRITE))?;
    let ids = match tx.insert_rows(rows).await {
        Ok(ids) => ids,
        Err(e) => {
            let _ = s.store.rollback(tx).await;
            return Err(s.broke(WRITE, format!("the insert failed: {e}")));
        }
    };
    match commit {
        true => s.store.commit(tx).await.map_err(s.failed(WRITE))?,
        false => s.store.rollback(tx).await.map_err(s.failed(WRITE))?,
    }
    Ok(ids)
}

/// This run's rows among those `session` reads from `slots`.
async fn read_ours<S: InboxStore, T: RelaySession>(
    s: &Suite<'_, S>,
    rule: &'static str,
    session: &mut T,
    slots: &[u32],
    topic: &str,
) -> Checked<Vec<PendingRow>> {
    let rows = session
        .read(slots, 0, 10_000)
        .await
        .map_err(s.failed(rule))?;
    Ok(rows.into_iter().filter(|r| r.topic == topic).collect())
}

#[allow(clippy::too_many_arguments)]
async fn sessions<S: InboxStore, R: RelayStore>(
    s: &Suite<'_, S>,
    relay: &R,
    a: &mut R::Session,
    all: &[u32],
    topic: &str,
    held: &[Uuid],
    done: &mut Conformance,
) -> Checked<()>
where
    S::Tx: OutboxTx,
{
    let claimed = a.claim(all, all.len()).await.map_err(s.failed(SLOTS))?;
    s.ensure(SLOTS, claimed.len() == all.len(), || {
        format!("a lone session claimed {claimed:?} of {} slots", all.len())
    })?;
    let mut b = relay.open().await.map_err(s.failed(SLOTS))?;
    let stolen = b.claim(all, all.len()).await;
    b.close().await;
    let stolen = stolen.map_err(s.failed(SLOTS))?;
    s.ensure(SLOTS, stolen.is_empty(), || {
        format!("a second session claimed slots {stolen:?} another session holds")
    })?;
    a.verify(&claimed).await.map_err(s.failed(SLOTS))?;
    done.passed.push(SLOTS);

    let rows = read_ours(s, READ, a, &claimed, topic).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let ordered = rows
        .windows(2)
        .all(|w| w[0].seq < w[1].seq && w[0].slot == w[1].slot);
    let exact = rows
        .first()
        .is_some_and(|r| r.payload == "{\"key\":\"held\", \"n\":0}");
    s.ensure(READ, ids == held && ordered && exact, || {
        format!("enqueued {held:?} on one key, read {rows:?}")
    })?;
    done.passed.push(READ);
    published_and_parked(s, a, &claimed, topic, &rows, done).await
}

async fn published_and_parked<S: InboxStore, T: RelaySession>(
    s: &Suite<'_, S>,
    a: &mut T,
    claimed: &[u32],
    topic: &str,
    held: &[PendingRow],
    done: &mut Conformance,
) -> Checked<()>
where
    S::Tx: OutboxTx,
{
    let sent = enqueue(s, topic, "sent", 2, true).await?;
    a.mark_published(&sent).await.map_err(s.failed(PUBLISHED))?;
    let rows = read_ours(s, PUBLISHED, a, claimed, topic).await?;
    s.ensure(
        PUBLISHED,
        rows.iter().all(|r| !sent.contains(&r.id)),
        || format!("rows marked published were read again: {rows:?}"),
    )?;
    done.passed.push(PUBLISHED);

    let failure = Failure {
        row: &held[0],
        error: "conformance: the broker refused it",
        park: true,
        backoff: Duration::ZERO,
    };
    a.record_failures(&[failure])
        .await
        .map_err(s.failed(PARKED))?;
    let rows = read_ours(s, PARKED, a, claimed, topic).await?;
    s.ensure(PARKED, rows.is_empty(), || {
        format!("with the first row of its key parked, the relay read {rows:?}")
    })?;
    done.passed.push(PARKED);
    Ok(())
}
