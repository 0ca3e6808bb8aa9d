//! Effects after commit: work a handler schedules (an e-mail, a call to another service) that
//! runs only if the handler's transaction commits, at least once, with a stable idempotency key.
//!
//! [`after_commit`] writes the effect into the effects table *in the handler's transaction*:
//! a rollback (a failed or retried run) leaves nothing, a commit leaves a durable row. The
//! consumer drains the table after each commit (and at start-up, which picks up rows a dead
//! process left) and runs the executor registered for the effect's kind
//! ([`ConsumerBuilder::effect`](crate::ConsumerBuilder::effect)). A process may die after the
//! external call and before the row is marked done: the effect then runs again, with the same
//! [`Effect::idempotency_key`], so the receiving side must deduplicate on it.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use inoutbox::prelude::*;
//!
//! #[derive(Debug, Serialize, Deserialize, OutboxEvent)]
//! #[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
//! pub struct OrderCreated { pub order_id: u64, pub email: String }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Receipt { to: String, order_id: u64 }
//!
//! #[inbox_handler(event = "OrderCreated", group = "mailing")]
//! async fn send_receipt(event: OrderCreated, tx: &mut PgTx<'_>, meta: &MessageMeta) -> Result<(), HandlerError> {
//!     // ... database writes through `tx` ...
//!     let receipt = Receipt { to: event.email, order_id: event.order_id };
//!     inoutbox::effects::after_commit(tx, meta, "send_receipt", &receipt).await?;
//!     Ok(())
//! }
//!
//! # async fn demo(store: inoutbox::PgStore, kafka: inoutbox::KafkaConfig) -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = inoutbox::Consumer::builder("mailing", store, kafka)
//!     .effect("send_receipt", |effect: inoutbox::effects::Effect| async move {
//!         let receipt: Receipt = effect.payload_as()?;
//!         // Call the mail service with `effect.idempotency_key` (e.g. an `Idempotency-Key`
//!         // header): a retried effect must not send a second e-mail.
//!         let _ = (receipt.to, effect.idempotency_key);
//!         Ok(())
//!     })
//!     .build()?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;

use crate::handler::{HandlerError, MessageMeta};
use crate::shutdown::{sleep_unless_cancelled, CancellationToken};
use crate::store::{text, InboxStore, StoredEffect};

/// Schedules an effect of `kind` with `payload` (serialized as JSON) to run after the handler's
/// transaction `tx` commits; returns its idempotency key (see [`idempotency_key`]). Scheduling
/// the same kind twice in one run is one effect: give each a distinct kind (`"email:welcome"`,
/// `"email:receipt"`) to have several.
pub async fn after_commit<T: Serialize + ?Sized>(
    tx: &mut crate::postgres::PgTx<'_>,
    meta: &MessageMeta,
    kind: &str,
    payload: &T,
) -> Result<String, HandlerError> {
    let payload = serde_json::to_vec(payload).map_err(HandlerError::permanent)?;
    let source = meta.source.as_deref().unwrap_or("");
    let key = idempotency_key(&meta.group, source, &meta.event_id, kind);
    let table = match &meta.effects_table {
        Some(table) => table.to_string(),
        None => crate::store::Tables::default().effects.to_string(),
    };
    sqlx::query(crate::postgres::schedule_sql(&table))
        .bind(&meta.group)
        .bind(source)
        .bind(text::inbox_id(&meta.event_id))
        .bind(text::safe_text(kind, text::MAX_LABEL_BYTES))
        .bind(&key)
        .bind(payload)
        .execute(&mut **tx)
        .await?;
    Ok(key)
}

/// The idempotency key of an effect: the same for every run of the same (group, source, event
/// id, kind), whatever the delivery, retry or process: `inoutbox-` and the SHA-256 of the four,
/// in hex.
pub fn idempotency_key(group: &str, source: &str, event_id: &str, kind: &str) -> String {
    let mut material = Vec::new();
    for part in [group, source, event_id, kind] {
        material.extend_from_slice(&(part.len() as u64).to_be_bytes());
        material.extend_from_slice(part.as_bytes());
    }
    format!("inoutbox-{}", text::sha256_hex(&material))
}

