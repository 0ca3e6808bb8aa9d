//! What every rule of the suite shares: the run, its errors and its helpers.

use std::time::Duration;

use uuid::Uuid;

use crate::message::Delivery;
use crate::store::{Claim, ClaimRequest, InboxKey, InboxStore, LeaseRequest, StoreError};

/// A broken rule: which, of which store, and what the store did.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the `{store}` store breaks the rule `{rule}`: {detail}")]
#[non_exhaustive]
pub struct ConformanceError {
    /// The [`InboxStore::NAME`] of the store run through the suite.
    pub store: &'static str,
    /// The rule, as the suite names it (e.g. `claim.duplicate`).
    pub rule: &'static str,
    /// What the store did instead, or the error it returned.
    pub detail: String,
}

/// What a run of the suite checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Conformance {
    /// The rules the store passed, in the order they ran.
    pub passed: Vec<&'static str>,
    /// The optional parts not checked, and why (the store does not keep them).
    pub skipped: Vec<(&'static str, &'static str)>,
}

pub(super) type Checked<T> = Result<T, ConformanceError>;

/// One run: the store and the names of this run's rows.
pub(super) struct Suite<'s, S> {
    pub(super) store: &'s S,
    /// The consumer group of this run (a rule that needs a group of its own adds a suffix).
    pub(super) group: String,
}

impl<'s, S: InboxStore> Suite<'s, S> {
    pub(super) fn new(store: &'s S) -> Self {
        Self {
            store,
            group: format!("inoutbox-conformance-{}", Uuid::new_v4().simple()),
        }
    }

    /// The error of a broken `rule`.
    pub(super) fn broke(&self, rule: &'static str, detail: impl Into<String>) -> ConformanceError {
        ConformanceError {
            store: S::NAME,
            rule,
            detail: detail.into(),
        }
    }

    /// Fails `rule` unless `holds`.
    pub(super) fn ensure(
        &self,
        rule: &'static str,
        holds: bool,
        detail: impl FnOnce() -> String,
    ) -> Checked<()> {
        match holds {
            true => Ok(()),
            false => Err(self.broke(rule, detail())),
        }
    }

    /// A store error met while checking `rule`.
    pub(super) fn failed(
        &self,
        rule: &'static str,
    ) -> impl Fn(StoreError) -> ConformanceError + '_ {
        move |e| self.broke(rule, format!("the store failed: {e}"))
    }

    /// A new key of `group` (this run's group and `suffix`).
    pub(super) fn key(&self, suffix: &str) -> InboxKey {
        InboxKey {
            group: format!("{}{suffix}", self.group),
            source: "inoutbox-conformance".to_owned(),
            event_id: Uuid::now_v7().to_string(),
            business_key: None,
        }
    }

    /// A message with every part set: a key, a payload, headers with and without a value.
    pub(super) fn delivery(&self, offset: i64) -> Delivery {
        Delivery {
            topic: format!("{}-topic", self.group).into(),
            partition: 1,
            offset,
            key: Some(b"conformance-key".to_vec()),
            payload: Some(format!("{{\"n\":{offset}}}").into_bytes()),
            headers: vec![
                ("ce_type".to_owned(), Some(b"ConformanceEvent".to_vec())),
                ("no-value".to_owned(), None),
            ],
        }
    }

    /// Claims `key` in a transaction of its own; commits it if `commit`, else rolls it back.
    pub(super) async fn claim_once(
        &self,
        rule: &'static str,
        key: &InboxKey,
        delivery: &Delivery,
        commit: bool,
    ) -> Checked<Claim> {
        let store = self.store;
        let mut tx = store.begin().await.map_err(self.failed(rule))?;
        let claim = store
            .claim(&mut tx, key, "ConformanceEvent", delivery)
            .await;
        let claim = match claim {
            Ok(c) => c,
            Err(e) => {
                let _ = store.rollback(tx).await;
                return Err(self.failed(rule)(e));
            }
        };
        if commit {
            store.commit(tx).await.map_err(self.failed(rule))?;
        } else {
            store.rollback(tx).await.map_err(self.failed(rule))?;
        }
        Ok(claim)
    }

    /// Stores `key` as a received row of a two-phase handler, committed; returns whether it was
    /// inserted.
    pub(super) async fn receive(
        &self,
        rule: &'static str,
        key: &InboxKey,
        delivery: &Delivery,
    ) -> Checked<bool> {
        let store = self.store;
        let request = ClaimRequest {
            key,
            event_type: SLOW,
            delivery,
        };
        let mut tx = store.begin().await.map_err(self.failed(rule))?;
        let inserted = match store.receive(&mut tx, &[request]).await {
            Ok(i) => i,
            Err(e) => {
                let _ = store.rollback(tx).await;
                return Err(self.failed(rule)(e));
            }
        };
        store.commit(tx).await.map_err(self.failed(rule))?;
        self.ensure(rule, inserted.len() == 1, || {
            format!("receive of one message answered {inserted:?}")
        })?;
        Ok(inserted[0])
    }

    /// A lease of `owner` for `lease` on the two-phase rows of `group`.
    pub(super) fn lease<'a>(
        group: &'a str,
        owner: &'a str,
        lease: Duration,
        ordered: &'a [&'a str],
    ) -> LeaseRequest<'a> {
        LeaseRequest {
            group,
            owner,
            lease,
            event_types: &[SLOW],
            ordered,
        }
    }
}

/// The event type of this suite's two-phase rows.
pub(super) const SLOW: &str = "ConformanceSlow";

/// Long enough for a store's clock to pass a timestamp written just before (SQLite keeps
/// milliseconds).
pub(super) async fn tick() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}
