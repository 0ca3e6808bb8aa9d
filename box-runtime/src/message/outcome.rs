//! What became of one message.

/// What became of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its transaction committed.
    Processed {
        /// Which run succeeded (1 = first).
        attempt: u32,
    },
    /// The inbox row existed: the handler did not run.
    Duplicate,
    /// Another event with the same business key (`idempotency_key` / `dedup_by`) was processed
    /// in the group within the business-key window: the handler did not run; acknowledged.
    DuplicateBusinessKey {
        /// The business key as the inbox holds it, `scope:key`: the scope is the handler's
        /// event type, or the `dedup_scope` it names.
        key: String,
    },
    /// The handler failed and the strategy acknowledges anyway (`AtMostOnce`, `OnPersist`): the
    /// effect is lost by design.
    FailedAcknowledged {
        /// The error chain.
        error: String,
    },
    /// The handler failed and the message stays unacknowledged
    /// ([`OnExhausted::LeaveUncommitted`](crate::engine::OnExhausted::LeaveUncommitted)); it is delivered again after a restart or rebalance.
    FailedUnacknowledged {
        /// The error chain.
        error: String,
        /// Failed runs so far.
        attempts: u32,
    },
    /// Stored in the dead-letter table; acknowledged.
    DeadLettered {
        /// Why.
        reason: String,
        /// Its id in the dead-letter table.
        id: i64,
    },
    /// No handler for the event type and the consumer skips those; acknowledged.
    Skipped {
        /// Why.
        reason: String,
    },
    /// Shutdown or revocation came before the message was resolved: nothing acknowledged;
    /// the next owner of the partition reads it again.
    Abandoned,
    /// A two-phase handler's message is stored as received; workers will run the handler.
    /// Acknowledged.
    Received,
    /// The handler deferred the message (`HandlerError::defer`): its transaction rolled back,
    /// the message is kept in the inbox, due `after` from now, and runs again then.
    /// Acknowledged: the partition goes on past it.
    Deferred {
        /// How long the handler asked to wait.
        after: std::time::Duration,
        /// How many times the message has been deferred, this one included.
        deferrals: u32,
    },
    /// A two-phase worker lost its claim on the row (its lease expired and another worker
    /// claimed it): its transaction rolled back; the other worker resolves the message.
    LeaseLost,
}

impl Outcome {
    /// Whether the offset of this message may be committed.
    pub fn acknowledges(&self) -> bool {
        !matches!(self, Self::FailedUnacknowledged { .. } | Self::Abandoned)
    }

    /// A one-word label for logs and counters.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Processed { .. } => "processed",
            Self::Duplicate => "duplicate",
            Self::DuplicateBusinessKey { .. } => "duplicate business key",
            Self::FailedAcknowledged { .. } => "failed (acknowledged)",
            Self::FailedUnacknowledged { .. } => "failed",
            Self::DeadLettered { .. } => "dead-lettered",
            Self::Skipped { .. } => "skipped",
            Self::Abandoned => "abandoned",
            Self::Received => "received",
            Self::LeaseLost => "lease lost",
            Self::Deferred { .. } => "deferred",
        }
    }
}
