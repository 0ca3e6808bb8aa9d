//! The rules of the inbox: claims, failures, dead letters, retention, business keys, deferred
//! messages and two-phase leases.

use std::time::Duration;

use super::suite::{tick, Checked, Conformance, Suite, SLOW};
use crate::store::{Claim, ClaimRequest, DeadLetter, InboxStore};

/// Claims, batch claims, failures, dead letters, retention and business keys.
pub(super) async fn core<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    claims(s, done).await?;
    batch(s, done).await?;
    failures(s, done).await?;
    dead_letters(s, done).await?;
    retention(s, done).await?;
    business_keys(s, done).await
}

async fn claims<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const NEW: &str = "claim.new";
    let (key, d) = (s.key(""), s.delivery(1));
    let claim = s.claim_once(NEW, &key, &d, false).await?;
    s.ensure(NEW, claim == Claim::New { attempts: 0 }, || {
        format!("the first claim of a message answered {claim:?}, not New {{ attempts: 0 }}")
    })?;
    done.passed.push(NEW);

    const ROLLBACK: &str = "claim.rolled_back_holds_nothing";
    let claim = s.claim_once(ROLLBACK, &key, &d, true).await?;
    s.ensure(ROLLBACK, matches!(claim, Claim::New { .. }), || {
        format!("a claim after a rolled-back one answered {claim:?}: the rollback kept the row")
    })?;
    done.passed.push(ROLLBACK);

    const DUPLICATE: &str = "claim.duplicate";
    let claim = s.claim_once(DUPLICATE, &key, &d, false).await?;
    s.ensure(DUPLICATE, claim == Claim::Duplicate, || {
        format!("a claim of a committed message answered {claim:?}, not Duplicate")
    })?;
    done.passed.push(DUPLICATE);
    Ok(())
}

async fn batch<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const RULE: &str = "claim_batch.one_duplicate";
    let keys = [s.key(""), s.key(""), s.key("")];
    let ds = [s.delivery(10), s.delivery(11), s.delivery(12)];
    s.claim_once(RULE, &keys[1], &ds[1], true).await?;
    let requests: Vec<ClaimRequest<'_>> = keys
        .iter()
        .zip(&ds)
        .map(|(key, delivery)| ClaimRequest {
            key,
            event_type: "ConformanceEvent",
            delivery,
        })
        .collect();
    let mut tx = s.store.begin().await.map_err(s.failed(RULE))?;
    let claims = s.store.claim_batch(&mut tx, &requests).await;
    let _ = s.store.rollback(tx).await;
    let claims = claims.map_err(s.failed(RULE))?;
    let expected = [
        Claim::New { attempts: 0 },
        Claim::Duplicate,
        Claim::New { attempts: 0 },
    ];
    s.ensure(RULE, claims == expected, || {
        format!("a batch of new, committed, new answered {claims:?}, not {expected:?}")
    })?;
    done.passed.push(RULE);
    Ok(())
}

async fn failures<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const SURVIVE: &str = "record_failure.survives_rollback";
    let (key, d) = (s.key(""), s.delivery(20));
    for expected in 1..=2 {
        // As the engine does: the run's transaction rolls back, then the failure is recorded.
        s.claim_once(SURVIVE, &key, &d, false).await?;
        let n = s
            .store
            .record_failure(&key, "conformance: simulated failure")
            .await;
        let n = n.map_err(s.failed(SURVIVE))?;
        s.ensure(SURVIVE, n == expected, || {
            format!("failed run {expected} was counted as {n}")
        })?;
    }
    done.passed.push(SURVIVE);

    const ATTEMPTS: &str = "claim.reports_attempts";
    let mut tx = s.store.begin().await.map_err(s.failed(ATTEMPTS))?;
    let claim = s.store.claim(&mut tx, &key, "ConformanceEvent", &d).await;
    let claim = match claim {
        Ok(c) => c,
        Err(e) => {
            let _ = s.store.rollback(tx).await;
            return Err(s.failed(ATTEMPTS)(e));
        }
    };
    if claim != (Claim::New { attempts: 2 }) {
        let _ = s.store.rollback(tx).await;
        return Err(s.broke(
            ATTEMPTS,
            format!("after two failed runs the claim answered {claim:?}"),
        ));
    }
    done.passed.push(ATTEMPTS);

    const CLEARED: &str = "mark_processed.clears_failures";
    let marked = s.store.mark_processed(&mut tx, &key, true).await;
    if let Err(e) = marked {
        let _ = s.store.rollback(tx).await;
        return Err(s.failed(CLEARED)(e));
    }
    s.store.commit(tx).await.map_err(s.failed(CLEARED))?;
    let n = s
        .store
        .record_failure(&key, "conformance: after success")
        .await;
    let n = n.map_err(s.failed(CLEARED))?;
    s.ensure(CLEARED, n == 1, || {
        format!("a failure recorded after the success counts {n} runs: the earlier were kept")
    })?;
    done.passed.push(CLEARED);
    Ok(())
}

