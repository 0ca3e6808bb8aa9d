//! The public conformance suite (`inoutbox::testing::conformance` and `relay_conformance`): the
//! built-in stores pass it whole (`postgres::`, `sqlite::` and `mysql::`: no rule skipped), and
//! so does a store written here, outside the crate, with the facade's public API only
//! (`Outside`: it wraps the SQLite store and its relay store). The same store with one rule
//! broken on purpose fails the suite with that rule's name: each check can fail.

use std::time::Duration;

use inoutbox::relay::{
    Backlog, Failure, IntoRelayStore, Members, PendingRow, RelaySession, RelayStore,
    SqliteRelayStore,
};
use inoutbox::store::{
    Claim, ClaimRequest, DeadLetter, EffectCounts, InboxKey, InboxStore, LeaseRequest, ReceivedRow,
    StoreError, StoredDeadLetter, StoredEffect, Tables,
};
use inoutbox::testing::{conformance, relay_conformance, ConformanceError};
use inoutbox::SqliteStore;
use uuid::Uuid;

use crate::support::kit::{Kit, SqliteKit};

crate::contract_tests!(the_store_passes_the_conformance_suite);

async fn the_store_passes_the_conformance_suite<K: Kit>() {
    let kit = K::new("conformance").await;
    let store = kit.store();
    let passed = conformance(&store).await.unwrap_or_else(|e| panic!("{e}"));
    // Every built-in store keeps every optional mode: nothing is skipped.
    assert!(passed.skipped.is_empty(), "{:?}", passed.skipped);
    assert!(passed.passed.len() >= 20, "{:?}", passed.passed);
    let relay = relay_conformance(&store, &kit.relay_store())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(relay.passed.len(), 6, "{:?}", relay.passed);
}

/// What the outside store breaks on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Break {
    Nothing,
    /// Its claim answers New where the row exists.
    Duplicates,
    /// Its claim forgets the failed runs recorded.
    Attempts,
    /// Its lease renewal says yes to anyone.
    Renewal,
    /// Its effects claim ignores the group.
    EffectGroups,
    /// Its relay session marks nothing published.
    Publishing,
    /// Its batch claim answers New for every row.
    Batch,
    /// Its failure count never grows.
    Failures,
    /// Its processed mark keeps the failures recorded.
    ClearFailures,
    /// Its replay mark does nothing.
    Replay,
    /// Its retention deletes nothing.
    Retention,
    /// Its claim takes a processed business key.
    BusinessKeys,
    /// Its business keys never expire.
    Expiry,
    /// Its deferred rows are never claimed.
    Deferral,
    /// Its processed mark under a lease succeeds for anyone.
    Finish,
    /// Its two-phase receive answers "inserted" for a duplicate.
    Receive,
    /// Its lease release does nothing.
    Release,
    /// Its drop of a received row does nothing.
    Drop,
    /// Its claim of received rows ignores per-key order.
    Ordered,
    /// Its relay session records no failure (a parked row parks nothing).
    Parking,
    /// Its relay session claims slots another session holds.
    Slots,
    /// Its first claim of a message reports a failed run.
    NewClaim,
    /// Its dead letters cannot be loaded.
    DeadLetters,
    /// Its settlement of a failed effect marks it done.
    Settle,
    /// Its relay session reads a key's rows newest first.
    ReadOrder,
    /// Its relay session's close keeps the slots.
    Close,
}

/// A store written outside the crate: the SQLite store and its relay store, wrapped.
#[derive(Clone)]
struct Outside {
    inner: SqliteStore,
    broken: Break,
}

type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;

impl InboxStore for Outside {
    type Tx = Tx;
    const NAME: &'static str = "outside";
    const TWO_PHASE: bool = true;
    const EFFECTS: bool = true;
    const DEFERRAL: bool = true;

    fn tables(&self) -> &Tables {
        self.inner.tables()
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        self.inner.begin().await
    }

    async fn commit(&self, tx: Tx) -> Result<(), StoreError> {
        self.inner.commit(tx).await
    }

    async fn rollback(&self, tx: Tx) -> Result<(), StoreError> {
        self.inner.rollback(tx).await
    }

