//! Scheduling an effect: [`after_commit`] writes it in the handler's transaction, through the
//! backend of that transaction ([`EffectsDb`]); [`idempotency_key`] names it.

use std::future::Future;

use serde::Serialize;

use crate::handler::{HandlerError, MessageMeta};
use crate::store::{text, Tables};

/// Schedules an effect of `kind` with `payload` (serialized as JSON) to run after the handler's
/// transaction `tx` commits; returns its idempotency key (see [`idempotency_key`]). Scheduling
/// the same kind twice in one run is one effect: give each a distinct kind (`"email:welcome"`,
/// `"email:receipt"`) to have several.
///
/// `tx` is the transaction the handler takes (`tx: &mut PgTx<'_>`, `&mut SqliteTx<'_>` or
/// `&mut MySqlTx<'_>`, or `&mut Tx<'_, D>` in a handler generic over `D: Db + EffectsDb`): the
/// effect is kept in that store's effects table (see [`EffectsDb`]).
pub async fn after_commit<T: Serialize + ?Sized>(
    tx: &mut sqlx::Transaction<'_, impl EffectsDb>,
    meta: &MessageMeta,
    kind: &str,
    payload: &T,
) -> Result<String, HandlerError> {
    let payload = serde_json::to_vec(payload).map_err(HandlerError::permanent)?;
    let source = meta.source.as_deref().unwrap_or("");
    let key = idempotency_key(&meta.group, source, &meta.event_id, kind);
    let default;
    let table = match &meta.effects_table {
        Some(table) => &**table,
        None => {
            default = Tables::default().effects.to_string();
            &default
        }
    };
    let effect = ScheduledEffect {
        group: &meta.group,
        source,
        event_id: &text::inbox_id(&meta.event_id),
        kind: &text::safe_text(kind, text::MAX_LABEL_BYTES),
        idempotency_key: &key,
        payload,
    };
    ScheduleEffect::schedule_effect(tx, table, effect).await?;
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

/// A database whose transactions [`after_commit`] can schedule effects in: PostgreSQL, SQLite
/// and MySQL/MariaDB, whose migrations create the effects table.
///
/// This trait is sealed: the backends of inoutbox implement it.
pub trait EffectsDb: ScheduleEffect {}

impl<D: ScheduleEffect> EffectsDb for D {}

/// What a backend implements to keep effects: the insert of one scheduled effect in a
/// transaction. Not nameable outside this crate, which seals [`EffectsDb`].
pub trait ScheduleEffect: sqlx::Database {
    /// Inserts `effect` into the effects table `table` in `tx`; the same idempotency key
    /// scheduled twice is one effect.
    fn schedule_effect<'t>(
        tx: &'t mut sqlx::Transaction<'_, Self>,
        table: &'t str,
        effect: ScheduledEffect<'t>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 't;
}

/// Implements [`ScheduleEffect`] for a backend's database: `$sql` maps the effects table's
/// name to the backend's insert statement, whose six values are bound in this order: group,
/// source, event id, kind, idempotency key, payload.
macro_rules! schedule_effect_with {
    ($db:ty, $sql:expr) => {
        impl $crate::effects::ScheduleEffect for $db {
            fn schedule_effect<'t>(
                tx: &'t mut sqlx::Transaction<'_, Self>,
                table: &'t str,
                effect: $crate::effects::ScheduledEffect<'t>,
            ) -> impl ::std::future::Future<Output = Result<(), sqlx::Error>> + Send + 't {
                let sql = ($sql)(table);
                async move {
                    sqlx::query(sql)
                        .bind(effect.group)
                        .bind(effect.source)
                        .bind(effect.event_id)
                        .bind(effect.kind)
                        .bind(effect.idempotency_key)
                        .bind(effect.payload)
                        .execute(&mut **tx)
                        .await?;
                    Ok(())
                }
            }
        }
    };
}
pub(crate) use schedule_effect_with;

/// One effect as [`after_commit`] hands it to the backend: its values, made safe to store.
#[derive(Debug)]
pub struct ScheduledEffect<'a> {
    /// The consumer group of the handler.
    pub group: &'a str,
    /// The event source (`""` when the inbox is keyed by id alone).
    pub source: &'a str,
    /// The event id, as the inbox stores it.
    pub event_id: &'a str,
    /// The effect's kind, as stored.
    pub kind: &'a str,
    /// The key the receiving side deduplicates on.
    pub idempotency_key: &'a str,
    /// The payload, as JSON.
    pub payload: Vec<u8>,
}