async fn dead_letters<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const STORED: &str = "dead_letter.stored_and_loaded";
    let (key, d) = (s.key(""), s.delivery(30));
    let letter = DeadLetter {
        group: &key.group,
        key: Some(&key),
        event_type: Some("ConformanceEvent"),
        delivery: &d,
        error: "conformance: given up",
        attempts: 3,
        max_payload_bytes: 1 << 20,
    };
    let id = s
        .store
        .dead_letter(&letter)
        .await
        .map_err(s.failed(STORED))?;
    let loaded = s.store.load_dead_letter(&key.group, id).await;
    let Some(stored) = loaded.map_err(s.failed(STORED))? else {
        return Err(s.broke(
            STORED,
            format!("dead letter {id} of its group was not found"),
        ));
    };
    let same = stored.delivery == d
        && stored.attempts == 3
        && stored.event_id.as_deref() == Some(key.event_id.as_str())
        && stored.event_type.as_deref() == Some("ConformanceEvent")
        && stored.error.contains("conformance: given up")
        && !stored.replayed;
    s.ensure(STORED, same, || {
        format!("stored {d:?} (3 attempts, not replayed), loaded {stored:?}")
    })?;
    let other = s.store.load_dead_letter("another-group", id).await;
    s.ensure(STORED, other.map_err(s.failed(STORED))?.is_none(), || {
        "a dead letter was loaded under another group".to_owned()
    })?;
    let count = s.store.count_dead_letters(&key.group).await;
    let count = count.map_err(s.failed(STORED))?;
    s.ensure(STORED, count == 1, || {
        format!("one letter counted as {count}")
    })?;
    done.passed.push(STORED);

    const REPLAYED: &str = "mark_replayed.marks_and_uncounts";
    s.store
        .mark_replayed(id)
        .await
        .map_err(s.failed(REPLAYED))?;
    let loaded = s.store.load_dead_letter(&key.group, id).await;
    let replayed = loaded
        .map_err(s.failed(REPLAYED))?
        .is_some_and(|l| l.replayed);
    let count = s.store.count_dead_letters(&key.group).await;
    let count = count.map_err(s.failed(REPLAYED))?;
    s.ensure(REPLAYED, replayed && count == 0, || {
        format!("after mark_replayed: replayed {replayed}, letters counted {count}")
    })?;
    done.passed.push(REPLAYED);
    Ok(())
}

