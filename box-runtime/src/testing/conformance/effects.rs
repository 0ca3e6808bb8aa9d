//! The rules of effects after commit: scheduled in a transaction, claimed by one drain at a
//! time and by the scheduling group only, settled by the lease's owner.

use std::any::Any;
use std::time::Duration;

use super::suite::{tick, Checked, Conformance, Suite};
use crate::effects::{ScheduleEffect, ScheduledEffect};
use crate::store::{InboxStore, StoreError, StoredEffect};

/// Schedules `effect` in `tx` as `after_commit` does, when `tx` is a `sqlx` transaction of a
/// built-in backend; `None` when it is not.
async fn schedule<T: Any>(
    tx: &mut T,
    table: &str,
    effect: ScheduledEffect<'_>,
) -> Option<Result<(), StoreError>> {
    let tx: &mut dyn Any = tx;
    if let Some(tx) = tx.downcast_mut::<sqlx::Transaction<'static, sqlx::Postgres>>() {
        return Some(
            sqlx::Postgres::schedule_effect(tx, table, effect)
                .await
                .map_err(Into::into),
        );
    }
    #[cfg(feature = "sqlite")]
    if let Some(tx) = tx.downcast_mut::<sqlx::Transaction<'static, sqlx::Sqlite>>() {
        return Some(
            sqlx::Sqlite::schedule_effect(tx, table, effect)
                .await
                .map_err(Into::into),
        );
    }
    #[cfg(feature = "mysql")]
    if let Some(tx) = tx.downcast_mut::<sqlx::Transaction<'static, sqlx::MySql>>() {
        return Some(
            sqlx::MySql::schedule_effect(tx, table, effect)
                .await
                .map_err(Into::into),
        );
    }
    None
}

/// Schedules effects `(kind, idempotency key)` of `group` in one transaction, committed or not;
/// `None` when the store's transaction cannot schedule effects.
async fn schedule_all<S: InboxStore>(
    s: &Suite<'_, S>,
    rule: &'static str,
    group: &str,
    effects: &[(&str, &str)],
    commit: bool,
) -> Checked<Option<()>> {
    let table = s.store.tables().effects.to_string();
    let mut tx = s.store.begin().await.map_err(s.failed(rule))?;
    for (kind, key) in effects {
        let effect = ScheduledEffect {
            group,
            source: "inoutbox-conformance",
            event_id: "conformance-event",
            kind,
            idempotency_key: key,
            payload: b"{\"to\":\"conformance\"}".to_vec(),
        };
        match schedule(&mut tx, &table, effect).await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                let _ = s.store.rollback(tx).await;
                return Err(s.failed(rule)(e));
            }
            None => {
                let _ = s.store.rollback(tx).await;
                return Ok(None);
            }
        }
    }
    match commit {
        true => s.store.commit(tx).await.map_err(s.failed(rule))?,
        false => s.store.rollback(tx).await.map_err(s.failed(rule))?,
    }
    Ok(Some(()))
}

/// Effects after commit.
pub(super) async fn effects<S: InboxStore>(
    s: &Suite<'_, S>,
    done: &mut Conformance,
) -> Checked<()> {
    const SCHEDULED: &str = "effects.claimed_once_by_their_group";
    let group = format!("{}-effects", s.group);
    let key = format!("{}-mail", s.group);
    let rolled_back = format!("{}-rolled-back", s.group);
    let scheduled = schedule_all(
        s,
        SCHEDULED,
        &group,
        &[("mail", &key), ("mail", &key)],
        true,
    )
    .await?;
    if scheduled.is_none() {
        done.skipped.push((
            "effects",
            "the store's transaction is not a sqlx transaction `after_commit` writes through",
        ));
        return Ok(());
    }
    schedule_all(s, SCHEDULED, &group, &[("mail", &rolled_back)], false).await?;
    let (lease, store) = (Duration::from_secs(30), s.store);
    let other = store.claim_effects("another-group", "o1", lease, 10).await;
    let other = other.map_err(s.failed(SCHEDULED))?;
    s.ensure(SCHEDULED, other.iter().all(|e| e.group != group), || {
        format!("another group claimed this group's effects: {other:?}")
    })?;
    let claimed = store.claim_effects(&group, "o1", lease, 10).await;
    let claimed = claimed.map_err(s.failed(SCHEDULED))?;
    let one = matches!(&claimed[..], [StoredEffect { kind, idempotency_key, attempts: 0, payload, .. }]
        if kind == "mail" && *idempotency_key == key && payload == b"{\"to\":\"conformance\"}");
    s.ensure(SCHEDULED, one, || {
        format!("one committed effect scheduled twice (one more rolled back), claimed: {claimed:?}")
    })?;
    let second = store.claim_effects(&group, "o2", lease, 10).await;
    let second = second.map_err(s.failed(SCHEDULED))?;
    s.ensure(SCHEDULED, second.is_empty(), || {
        format!("an effect under a live lease was claimed by a second drain: {second:?}")
    })?;
    done.passed.push(SCHEDULED);
    settle(s, done, &group, claimed[0].id).await
}

async fn settle<S: InboxStore>(
    s: &Suite<'_, S>,
    done: &mut Conformance,
    group: &str,
    id: i64,
) -> Checked<()> {
    const RULE: &str = "effects.settled_by_the_lease_owner";
    let (lease, store) = (Duration::from_secs(30), s.store);
    let failed = store
        .settle_effect(id, "o1", Some("conformance: 503"), Duration::ZERO)
        .await;
    failed.map_err(s.failed(RULE))?;
    tick().await;
    let again = store.claim_effects(group, "o2", lease, 10).await;
    let again = again.map_err(s.failed(RULE))?;
    s.ensure(
        RULE,
        matches!(&again[..], [e] if e.id == id && e.attempts == 1),
        || format!("a failed effect due again was claimed as {again:?} (expected one, 1 attempt)"),
    )?;
    let counts = store.count_effects(group).await.map_err(s.failed(RULE))?;
    s.ensure(RULE, counts.pending == 1 && counts.failed == 1, || {
        format!("one effect not done, failed once, counted as {counts:?}")
    })?;
    store
        .settle_effect(id, "o1", None, Duration::ZERO)
        .await
        .map_err(s.failed(RULE))?;
    let counts = store.count_effects(group).await.map_err(s.failed(RULE))?;
    s.ensure(RULE, counts.pending == 1, || {
        "a drain that lost the lease marked the effect done".to_owned()
    })?;
    store
        .settle_effect(id, "o2", None, Duration::ZERO)
        .await
        .map_err(s.failed(RULE))?;
    let counts = store.count_effects(group).await.map_err(s.failed(RULE))?;
    tick().await;
    let after = store
        .claim_effects(group, "o3", Duration::from_millis(1), 10)
        .await;
    let after = after.map_err(s.failed(RULE))?;
    s.ensure(RULE, counts.pending == 0 && after.is_empty(), || {
        format!("a done effect: counted {counts:?}, claimed again {after:?}")
    })?;
    done.passed.push(RULE);
    Ok(())
}