    async fn claim<'a>(
        &'a self,
        tx: &'a mut Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a inoutbox::inbox::Delivery,
    ) -> Result<Claim, StoreError> {
        let claim = self.inner.claim(tx, key, event_type, delivery).await?;
        Ok(match (self.broken, claim) {
            (Break::Duplicates, Claim::Duplicate) => Claim::New { attempts: 0 },
            (Break::Attempts, Claim::New { .. }) => Claim::New { attempts: 0 },
            (Break::BusinessKeys, Claim::DuplicateBusinessKey) => Claim::New { attempts: 0 },
            (Break::NewClaim, Claim::New { attempts }) => Claim::New {
                attempts: attempts + 1,
            },
            (_, claim) => claim,
        })
    }

    async fn claim_batch<'a>(
        &'a self,
        tx: &'a mut Tx,
        requests: &'a [ClaimRequest<'a>],
    ) -> Result<Vec<Claim>, StoreError> {
        let claims = self.inner.claim_batch(tx, requests).await?;
        Ok(match self.broken {
            Break::Batch => vec![Claim::New { attempts: 0 }; claims.len()],
            _ => claims,
        })
    }

    async fn expire_business_keys<'a>(
        &'a self,
        tx: &'a mut Tx,
        keys: &'a [&'a InboxKey],
        older_than: Duration,
    ) -> Result<(), StoreError> {
        match self.broken {
            Break::Expiry => Ok(()),
            _ => self.inner.expire_business_keys(tx, keys, older_than).await,
        }
    }

    async fn release_claims<'a>(
        &'a self,
        tx: &'a mut Tx,
        keys: &'a [&'a InboxKey],
    ) -> Result<(), StoreError> {
        self.inner.release_claims(tx, keys).await
    }

    async fn mark_processed<'a>(
        &'a self,
        tx: &'a mut Tx,
        key: &'a InboxKey,
        had_failures: bool,
    ) -> Result<(), StoreError> {
        let had_failures = had_failures && self.broken != Break::ClearFailures;
        self.inner.mark_processed(tx, key, had_failures).await
    }

    async fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> Result<u32, StoreError> {
        let n = self.inner.record_failure(key, error).await?;
        Ok(if self.broken == Break::Failures { 1 } else { n })
    }

    async fn dead_letter<'a>(&'a self, letter: &'a DeadLetter<'a>) -> Result<i64, StoreError> {
        self.inner.dead_letter(letter).await
    }

    async fn load_dead_letter<'a>(
        &'a self,
        group: &'a str,
        id: i64,
    ) -> Result<Option<StoredDeadLetter>, StoreError> {
        match self.broken {
            Break::DeadLetters => Ok(None),
            _ => self.inner.load_dead_letter(group, id).await,
        }
    }

    async fn mark_replayed(&self, id: i64) -> Result<(), StoreError> {
        match self.broken {
            Break::Replay => Ok(()),
            _ => self.inner.mark_replayed(id).await,
        }
    }

    async fn delete_processed(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        match self.broken {
            Break::Retention => Ok(0),
            _ => self.inner.delete_processed(older_than, limit).await,
        }
    }

    async fn count_stuck(&self, older_than: Duration) -> Result<i64, StoreError> {
        self.inner.count_stuck(older_than).await
    }

    async fn count_dead_letters<'a>(&'a self, group: &'a str) -> Result<i64, StoreError> {
        self.inner.count_dead_letters(group).await
    }

    async fn receive<'a>(
        &'a self,
        tx: &'a mut Tx,
        requests: &'a [ClaimRequest<'a>],
    ) -> Result<Vec<bool>, StoreError> {
        let inserted = self.inner.receive(tx, requests).await?;
        Ok(match self.broken {
            Break::Receive => vec![true; inserted.len()],
            _ => inserted,
        })
    }

    async fn claim_received<'a>(
        &'a self,
        request: &'a LeaseRequest<'a>,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        let unordered = LeaseRequest {
            ordered: &[],
            ..*request
        };
        match self.broken {
            Break::Ordered => self.inner.claim_received(&unordered).await,
            _ => self.inner.claim_received(request).await,
        }
    }

    async fn renew_lease<'a>(
        &'a self,
        key: &'a InboxKey,
        owner: &'a str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let renewed = self.inner.renew_lease(key, owner, lease).await?;
        Ok(renewed || self.broken == Break::Renewal)
    }

    async fn release_lease<'a>(
        &'a self,
        key: &'a InboxKey,
        owner: &'a str,
    ) -> Result<(), StoreError> {
        match self.broken {
            Break::Release => Ok(()),
            _ => self.inner.release_lease(key, owner).await,
        }
    }

    async fn drop_received<'a>(
        &'a self,
        key: &'a InboxKey,
        owner: &'a str,
    ) -> Result<(), StoreError> {
        match self.broken {
            Break::Drop => Ok(()),
            _ => self.inner.drop_received(key, owner).await,
        }
    }

    async fn check_lease<'a>(
        &'a self,
        tx: &'a mut Tx,
        key: &'a InboxKey,
        owner: &'a str,
    ) -> Result<Option<u32>, StoreError> {
        self.inner.check_lease(tx, key, owner).await
    }

    async fn finish_leased<'a>(
        &'a self,
        tx: &'a mut Tx,
        key: &'a InboxKey,
        owner: &'a str,
        had_failures: bool,
    ) -> Result<bool, StoreError> {
        let finished = self
            .inner
            .finish_leased(tx, key, owner, had_failures)
            .await?;
        Ok(finished || self.broken == Break::Finish)
    }

    async fn claim_effects<'a>(
        &'a self,
        group: &'a str,
        owner: &'a str,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<StoredEffect>, StoreError> {
        if self.broken == Break::EffectGroups && group == "another-group" {
            // Every group's effects: as if the group were not part of the claim.
            let mut all = Vec::new();
            for g in self.effect_groups().await? {
                all.extend(self.inner.claim_effects(&g, owner, lease, limit).await?);
            }
            return Ok(all);
        }
        self.inner.claim_effects(group, owner, lease, limit).await
    }

    async fn settle_effect<'a>(
        &'a self,
        id: i64,
        owner: &'a str,
        error: Option<&'a str>,
        retry_in: Duration,
    ) -> Result<(), StoreError> {
        let error = error.filter(|_| self.broken != Break::Settle);
        self.inner.settle_effect(id, owner, error, retry_in).await
    }

    async fn count_effects<'a>(&'a self, group: &'a str) -> Result<EffectCounts, StoreError> {
        self.inner.count_effects(group).await
    }

    async fn delete_done_effects(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.inner.delete_done_effects(older_than, limit).await
    }

    async fn defer<'a>(
        &'a self,
        tx: &'a mut Tx,
        key: &'a InboxKey,
        delivery: &'a inoutbox::inbox::Delivery,
        after: Duration,
    ) -> Result<u32, StoreError> {
        self.inner.defer(tx, key, delivery, after).await
    }

    async fn claim_deferred<'a>(
        &'a self,
        group: &'a str,
        owner: &'a str,
        lease: Duration,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        match self.broken {
            Break::Deferral => Ok(None),
            _ => self.inner.claim_deferred(group, owner, lease).await,
        }
    }

    async fn count_deferred<'a>(&'a self, group: &'a str) -> Result<i64, StoreError> {
        self.inner.count_deferred(group).await
    }
}