async fn retention<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const RULE: &str = "delete_processed.batches_processed_rows_only";
    let keys = [s.key(""), s.key(""), s.key("")];
    for (i, key) in keys.iter().enumerate() {
        s.claim_once(RULE, key, &s.delivery(40 + i as i64), true)
            .await?;
    }
    // An unprocessed row (a received two-phase one), which retention never deletes.
    let pending = s.key("-retention");
    let kept = S::TWO_PHASE && s.receive(RULE, &pending, &s.delivery(43)).await?;
    tick().await;
    let first = s.store.delete_processed(Duration::ZERO, 2).await;
    let first = first.map_err(s.failed(RULE))?;
    s.ensure(RULE, (1..=2).contains(&first), || {
        format!("a delete of at most 2 processed rows (3 old ones and more) deleted {first}")
    })?;
    let mut total = first;
    loop {
        let n = s.store.delete_processed(Duration::ZERO, 1000).await;
        let n = n.map_err(s.failed(RULE))?;
        total += n;
        if n < 1000 {
            break;
        }
    }
    s.ensure(RULE, total >= 3, || {
        format!("deleted {total} of 3 old processed rows")
    })?;
    for (i, key) in keys.iter().enumerate() {
        let claim = s
            .claim_once(RULE, key, &s.delivery(40 + i as i64), false)
            .await?;
        s.ensure(RULE, matches!(claim, Claim::New { .. }), || {
            format!("a deleted processed row still answers {claim:?}")
        })?;
    }
    if kept {
        let lease = Suite::<S>::lease(&pending.group, "o1", Duration::from_secs(30), &[]);
        let row = s
            .store
            .claim_received(&lease)
            .await
            .map_err(s.failed(RULE))?;
        s.ensure(RULE, row.is_some(), || {
            "retention deleted an unprocessed row".to_owned()
        })?;
    }
    done.passed.push(RULE);
    Ok(())
}

async fn business_keys<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const RULE: &str = "claim.duplicate_business_key";
    let business_key = Some(format!("ConformanceEvent:{}", uuid::Uuid::new_v4()));
    let first = crate::store::InboxKey {
        business_key: business_key.clone(),
        ..s.key("")
    };
    let second = crate::store::InboxKey {
        business_key,
        ..s.key("")
    };
    s.claim_once(RULE, &first, &s.delivery(50), true).await?;
    let claim = s.claim_once(RULE, &second, &s.delivery(51), false).await?;
    s.ensure(RULE, claim == Claim::DuplicateBusinessKey, || {
        format!("another event with a processed business key answered {claim:?}")
    })?;
    done.passed.push(RULE);

    const EXPIRED: &str = "expire_business_keys.frees_old_keys";
    tick().await;
    let mut tx = s.store.begin().await.map_err(s.failed(EXPIRED))?;
    let expired = s
        .store
        .expire_business_keys(&mut tx, &[&second], Duration::ZERO)
        .await;
    let claim = match expired {
        Ok(()) => {
            s.store
                .claim(&mut tx, &second, "ConformanceEvent", &s.delivery(51))
                .await
        }
        Err(e) => Err(e),
    };
    let _ = s.store.rollback(tx).await;
    let claim = claim.map_err(s.failed(EXPIRED))?;
    s.ensure(EXPIRED, matches!(claim, Claim::New { .. }), || {
        format!("after the business key's window the claim answered {claim:?}")
    })?;
    done.passed.push(EXPIRED);
    Ok(())
}

/// Deferred messages: kept with their message, claimed when due under a lease.
pub(super) async fn deferral<S: InboxStore>(
    s: &Suite<'_, S>,
    done: &mut Conformance,
) -> Checked<()> {
    const RULE: &str = "defer.claimed_when_due_under_a_lease";
    let (key, d) = (s.key("-deferred"), s.delivery(60));
    let store = s.store;
    let mut tx = store.begin().await.map_err(s.failed(RULE))?;
    let kept = match store.claim(&mut tx, &key, "ConformanceEvent", &d).await {
        Ok(_) => store.defer(&mut tx, &key, &d, Duration::ZERO).await,
        Err(e) => Err(e),
    };
    let deferrals = match kept {
        Ok(n) => n,
        Err(e) => {
            let _ = store.rollback(tx).await;
            return Err(s.failed(RULE)(e));
        }
    };
    store.commit(tx).await.map_err(s.failed(RULE))?;
    s.ensure(RULE, deferrals == 1, || {
        format!("a first deferral counted {deferrals}")
    })?;
    let count = store
        .count_deferred(&key.group)
        .await
        .map_err(s.failed(RULE))?;
    s.ensure(RULE, count == 1, || {
        format!("one deferred row counted as {count}")
    })?;
    tick().await;
    let lease = Duration::from_secs(30);
    let row = store.claim_deferred(&key.group, "w1", lease).await;
    let row = row.map_err(s.failed(RULE))?;
    let same = row.as_ref().is_some_and(|r| {
        r.key.event_id == key.event_id
            && r.delivery.payload == d.payload
            && r.delivery.key == d.key
            && r.delivery.headers == d.headers
    });
    s.ensure(RULE, same, || {
        format!("the due row was claimed as {row:?}, kept from {d:?}")
    })?;
    let second = store.claim_deferred(&key.group, "w2", lease).await;
    s.ensure(RULE, second.map_err(s.failed(RULE))?.is_none(), || {
        "a deferred row under a live lease was claimed by a second worker".to_owned()
    })?;
    leased_run(s, RULE, &key, "w2", "w1").await?;
    let count = store
        .count_deferred(&key.group)
        .await
        .map_err(s.failed(RULE))?;
    s.ensure(RULE, count == 0, || {
        format!("a finished deferred row still counted ({count})")
    })?;
    done.passed.push(RULE);
    Ok(())
}

