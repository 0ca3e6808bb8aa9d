//! A store that watches the inbox at work: [`Observed`] wraps any [`InboxStore`], records when
//! each claim of an inbox row started and ended and when each transaction was committed, and can
//! hold the claims of one event until several have begun, so that a race test really races.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inoutbox::inbox::Delivery;
use inoutbox::store::{
    Claim, ClaimRequest, DeadLetter, InboxKey, InboxStore, StoreError, StoredDeadLetter, Tables,
};
use tokio::sync::watch;

/// One call of `claim`: the event, when it started and ended, and what it found.
#[derive(Clone, Debug)]
pub struct ClaimSpan {
    pub event_id: String,
    pub started: Instant,
    pub ended: Instant,
    /// `Ok(claim)`, or the error's text.
    pub result: Result<Claim, String>,
}

struct Shared {
    claims: Mutex<Vec<ClaimSpan>>,
    commits: Mutex<Vec<Instant>>,
    /// Claims of one event wait until this many have begun (1: no waiting).
    meet: usize,
    arrivals: Mutex<HashMap<String, watch::Sender<usize>>>,
}

/// An [`InboxStore`] that records claims and commits (see the module docs). Clones share
/// their records, so several consumers can be observed together.
pub struct Observed<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Clone> Clone for Observed<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

/// How long a claim waits for the others of its event before going on alone.
const MEET_TIMEOUT: Duration = Duration::from_secs(10);

impl<S> Observed<S> {
    /// Wraps `inner`; the claims of one event id wait (at most 10 s) until `meet` of them have
    /// begun, then all go on at once.
    pub fn new(inner: S, meet: usize) -> Self {
        Self {
            inner,
            shared: Arc::new(Shared {
                claims: Mutex::new(Vec::new()),
                commits: Mutex::new(Vec::new()),
                meet,
                arrivals: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Every claim so far, in the order they ended.
    pub fn claims(&self) -> Vec<ClaimSpan> {
        self.shared.claims.lock().unwrap().clone()
    }

    /// When each commit was asked for, in order.
    pub fn commits(&self) -> Vec<Instant> {
        self.shared.commits.lock().unwrap().clone()
    }

    async fn meet(&self, event_id: &str) {
        let meet = self.shared.meet;
        if meet <= 1 {
            return;
        }
        let mut arrived = {
            let mut arrivals = self.shared.arrivals.lock().unwrap();
            let count = arrivals
                .entry(event_id.to_owned())
                .or_insert_with(|| watch::channel(0).0);
            count.send_modify(|n| *n += 1);
            count.subscribe()
        };
        let _ = tokio::time::timeout(MEET_TIMEOUT, arrived.wait_for(|n| *n >= meet)).await;
    }
}

impl<S: InboxStore> InboxStore for Observed<S> {
    type Tx = S::Tx;
    const NAME: &'static str = S::NAME;

    fn tables(&self) -> &Tables {
        self.inner.tables()
    }

    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send {
        self.inner.begin()
    }

    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.shared.commits.lock().unwrap().push(Instant::now());
        self.inner.commit(tx)
    }

    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.rollback(tx)
    }

    async fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a Delivery,
    ) -> Result<Claim, StoreError> {
        self.meet(&key.event_id).await;
        let started = Instant::now();
        let result = self.inner.claim(tx, key, event_type, delivery).await;
        let span = ClaimSpan {
            event_id: key.event_id.clone(),
            started,
            ended: Instant::now(),
            result: result.as_ref().map(|c| *c).map_err(|e| e.to_string()),
        };
        self.shared.claims.lock().unwrap().push(span);
        result
    }

    async fn claim_batch<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        requests: &'a [ClaimRequest<'a>],
    ) -> Result<Vec<Claim>, StoreError> {
        for r in requests {
            self.meet(&r.key.event_id).await;
        }
        let started = Instant::now();
        let result = self.inner.claim_batch(tx, requests).await;
        let ended = Instant::now();
        let mut claims = self.shared.claims.lock().unwrap();
        for (i, r) in requests.iter().enumerate() {
            claims.push(ClaimSpan {
                event_id: r.key.event_id.clone(),
                started,
                ended,
                result: match &result {
                    Ok(all) => Ok(all[i]),
                    Err(e) => Err(e.to_string()),
                },
            });
        }
        drop(claims);
        result
    }

    fn expire_business_keys<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        keys: &'a [&'a InboxKey],
        older_than: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.inner.expire_business_keys(tx, keys, older_than)
    }

    fn release_claims<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        keys: &'a [&'a InboxKey],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.inner.release_claims(tx, keys)
    }

    fn mark_processed<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        had_failures: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.inner.mark_processed(tx, key, had_failures)
    }

    fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> impl Future<Output = Result<u32, StoreError>> + Send + 'a {
        self.inner.record_failure(key, error)
    }

    fn dead_letter<'a>(
        &'a self,
        letter: &'a DeadLetter<'a>,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a {
        self.inner.dead_letter(letter)
    }

    fn load_dead_letter<'a>(
        &'a self,
        group: &'a str,
        id: i64,
    ) -> impl Future<Output = Result<Option<StoredDeadLetter>, StoreError>> + Send + 'a {
        self.inner.load_dead_letter(group, id)
    }

    fn mark_replayed(&self, id: i64) -> impl Future<Output = Result<(), StoreError>> + Send + '_ {
        self.inner.mark_replayed(id)
    }

    fn delete_processed(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + '_ {
        self.inner.delete_processed(older_than, limit)
    }

    fn count_stuck(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + '_ {
        self.inner.count_stuck(older_than)
    }

    fn count_dead_letters<'a>(
        &'a self,
        group: &'a str,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a {
        self.inner.count_dead_letters(group)
    }
}
