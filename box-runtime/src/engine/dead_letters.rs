//! Dead letters and what an operator does with them: a failure recorded, a message
//! dead-lettered (when the database rejects even its stripped letter, held and tried again,
//! never acknowledged), a dead letter replayed; and the purge of processed rows.

use std::time::Duration;

use std::time::Instant;

use tracing::Instrument;

use super::prepare::Prepared;
use super::process::{wait_outage, REJECTIONS_BEFORE_DEAD_LETTER};
use super::Inbox;
use crate::message::{Delivery, Outcome};
use crate::shutdown::CancellationToken;
use crate::store::{self, DeadLetter, InboxKey, InboxStore, StoreError};

/// Why a dead letter could not be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// No dead letter with that id in the group.
    #[error("no dead letter {id} in group `{group}`")]
    NotFound {
        /// The group.
        group: String,
        /// The id.
        id: i64,
    },
    /// It was replayed successfully before.
    #[error("dead letter {id} of group `{group}` was already replayed")]
    AlreadyReplayed {
        /// The group.
        group: String,
        /// The id.
        id: i64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl<S: InboxStore> Inbox<S> {
    /// Deletes inbox rows processed more than `older_than` ago (default retention: 7 days,
    /// [`DEFAULT_RETENTION`]), in batches of `batch` rows so that no statement holds many locks;
    /// returns how many were deleted. A deleted row no longer protects against a redelivery of
    /// its event, so keep the window longer than any redelivery can be late.
    pub async fn purge_processed(
        &self,
        older_than: Duration,
        batch: u32,
    ) -> Result<u64, StoreError> {
        store::delete_in_batches(batch, |limit| {
            self.store.delete_processed(older_than, limit)
        })
        .await
    }

    /// Inbox rows received more than `older_than` ago and still not processed: a health metric
    /// (only the two-phase mode leaves such rows by design).
    pub async fn stuck(&self, older_than: Duration) -> Result<i64, StoreError> {
        self.store.count_stuck(older_than).await
    }

    /// Runs a dead letter of this group through the normal inbox path again (the handler, in
    /// its transaction with the inbox row). Marks it replayed when it was processed, when the
    /// event turns out to be processed already, or when its handler deferred it (it is back in
    /// the inbox, and dead-lettered again, as a new letter state, if it is deferred too often).
    pub async fn replay(&self, id: i64) -> Result<Outcome, ReplayError> {
        let letter = self
            .store
            .load_dead_letter(self.group(), id)
            .await?
            .ok_or_else(|| ReplayError::NotFound {
                group: self.group().to_owned(),
                id,
            })?;
        if letter.replayed {
            return Err(ReplayError::AlreadyReplayed {
                group: self.group().to_owned(),
                id,
            });
        }
        let shutdown = CancellationToken::new();
        let d = &letter.delivery;
        // A two-phase handler's letter runs here and now, as a one-phase message would.
        let (span, started) = (self.message_span(d), Instant::now());
        let outcome = match self.prepare(d).with_span(&span) {
            Prepared::Ready(ready) => self.run(&ready, &shutdown).instrument(span.clone()).await,
            other => {
                let resolve = self.resolve(d, other, &shutdown);
                resolve.instrument(span.clone()).await
            }
        };
        self.finish(d, &span, started, &outcome);
        if matches!(
            outcome,
            Outcome::Processed { .. } | Outcome::Duplicate | Outcome::Deferred { .. }
        ) {
            self.store.mark_replayed(id).await?;
            self.telemetry.replayed(letter.event_type.as_deref());
        }
        Ok(outcome)
    }

    pub(super) async fn record_failure(
        &self,
        key: &InboxKey,
        error: &str,
        shutdown: &CancellationToken,
    ) -> Option<u32> {
        let mut outage = self.config.outage_backoff.start();
        loop {
            match self.store.record_failure(key, error).await {
                Ok(n) => return Some(n),
                Err(e) => {
                    if !wait_outage(&mut outage, &e, shutdown).await {
                        return None;
                    }
                }
            }
        }
    }

    pub(super) async fn dead_letter(
        &self,
        d: &Delivery,
        key: Option<&InboxKey>,
        event_type: Option<&str>,
        reason: &str,
        attempts: u32,
        shutdown: &CancellationToken,
    ) -> Outcome {
        let letter = DeadLetter {
            group: self.group(),
            key,
            event_type,
            delivery: d,
            error: reason,
            attempts,
            max_payload_bytes: self.config.dead_letter_payload_bytes,
        };
        let mut outage = self.config.outage_backoff.start();
        let mut rejections = 0;
        loop {
            match self.store.dead_letter(&letter).await {
                Ok(id) => {
                    return Outcome::DeadLettered {
                        reason: reason.to_owned(),
                        id,
                    }
                }
                Err(e) if e.is_rejected() && rejections + 1 >= REJECTIONS_BEFORE_DEAD_LETTER => {
                    return self.bare_dead_letter(&letter, &e, shutdown).await;
                }
                Err(e) => {
                    rejections += u32::from(e.is_rejected());
                    if !wait_outage(&mut outage, &e, shutdown).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }

    /// The last resort when the database rejects a dead letter: the same letter without its
    /// headers and event type (the text most likely at fault). If even that is not stored, the
    /// message is held, never acknowledged: the stripped letter is tried again with the outage
    /// backoff, an error logged each time, until it is stored or the consumer stops (the
    /// message is then abandoned, and delivered again).
    pub(super) async fn bare_dead_letter(
        &self,
        letter: &DeadLetter<'_>,
        error: &StoreError,
        shutdown: &CancellationToken,
    ) -> Outcome {
        let bare = Delivery {
            headers: Vec::new(),
            ..letter.delivery.clone()
        };
        let reason = format!(
            "{}; stored without its headers and type: the database rejected them: {error}",
            letter.error
        );
        let stripped = DeadLetter {
            event_type: None,
            delivery: &bare,
            error: &reason,
            ..letter.clone()
        };
        let mut outage = self.config.outage_backoff.start();
        loop {
            match self.store.dead_letter(&stripped).await {
                Ok(id) => return Outcome::DeadLettered { reason, id },
                Err(e) => {
                    tracing::error!(target: "inoutbox::engine", group = self.group(), at = %letter.delivery.coordinates(),
                        reason = reason.as_str(), error = e.to_string().as_str(),
                        "a dead letter could not be stored, even without its headers; the message is held (not acknowledged) and the dead letter tried again");
                    if !wait_outage(&mut outage, &e, shutdown).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }
}