/// The leased run of `key`: `loser` (not holding the lease) is refused by `check_lease` and
/// `finish_leased`; `holder` checks, finishes and commits; a claim after it is a duplicate.
async fn leased_run<S: InboxStore>(
    s: &Suite<'_, S>,
    rule: &'static str,
    key: &crate::store::InboxKey,
    loser: &str,
    holder: &str,
) -> Checked<()> {
    let store = s.store;
    let mut tx = store.begin().await.map_err(s.failed(rule))?;
    let lost = store.check_lease(&mut tx, key, loser).await;
    let finished = match lost {
        Ok(None) => store.finish_leased(&mut tx, key, loser, false).await,
        Ok(Some(_)) => Ok(true),
        Err(e) => Err(e),
    };
    let _ = store.rollback(tx).await;
    s.ensure(rule, !finished.map_err(s.failed(rule))?, || {
        format!("`{loser}`, which does not hold the lease, passed the lease check or marked the row processed")
    })?;
    let mut tx = store.begin().await.map_err(s.failed(rule))?;
    let held = store.check_lease(&mut tx, key, holder).await;
    let finished = match held {
        Ok(Some(_)) => store.finish_leased(&mut tx, key, holder, false).await,
        Ok(None) => Ok(false),
        Err(e) => Err(e),
    };
    let finished = match finished {
        Ok(f) => f,
        Err(e) => {
            let _ = store.rollback(tx).await;
            return Err(s.failed(rule)(e));
        }
    };
    store.commit(tx).await.map_err(s.failed(rule))?;
    s.ensure(rule, finished, || {
        format!("`{holder}`, which holds the lease, could not check it and mark the row processed")
    })?;
    let claim = s.claim_once(rule, key, &s.delivery(0), false).await?;
    s.ensure(rule, claim == Claim::Duplicate, || {
        format!("a claim of a row finished under its lease answered {claim:?}")
    })
}