impl Outside {
    async fn effect_groups(&self) -> Result<Vec<String>, StoreError> {
        let sql = format!(
            "SELECT DISTINCT consumer_group FROM {}",
            self.tables().effects
        );
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(self.inner.pool())
            .await?)
    }
}

/// The outside relay store: SQLite's, wrapped.
struct OutsideRelay {
    inner: SqliteRelayStore,
    broken: Break,
}

struct OutsideSession {
    inner: <SqliteRelayStore as RelayStore>::Session,
    broken: Break,
}

impl IntoRelayStore for OutsideRelay {
    type Store = Self;
    fn into_relay_store(self) -> Self {
        self
    }
}

impl RelayStore for OutsideRelay {
    type Session = OutsideSession;

    fn slots(&self) -> u32 {
        self.inner.slots()
    }

    async fn open(&self) -> Result<OutsideSession, StoreError> {
        Ok(OutsideSession {
            inner: self.inner.open().await?,
            broken: self.broken,
        })
    }

    async fn listen(&self) -> Result<(), StoreError> {
        self.inner.listen().await
    }

    async fn wait(&self, timeout: Duration) {
        self.inner.wait(timeout).await
    }

    async fn purge<'a>(
        &'a self,
        retention: &'a inoutbox::outbox::Retention,
    ) -> Result<u64, StoreError> {
        self.inner.purge(retention).await
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.inner.backlog().await
    }
}

impl RelaySession for OutsideSession {
    async fn members(&mut self) -> Result<Members, StoreError> {
        self.inner.members().await
    }

