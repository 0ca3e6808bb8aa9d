//! One partition's state while it runs: the link to its transport, its stop token, the
//! offsets in flight, and the settling of resolved messages (commit and report).

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::engine::offsets::OffsetTracker;
use crate::message::{Delivery, Outcome};
use crate::shutdown::CancellationToken;
use crate::transport::PartitionLink;

/// What a partition run reports for each message (see `ConsumerBuilder::reports`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Report {
    /// The message.
    pub delivery: Arc<Delivery>,
    /// What became of it.
    pub outcome: Outcome,
    /// The offset position committed after it, if one was.
    pub committed: Option<i64>,
}

/// One partition's state while it runs.
pub(crate) struct Partition<L> {
    pub(super) link: L,
    pub(super) stop: CancellationToken,
    pub(super) reports: Option<mpsc::UnboundedSender<Report>>,
    pub(super) tracker: OffsetTracker,
}

impl<L: PartitionLink> Partition<L> {
    /// Whether to stop taking messages: shutting down, or the partition was revoked (the rest
    /// is left to the next owner).
    pub(super) fn ending(&self) -> bool {
        self.stop.is_cancelled() || !self.link.owned()
    }

    /// Resolves a batch's messages in the tracker (dead letters also go to the transport),
    /// commits the position once, and reports; `false` if a message was abandoned (shutdown,
    /// revocation).
    ///
    /// An abandoned message stays in flight in the tracker: a message after it in the batch
    /// that did resolve (a copy of an earlier message, a dead letter) never moves the position
    /// past it, so the next owner of the partition reads it again.
    pub(super) async fn settle(
        &mut self,
        results: impl IntoIterator<Item = (Arc<Delivery>, Outcome)>,
    ) -> bool {
        let mut settled = Vec::new();
        // The position to commit, and the message whose resolution moved it there last.
        let mut position = None;
        let mut mover = 0;
        let mut complete = true;
        for (d, outcome) in results {
            if outcome == Outcome::Abandoned {
                self.tracker.start(d.offset);
                complete = false;
                continue;
            }
            if let Outcome::DeadLettered { reason, id } = &outcome {
                self.link.dead_lettered(&d, reason, *id).await;
            }
            let moved = if outcome.acknowledges() {
                self.tracker.resolve(d.offset)
            } else {
                self.tracker.hold(d.offset)
            };
            if moved.is_some() {
                position = moved;
                mover = settled.len();
            }
            settled.push((d, outcome));
        }
        let committed = position.filter(|p| self.link.commit(*p));
        if let Some(reports) = &self.reports {
            for (n, (delivery, outcome)) in settled.into_iter().enumerate() {
                let committed = if n == mover { committed } else { None };
                let _ = reports.send(Report {
                    delivery,
                    outcome,
                    committed,
                });
            }
        }
        complete
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Delivery, OffsetTracker, Outcome, Partition};
    use crate::engine::fake::Recorder;
    use crate::shutdown::CancellationToken;

    fn delivery(offset: i64) -> Arc<Delivery> {
        Arc::new(Delivery {
            topic: "t".into(),
            partition: 0,
            offset,
            key: None,
            payload: None,
            headers: Vec::new(),
        })
    }

    #[tokio::test]
    async fn a_message_resolved_after_an_abandoned_one_never_commits_past_it() {
        let link = Arc::new(Recorder::default());
        let stop = CancellationToken::new();
        let mut part = Partition {
            link: link.clone(),
            stop,
            reports: None,
            tracker: OffsetTracker::default(),
        };
        let batch = [
            (delivery(10), Outcome::Processed { attempt: 1 }),
            (delivery(11), Outcome::Abandoned),
            (delivery(12), Outcome::Abandoned),
            // A copy of an earlier message, and a dead letter, resolved after the abandoned.
            (delivery(13), Outcome::Duplicate),
            (
                delivery(14),
                Outcome::DeadLettered {
                    reason: "bad".to_owned(),
                    id: 1,
                },
            ),
        ];
        assert!(!part.settle(batch).await, "the batch is not complete");
        assert_eq!(
            *link.0.lock().unwrap(),
            [11],
            "committed up to the abandoned message"
        );
        assert_eq!(part.tracker.position(), Some(11));
    }
}