/// Two-phase handlers: received rows, leases, their loss, renewal, release and drop.
pub(super) async fn two_phase<S: InboxStore>(
    s: &Suite<'_, S>,
    done: &mut Conformance,
) -> Checked<()> {
    const RECEIVE: &str = "receive.once";
    let (key, d) = (s.key("-2p"), s.delivery(70));
    let inserted = s.receive(RECEIVE, &key, &d).await?;
    let again = s.receive(RECEIVE, &key, &d).await?;
    s.ensure(RECEIVE, inserted && !again, || {
        format!("receive answered {inserted} then {again}, not true then false")
    })?;
    done.passed.push(RECEIVE);

    const CLAIM: &str = "claim_received.one_holder";
    let (long, group) = (Duration::from_secs(30), key.group.as_str());
    let first = s
        .store
        .claim_received(&Suite::<S>::lease(group, "o1", long, &[]))
        .await;
    let first = first.map_err(s.failed(CLAIM))?;
    let same = first
        .as_ref()
        .is_some_and(|r| r.key.event_id == key.event_id && r.delivery == d);
    s.ensure(CLAIM, same, || format!("received {d:?}, claimed {first:?}"))?;
    let second = s
        .store
        .claim_received(&Suite::<S>::lease(group, "o2", long, &[]))
        .await;
    s.ensure(CLAIM, second.map_err(s.failed(CLAIM))?.is_none(), || {
        "a received row under a live lease was claimed by a second worker".to_owned()
    })?;
    done.passed.push(CLAIM);

    const RENEW: &str = "renew_lease.holder_only";
    let renewed = s
        .store
        .renew_lease(&key, "o1", long)
        .await
        .map_err(s.failed(RENEW))?;
    let stolen = s
        .store
        .renew_lease(&key, "o2", long)
        .await
        .map_err(s.failed(RENEW))?;
    s.ensure(RENEW, renewed && !stolen, || {
        format!("renewal by the holder answered {renewed}, by another worker {stolen}")
    })?;
    done.passed.push(RENEW);

    const RELEASE: &str = "release_lease.frees_the_row";
    s.store
        .release_lease(&key, "o1")
        .await
        .map_err(s.failed(RELEASE))?;
    let taken = s
        .store
        .claim_received(&Suite::<S>::lease(group, "o2", long, &[]))
        .await;
    s.ensure(RELEASE, taken.map_err(s.failed(RELEASE))?.is_some(), || {
        "a released row could not be claimed".to_owned()
    })?;
    done.passed.push(RELEASE);

    const LOST: &str = "finish_leased.only_while_held";
    leased_run(s, LOST, &key, "o1", "o2").await?;
    done.passed.push(LOST);
    expiry_and_drop(s, done).await?;
    ordered(s, done).await
}

async fn expiry_and_drop<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const EXPIRED: &str = "claim_received.takes_expired_leases";
    let (key, d) = (s.key("-2p-expiry"), s.delivery(80));
    let group = key.group.as_str();
    s.receive(EXPIRED, &key, &d).await?;
    let short = Suite::<S>::lease(group, "o1", Duration::from_millis(1), &[]);
    s.store
        .claim_received(&short)
        .await
        .map_err(s.failed(EXPIRED))?;
    tick().await;
    let long = Duration::from_secs(30);
    let taken = s
        .store
        .claim_received(&Suite::<S>::lease(group, "o2", long, &[]))
        .await;
    s.ensure(EXPIRED, taken.map_err(s.failed(EXPIRED))?.is_some(), || {
        "a row whose lease expired was not claimed again".to_owned()
    })?;
    done.passed.push(EXPIRED);

    const DROP: &str = "drop_received.deletes_the_row";
    s.store
        .drop_received(&key, "o2")
        .await
        .map_err(s.failed(DROP))?;
    let again = s.receive(DROP, &key, &d).await?;
    s.ensure(DROP, again, || {
        "a dropped (dead-lettered) row still made its redelivery a duplicate".to_owned()
    })?;
    done.passed.push(DROP);
    Ok(())
}

async fn ordered<S: InboxStore>(s: &Suite<'_, S>, done: &mut Conformance) -> Checked<()> {
    const RULE: &str = "claim_received.ordered_per_key";
    let (early, late) = (s.key("-2p-ordered"), s.key("-2p-ordered"));
    s.receive(RULE, &early, &s.delivery(91)).await?;
    s.receive(RULE, &late, &s.delivery(92)).await?;
    let group = early.group.as_str();
    let long = Duration::from_secs(30);
    let first = s
        .store
        .claim_received(&Suite::<S>::lease(group, "o1", long, &[SLOW]))
        .await;
    let first = first.map_err(s.failed(RULE))?;
    s.ensure(
        RULE,
        first
            .as_ref()
            .is_some_and(|r| r.key.event_id == early.event_id),
        || format!("the first claim of an ordered key took {first:?}, not offset 91"),
    )?;
    let second = s
        .store
        .claim_received(&Suite::<S>::lease(group, "o2", long, &[SLOW]))
        .await;
    let second = second.map_err(s.failed(RULE))?;
    s.ensure(RULE, second.is_none(), || {
        format!("a later row of an ordered key was claimed while an earlier one runs: {second:?}")
    })?;
    done.passed.push(RULE);
    Ok(())
}