    async fn claim<'a>(
        &'a mut self,
        candidates: &'a [u32],
        want: usize,
    ) -> Result<Vec<u32>, StoreError> {
        match self.broken {
            Break::Slots => Ok(candidates.iter().copied().take(want).collect()),
            _ => self.inner.claim(candidates, want).await,
        }
    }

    async fn release<'a>(&'a mut self, slots: &'a [u32]) -> Result<(), StoreError> {
        self.inner.release(slots).await
    }

    async fn verify<'a>(&'a mut self, held: &'a [u32]) -> Result<(), StoreError> {
        self.inner.verify(held).await
    }

    fn renew_every(&self) -> Option<Duration> {
        self.inner.renew_every()
    }

    async fn read<'a>(
        &'a mut self,
        slots: &'a [u32],
        start: u32,
        limit: usize,
    ) -> Result<Vec<PendingRow>, StoreError> {
        let mut rows = self.inner.read(slots, start, limit).await?;
        if self.broken == Break::ReadOrder {
            rows.reverse();
        }
        Ok(rows)
    }

    async fn next_due<'a>(&'a mut self, slots: &'a [u32]) -> Result<Option<Duration>, StoreError> {
        self.inner.next_due(slots).await
    }

    async fn mark_published<'a>(&'a mut self, ids: &'a [Uuid]) -> Result<(), StoreError> {
        match self.broken {
            Break::Publishing => Ok(()),
            _ => self.inner.mark_published(ids).await,
        }
    }

    async fn record_failures<'a>(
        &'a mut self,
        failures: &'a [Failure<'a>],
    ) -> Result<(), StoreError> {
        match self.broken {
            Break::Parking => Ok(()),
            _ => self.inner.record_failures(failures).await,
        }
    }

    async fn close(self) {
        match self.broken {
            // Gone without releasing: its hold on the slots stays until it expires.
            Break::Close => std::mem::forget(self.inner),
            _ => self.inner.close().await,
        }
    }
}

/// The outside store (broken as `broken`) on a new SQLite database, with its relay store.
async fn outside(broken: Break) -> (SqliteKit, Outside, OutsideRelay) {
    let kit = SqliteKit::new("conformance_outside").await;
    let store = Outside {
        inner: kit.store(),
        broken,
    };
    let relay = OutsideRelay {
        inner: kit.relay_store(),
        broken,
    };
    (kit, store, relay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_outside_the_crate_passes_the_conformance_suite() {
    let (_kit, store, relay) = outside(Break::Nothing).await;
    let passed = conformance(&store).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(passed.skipped.is_empty(), "{:?}", passed.skipped);
    let relayed = relay_conformance(&store, &relay.into_relay_store())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(relayed.passed.len(), 6, "{:?}", relayed.passed);
}

/// The rule the suite names for a store broken as `broken`.
async fn broken_rule(broken: Break) -> ConformanceError {
    let (_kit, store, relay) = outside(broken).await;
    let inbox = conformance(&store).await;
    let relayed = relay_conformance(&store, &relay).await;
    match (inbox, relayed) {
        (Err(e), _) | (Ok(_), Err(e)) => e,
        (Ok(_), Ok(_)) => panic!("a store that breaks {broken:?} passed the conformance suite"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_broken_rule_fails_the_conformance_suite_with_its_name() {
    for (broken, rule) in [
        (Break::Duplicates, "claim.duplicate"),
        (Break::Attempts, "claim.reports_attempts"),
        (Break::Renewal, "renew_lease.holder_only"),
        (Break::EffectGroups, "effects.claimed_once_by_their_group"),
        (Break::Publishing, "relay.published_rows_are_not_read_again"),
        (Break::Batch, "claim_batch.one_duplicate"),
        (Break::Failures, "record_failure.survives_rollback"),
        (Break::ClearFailures, "mark_processed.clears_failures"),
        (Break::Replay, "mark_replayed.marks_and_uncounts"),
        (
            Break::Retention,
            "delete_processed.batches_processed_rows_only",
        ),
        (Break::BusinessKeys, "claim.duplicate_business_key"),
        (Break::Expiry, "expire_business_keys.frees_old_keys"),
        (Break::Deferral, "defer.claimed_when_due_under_a_lease"),
        // The leased run of a deferred row is checked first: it breaks there.
        (Break::Finish, "defer.claimed_when_due_under_a_lease"),
        (Break::Receive, "receive.once"),
        (Break::Release, "release_lease.frees_the_row"),
        (Break::Drop, "drop_received.deletes_the_row"),
        (Break::Ordered, "claim_received.ordered_per_key"),
        (Break::Parking, "relay.a_parked_row_holds_its_key"),
        (Break::Slots, "relay.one_session_per_slot"),
        (Break::NewClaim, "claim.new"),
        (Break::DeadLetters, "dead_letter.stored_and_loaded"),
        (Break::Settle, "effects.settled_by_the_lease_owner"),
        (Break::ReadOrder, "relay.reads_a_key_in_seq_order"),
        (Break::Close, "relay.a_closed_session_frees_its_slots"),
    ] {
        let error = broken_rule(broken).await;
        assert_eq!(error.rule, rule, "{broken:?}: {error}");
        assert_eq!(error.store, "outside");
        assert!(
            error.to_string().contains(rule) && error.to_string().contains("`outside` store"),
            "{error}"
        );
    }
}