/// One effect, as its executor receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Effect {
    /// What to run (the name given to [`after_commit`]).
    pub kind: String,
    /// The key the receiving side deduplicates on: the same for every run of this effect.
    pub idempotency_key: String,
    /// The consumer group of the handler that scheduled it.
    pub group: String,
    /// The event id of the message whose handler scheduled it.
    pub event_id: String,
    /// The payload, as JSON.
    pub payload: Vec<u8>,
    /// Which run this is: 1 for the first.
    pub attempt: u32,
}

impl Effect {
    /// The payload, decoded.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_slice(&self.payload).map_err(HandlerError::permanent)
    }
}

/// The future an effect executor returns.
pub type EffectFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// An effect executor, erased.
pub(crate) type Executor = Arc<dyn Fn(Effect) -> EffectFuture + Send + Sync>;

/// The executors of a consumer, by kind.
#[derive(Clone, Default)]
pub(crate) struct Executors {
    pub(crate) by_kind: HashMap<String, Executor>,
}

impl std::fmt::Debug for Executors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_kind.keys()).finish()
    }
}

/// How long a drain's claim on an effect holds (it is retried by another process after it).
const EFFECT_LEASE: Duration = Duration::from_secs(30);
/// How often the drain looks for effects other processes left.
const EFFECT_POLL: Duration = Duration::from_secs(1);
/// Effects claimed at once.
const EFFECT_BATCH: u32 = 32;

/// The wait before an effect that failed `attempts` times runs again: 1 s doubling to 5 min.
fn retry_in(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(8)).min(Duration::from_secs(300))
}

/// Drains the effects table until `shutdown`: claims pending effects (leased, skipping those
/// others hold), runs their executors, marks them done or failed. Starts with a drain, so rows
/// a dead process left run (once their lease, if any, expired).
pub(crate) async fn drain<S: InboxStore>(
    store: &S,
    executors: &Executors,
    wake: &Notify,
    shutdown: CancellationToken,
) {
    let owner = format!("effects-{}-{:x}", std::process::id(), rand_suffix());
    while !shutdown.is_cancelled() {
        let woken = wake.notified();
        let claimed = match store
            .claim_effects(&owner, EFFECT_LEASE, EFFECT_BATCH)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(target: "inoutbox::effects", error = e.to_string().as_str(), "claiming effects failed");
                Vec::new()
            }
        };
        if claimed.is_empty() {
            tokio::select! {
                () = woken => {},
                _ = sleep_unless_cancelled(EFFECT_POLL, &shutdown) => {},
            }
            continue;
        }
        for effect in claimed {
            run_one(store, executors, &owner, effect).await;
        }
    }
}

async fn run_one<S: InboxStore>(store: &S, executors: &Executors, owner: &str, row: StoredEffect) {
    let (id, attempts) = (row.id, row.attempts);
    let result = match executors.by_kind.get(&row.kind) {
        None => Err(format!("no executor for effect kind `{}`", row.kind)),
        Some(executor) => {
            let effect = Effect {
                kind: row.kind,
                idempotency_key: row.idempotency_key,
                group: row.group,
                event_id: row.event_id,
                payload: row.payload,
                attempt: attempts + 1,
            };
            match tokio::time::timeout(EFFECT_LEASE, executor(effect)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("the effect took longer than {EFFECT_LEASE:?}")),
            }
        }
    };
    if let Err(error) = &result {
        tracing::warn!(target: "inoutbox::effects",
            effect = id,
            attempt = attempts + 1,
            error = error.as_str(),
            "effect failed, retrying later"
        );
    }
    let error = result.err();
    if let Err(e) = store
        .settle_effect(id, owner, error.as_deref(), retry_in(attempts))
        .await
    {
        // Its lease expires and it runs again: at least once, not lost.
        tracing::warn!(target: "inoutbox::effects",
            effect = id,
            error = e.to_string().as_str(),
            "marking an effect failed"
        );
    }
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
