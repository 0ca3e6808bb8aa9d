//! The PostgreSQL backend: the inbox store ([`PgStore`]), the outbox writer, the relay store
//! and the migrations, all in this one room.

use std::sync::Arc;

use sqlx::postgres::PgPool;

use crate::store::migrate::{self, Migration, Migrator};
use crate::store::sql::{stmt, Dialect, InboxSql, Shared, Stmt};
use crate::store::{StoreError, Tables, OWNED};

mod deferred;
mod effects;
mod inbox;
mod legacy;
pub(crate) mod outbox;
mod partitions;
pub(crate) mod relay;
mod two_phase;
mod tx;

pub use outbox::Outbox as PgOutbox;
pub use partitions::{DailyPartitions, PartitionChanges, Retire};
pub use relay::PgRelayStore;
pub use tx::PgTx;

/// The migrations this backend ships, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        component: "inbox",
        version: 1,
        description: "inbox, attempts and dead-letter tables",
        sql: include_str!("migrations/inbox_v1.sql"),
    },
    Migration {
        component: "outbox",
        version: 1,
        description: "outbox table",
        sql: include_str!("migrations/outbox_v1.sql"),
    },
    Migration {
        component: "inbox",
        version: 2,
        description: "dead letters deduplicated by event, payload size and digest",
        sql: include_str!("migrations/inbox_v2.sql"),
    },
    Migration {
        component: "outbox",
        version: 2,
        description: "relay slots, fresh and retry indexes",
        sql: include_str!("migrations/outbox_v2.sql"),
    },
    Migration {
        component: "inbox",
        version: 3,
        description: "two-phase inbox (received rows, leases) and effects after commit",
        sql: include_str!("migrations/inbox_v3.sql"),
    },
    Migration {
        component: "outbox",
        version: 3,
        description: "payload stored as json: the exact bytes the producer serialised",
        sql: include_str!("migrations/outbox_v3.sql"),
    },
    Migration {
        component: "inbox",
        version: 4,
        description: "business keys: a second unique key per group",
        sql: include_str!("migrations/inbox_v4.sql"),
    },
    Migration {
        component: "outbox",
        version: 4,
        description: "per-key order taken at commit (key locks in ascending order): no deadlock",
        sql: include_str!("migrations/outbox_v4.sql"),
    },
    Migration {
        component: "inbox",
        version: 5,
        description: "business keys scoped by event type (or a shared dedup_scope)",
        sql: include_str!("migrations/inbox_v5.sql"),
    },
    Migration {
        component: "outbox",
        version: 5,
        description: "scheduled publishing: a due time per row, ready and scheduled indexes",
        sql: include_str!("migrations/outbox_v5.sql"),
    },
    Migration {
        component: "outbox",
        version: 6,
        description: "the commit trigger's UPDATE planned once per session, not per row",
        sql: outbox::ORDER_FUNCTION,
    },
    Migration {
        component: "inbox",
        version: 6,
        description: "deferred messages: due time and deferral count (kept message and lease)",
        sql: include_str!("migrations/inbox_v6.sql"),
    },
    Migration {
        component: "inbox",
        version: 7,
        description: "done effects purged by the retention task, oldest first",
        sql: include_str!("migrations/inbox_v7.sql"),
    },
];

const DIALECT: Dialect = Dialect {
    now: "now()",
    ago: |secs| format!("now() - make_interval(secs => {secs})"),
    row_id: "ctid",
    json_strings: |array| format!("SELECT json_array_elements_text({array}::json)"),
};

struct Postgres;

impl Migrator for Postgres {
    type Db = sqlx::Postgres;
    const MIGRATIONS: &'static [Migration] = MIGRATIONS;

    fn begin(tables: &Tables) -> Vec<String> {
        // Concurrent migrators wait for each other on a transaction-level advisory lock.
        let mut statements = vec![
            "BEGIN".to_owned(),
            format!(
                "SELECT pg_advisory_xact_lock(hashtext('{}{}'))",
                crate::store::legacy::LOCK_NAMESPACE,
                tables.migrations.name().as_str()
            ),
        ];
        statements.extend(legacy::lock_old_migrator(tables));
        if let Some(schema) = tables.schema() {
            statements.push(format!("CREATE SCHEMA IF NOT EXISTS {schema}"));
        }
        statements
    }

    fn migrations_table(tables: &Tables) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (component text NOT NULL, version integer NOT NULL, \
             description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (component, version))",
            tables.migrations
        )
    }

    async fn rename_legacy(
        conn: &mut sqlx::PgConnection,
        tables: &Tables,
    ) -> Result<Vec<(String, String)>, StoreError> {
        legacy::rename(conn, tables).await
    }
}

/// The statements of the PostgreSQL inbox store, rendered once from the table names.
#[derive(Debug)]
struct Statements {
    shared: InboxSql,
    claim: Stmt,
    claim_batch: Stmt,
    /// The partitioned inbox: the advisory locks a claim takes on its keys first.
    lock_keys: Stmt,
    release_claims: Stmt,
    dead_letter: Stmt,
    load_dead_letter: Stmt,
    two_phase: TwoPhaseSql,
    deferred: DeferredSql,
}

impl Statements {
    fn new(t: &Tables, partitioned: bool) -> Self {
        let not_elsewhere = not_elsewhere(t, partitioned);
        Self {
            lock_keys: stmt(lock_keys_sql(t)),
            shared: InboxSql::new(t, DIALECT),
            two_phase: TwoPhaseSql::new(t),
            deferred: DeferredSql::new(t),
            // Rows are inserted in key order, so that two transactions claiming overlapping
            // batches take the unique-index locks in one order (no deadlock); the answer comes
            // back in the batch's order.
            release_claims: stmt(format!(
                "DELETE FROM {inbox} WHERE consumer_group = $1 AND (source, event_id) IN \
                 (SELECT * FROM unnest($2::text[], $3::text[]))",
                inbox = t.inbox
            )),
            claim_batch: stmt(format!(
                "WITH input AS (\
                   SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::int4[], $6::int8[], $8::text[]) \
                   WITH ORDINALITY AS i(source, event_id, event_type, part, off, bkey, ord)), \
                 ins AS (\
                   INSERT INTO {inbox} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", processed_at, business_key) \
                   SELECT $1, source, event_id, event_type, $7, part, off, now(), bkey FROM input i {not_elsewhere}ORDER BY source, event_id \
                   ON CONFLICT DO NOTHING RETURNING source, event_id) \
                 SELECT ins.event_id IS NOT NULL AS inserted, COALESCE(a.attempts, 0) AS attempts, \
                   CASE WHEN ins.event_id IS NULL AND i.bkey IS NOT NULL THEN EXISTS (\
                     SELECT 1 FROM {inbox} k WHERE k.consumer_group = $1 AND k.source = i.source \
                     AND k.event_id = i.event_id) END AS known \
                 FROM input i \
                 LEFT JOIN ins ON ins.source = i.source AND ins.event_id = i.event_id \
                 LEFT JOIN {attempts} a ON a.consumer_group = $1 AND a.source = i.source AND a.event_id = i.event_id \
                 ORDER BY i.ord",
                inbox = t.inbox,
                attempts = t.attempts
            )),
            claim: stmt(format!(
                "WITH ins AS (\
                   INSERT INTO {inbox} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", processed_at) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, now()) ON CONFLICT DO NOTHING RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM ins) AS inserted, \
                   COALESCE((SELECT attempts FROM {attempts} \
                             WHERE consumer_group = $1 AND source = $2 AND event_id = $3), 0) AS attempts",
                inbox = t.inbox,
                attempts = t.attempts
            )),
            // One letter per (group, source, event id): a redelivered or replayed message that
            // fails again updates its letter.
            dead_letter: stmt(format!(
                "INSERT INTO {dead} AS d (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", \
                   message_key, header_names, header_values, payload, error, attempts, first_failed_at, last_failed_at, \
                   payload_size, payload_sha256) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
                   COALESCE(a.first_failed_at, now()), now(), $14, $15 \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN {attempts} a ON a.consumer_group = $1 AND a.source = $2 AND a.event_id = $3 \
                 ON CONFLICT (consumer_group, source, event_id) WHERE event_id IS NOT NULL DO UPDATE SET \
                   event_type = EXCLUDED.event_type, topic = EXCLUDED.topic, \"partition\" = EXCLUDED.\"partition\", \
                   \"offset\" = EXCLUDED.\"offset\", message_key = EXCLUDED.message_key, \
                   header_names = EXCLUDED.header_names, header_values = EXCLUDED.header_values, \
                   payload = EXCLUDED.payload, payload_size = EXCLUDED.payload_size, \
                   payload_sha256 = EXCLUDED.payload_sha256, error = EXCLUDED.error, \
                   attempts = d.attempts + EXCLUDED.attempts, last_failed_at = now(), \
                   dead_lettered_at = now(), times = d.times + 1, replayed_at = NULL \
                 RETURNING id",
                dead = t.dead_letters,
                attempts = t.attempts
            )),
            load_dead_letter: stmt(format!(
                "SELECT id, consumer_group, event_id, event_type, topic, \"partition\", \"offset\", message_key, \
                   header_names, header_values, payload, error, attempts, replayed_at IS NOT NULL AS replayed \
                 FROM {} WHERE consumer_group = $1 AND id = $2",
                t.dead_letters
            )),
        }
    }
}

/// The statement locking a claim's keys: every key text of `$1`, in one order (no deadlock).
fn lock_keys_sql(t: &Tables) -> String {
    format!(
        "SELECT pg_advisory_xact_lock(hashtext('{}{}'), k) \
         FROM (SELECT DISTINCT hashtext(k) AS k FROM unnest($1::text[]) AS u(k) ORDER BY 1) AS s",
        crate::store::legacy::LOCK_NAMESPACE,
        t.inbox.name().as_str()
    )
}

/// The statements of the two-phase inbox and the effects table (`two_phase.rs`), rendered
/// once from the table names.
#[derive(Debug)]
struct TwoPhaseSql {
    receive: Stmt,
    claim: Stmt,
    renew: Stmt,
    release: Stmt,
    drop_row: Stmt,
    check: Stmt,
    finish: Stmt,
    pub(super) count_stuck: Stmt,
    claim_effects: Stmt,
    effect_done: Stmt,
    effect_failed: Stmt,
}

impl TwoPhaseSql {
    pub(super) fn new(t: &Tables) -> Self {
        let (inbox, attempts, effects) = (&t.inbox, &t.attempts, &t.effects);
        Self {
            receive: stmt(format!(
                "INSERT INTO {inbox} (consumer_group, source, event_id, event_type, topic, \"partition\", \
                   \"offset\", message_key, header_names, header_values, payload) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING RETURNING 1"
            )),
            // The oldest received row of the group whose lease is free or expired; rows other
            // workers are claiming right now are skipped, not waited for. A row of an ordered
            // handler waits while an earlier row of its key is unprocessed.
            claim: stmt(format!(
                "UPDATE {inbox} AS i SET lease_owner = $2, lease_until = now() + make_interval(secs => $3), \
                   claims = i.claims + 1 \
                 FROM (SELECT c.consumer_group, c.source, c.event_id FROM {inbox} c \
                   WHERE c.consumer_group = $1 AND c.processed_at IS NULL AND c.event_type = ANY($4) \
                     AND c.due_at IS NULL AND (c.lease_until IS NULL OR c.lease_until < now()) \
                     AND (NOT (c.event_type = ANY($5)) OR NOT EXISTS (SELECT 1 FROM {inbox} o \
                       WHERE o.consumer_group = c.consumer_group AND o.processed_at IS NULL \
                         AND o.due_at IS NULL \
                         AND o.topic = c.topic AND o.\"partition\" = c.\"partition\" \
                         AND o.message_key = c.message_key AND o.\"offset\" < c.\"offset\")) \
                   ORDER BY c.received_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS pick \
                 WHERE i.consumer_group = pick.consumer_group AND i.source = pick.source \
                   AND i.event_id = pick.event_id \
                 RETURNING i.source, i.event_id, i.topic, i.\"partition\", i.\"offset\", i.message_key, \
                   i.header_names, i.header_values, i.payload"
            )),
            renew: stmt(format!(
                "UPDATE {inbox} SET lease_until = now() + make_interval(secs => $5) WHERE {OWNED} RETURNING 1"
            )),
            release: stmt(format!(
                "UPDATE {inbox} SET lease_owner = NULL, lease_until = NULL WHERE {OWNED}"
            )),
            drop_row: stmt(format!("DELETE FROM {inbox} WHERE {OWNED}")),
            // The row stays locked by the handler's transaction until it ends: a claim (`FOR
            // UPDATE SKIP LOCKED`) skips it even once the lease expired, so no second worker
            // runs the handler while this one does. `KEY SHARE` leaves the lease's renewal (an
            // update of non-key columns) free to go on beside it.
            check: stmt(format!(
                "SELECT COALESCE((SELECT a.attempts FROM {attempts} a WHERE a.consumer_group = $1 \
                   AND a.source = $2 AND a.event_id = $3), 0) AS attempts \
                 FROM {inbox} WHERE {OWNED} FOR KEY SHARE"
            )),
            finish: stmt(format!(
                "UPDATE {inbox} SET processed_at = now(), lease_owner = NULL, lease_until = NULL \
                 WHERE {OWNED} RETURNING 1"
            )),
            // Received and not processed for longer than $1, and not held by a live claim, or
            // claimed more than once (claims that keep failing or dying).
            count_stuck: stmt(format!(
                "SELECT count(*) FROM {inbox} i WHERE i.processed_at IS NULL \
                   AND i.received_at < now() - make_interval(secs => $1) \
                   AND (i.due_at IS NULL OR i.due_at < now() - make_interval(secs => $1)) \
                   AND (i.lease_until IS NULL OR i.lease_until < now() OR i.claims > 1 \
                     OR EXISTS (SELECT 1 FROM {attempts} a WHERE a.consumer_group = i.consumer_group \
                       AND a.source = i.source AND a.event_id = i.event_id))"
            )),
            // The group's own effects only: a database shared by several services holds
            // effects whose executors only their own consumers have.
            claim_effects: stmt(format!(
                "UPDATE {effects} AS e SET lease_owner = $1, lease_until = now() + make_interval(secs => $2) \
                 FROM (SELECT id FROM {effects} WHERE consumer_group = $4 AND done_at IS NULL \
                   AND (lease_until IS NULL OR lease_until < now()) \
                   ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) AS pick \
                 WHERE e.id = pick.id \
                 RETURNING e.id, e.consumer_group, e.event_id, e.kind, e.idempotency_key, e.payload, e.attempts"
            )),
            effect_done: stmt(format!(
                "UPDATE {effects} SET done_at = now(), lease_owner = NULL, lease_until = NULL \
                 WHERE id = $1 AND lease_owner = $2"
            )),
            effect_failed: stmt(format!(
                "UPDATE {effects} SET attempts = attempts + 1, last_error = $3, \
                   lease_until = now() + make_interval(secs => $4) WHERE id = $1 AND lease_owner = $2"
            )),
        }
    }
}

/// The statements of deferred messages, rendered once from the table names.
#[derive(Debug)]
pub(super) struct DeferredSql {
    pub(super) defer: Stmt,
    pub(super) claim: Stmt,
    pub(super) count: Stmt,
}

impl DeferredSql {
    fn new(t: &Tables) -> Self {
        let inbox = &t.inbox;
        Self {
            // The row is held by the caller's transaction (its claim inserted it, or its lease
            // check locked it).
            defer: stmt(format!(
                "UPDATE {inbox} SET processed_at = NULL, due_at = now() + make_interval(secs => $4), \
                   deferrals = deferrals + 1, lease_owner = NULL, lease_until = NULL, \
                   message_key = $5, header_names = $6, header_values = $7, payload = $8 \
                 WHERE consumer_group = $1 AND source = $2 AND event_id = $3 RETURNING deferrals"
            )),
            // The group's earliest due row whose lease is free or expired; rows other workers
            // are claiming, or whose handler's transaction holds them, are skipped.
            claim: stmt(format!(
                "UPDATE {inbox} AS i SET lease_owner = $2, lease_until = now() + make_interval(secs => $3), \
                   claims = i.claims + 1 \
                 FROM (SELECT c.consumer_group, c.source, c.event_id FROM {inbox} c \
                   WHERE c.consumer_group = $1 AND c.processed_at IS NULL AND c.due_at <= now() \
                     AND (c.lease_until IS NULL OR c.lease_until < now()) \
                   ORDER BY c.due_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS pick \
                 WHERE i.consumer_group = pick.consumer_group AND i.source = pick.source \
                   AND i.event_id = pick.event_id \
                 RETURNING i.source, i.event_id, i.business_key, i.topic, i.\"partition\", i.\"offset\", \
                   i.message_key, i.header_names, i.header_values, i.payload"
            )),
            count: stmt(format!(
                "SELECT count(*) FROM {inbox} \
                 WHERE consumer_group = $1 AND processed_at IS NULL AND due_at IS NOT NULL"
            )),
        }
    }
}

/// The condition of the batch claim's insert: nothing, or, on the partitioned inbox (whose
/// unique keys hold the day), that no partition holds the event id or the business key (the
/// claim locked both first, see `partitions`).
fn not_elsewhere(t: &Tables, partitioned: bool) -> String {
    if !partitioned {
        return String::new();
    }
    format!(
        "WHERE NOT EXISTS (SELECT 1 FROM {inbox} o WHERE o.consumer_group = $1 \
           AND o.source = i.source AND o.event_id = i.event_id) \
         AND (i.bkey IS NULL OR NOT EXISTS (SELECT 1 FROM {inbox} o \
           WHERE o.consumer_group = $1 AND o.business_key = i.bkey)) ",
        inbox = t.inbox
    )
}

/// Session settings [`PgStore::connect`] asks the server for, where nothing else set them.
const SESSION_DEFAULTS: &[(&str, &str)] = &[
    ("idle_in_transaction_session_timeout", "30s"),
    ("idle_session_timeout", "60s"),
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "30000"),
];

/// Idle pooled connections are closed after this, before `idle_session_timeout` ends them
/// (sqlx's reaper may take up to twice as long).
const POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(25);

/// The [`SESSION_DEFAULTS`] to send: those the server knows and nobody configured (not the
/// server, role or database configuration, not the URL's `options`: `source = 'default'`).
async fn session_defaults(
    target: &sqlx::postgres::PgConnectOptions,
) -> Result<Vec<(&'static str, &'static str)>, sqlx::Error> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect_with(target).await?;
    let names: Vec<&str> = SESSION_DEFAULTS.iter().map(|(name, _)| *name).collect();
    let unset: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM pg_settings WHERE name = ANY($1) AND source = 'default'",
    )
    .bind(&names)
    .fetch_all(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(SESSION_DEFAULTS
        .iter()
        .filter(|(name, _)| unset.iter().any(|u| u == name))
        .copied()
        .collect())
}

/// Whether the session settings sent with `defaults` are in force on a pooled connection (a
/// pooler may drop startup options silently).
async fn applied(pool: &sqlx::PgPool, defaults: &[(&str, &str)]) -> bool {
    let names: Vec<&str> = defaults.iter().map(|(name, _)| *name).collect();
    sqlx::query_scalar::<_, bool>(
        "SELECT count(*) > 0 FROM pg_settings WHERE name = ANY($1) AND source = 'client'",
    )
    .bind(&names)
    .fetch_one(pool)
    .await
    .unwrap_or(true)
}

/// Whether connecting failed because startup options are refused: PgBouncer answers
/// `08P01 unsupported startup parameter`.
fn refuses_startup_options(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("08P01"))
}

/// The PostgreSQL store of the inbox: inbox rows, attempt counts and dead letters.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    tables: Tables,
    sql: Arc<Statements>,
    partitions: Option<DailyPartitions>,
}

impl PgStore {
    /// A store on `pool` with the default table names.
    pub fn new(pool: PgPool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://` or `postgresql://`) with a
    /// pool of up to `max_connections`, failing within [`CONNECT_TIMEOUT`] with the target
    /// (password hidden) and the cause. Waiting for a pooled connection is bounded the same way.
    ///
    /// Each session asks the server to end it when the other side is gone, so that a consumer
    /// or relay cut off by a partition or a half-open connection neither holds its
    /// transaction, row locks and key locks for ever nor waits for ever for an answer that was
    /// lost (see `docs/deployment.md`):
    ///
    /// | setting | value | why |
    /// | --- | --- | --- |
    /// | `idle_in_transaction_session_timeout` | 30 s | a transaction whose client went silent is rolled back and its locks released |
    /// | `idle_session_timeout` (PostgreSQL 14+) | 60 s | a session whose client went silent (a relay's key locks, a lost `COMMIT` answer) is closed; longer than a relay's longest batch |
    /// | `tcp_keepalives_idle` / `_interval` / `_count` | 10 s / 5 s / 3 | the server notices a client host that vanished within about 25 s |
    /// | `tcp_user_timeout` (PostgreSQL 12+) | 30 s | the same while the server has data in flight to it |
    ///
    /// A setting is only sent where nothing else set it: not in the URL's `options`, not in the
    /// server's, role's or database's configuration, and known to the server. Idle pooled
    /// connections are closed after 25 s, before the server would end them. Behind a pooler
    /// that refuses startup options (PgBouncer without `ignore_startup_parameters = options`)
    /// it connects without them and says so in a warning; set them on the server then.
    ///
    /// [`CONNECT_TIMEOUT`]: crate::store::CONNECT_TIMEOUT
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        use crate::store::{bounded, check_scheme, redact_url, CONNECT_TIMEOUT};
        use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
        check_scheme(url, &["postgres", "postgresql"], "PgStore")?;
        let target: PgConnectOptions = url.parse().map_err(|source| StoreError::Connect {
            target: redact_url(url),
            source,
        })?;
        let defaults = bounded(url, session_defaults(&target)).await?;
        let pool = || {
            PgPoolOptions::new()
                .max_connections(max_connections.max(1))
                .acquire_timeout(CONNECT_TIMEOUT)
                .idle_timeout(POOL_IDLE_TIMEOUT)
                // No ping before each acquire: a broken connection fails its first statement,
                // which the engine treats as an outage, so a ping would only add a round trip.
                .test_before_acquire(false)
                .after_release(crate::store::release_ping)
        };
        let with_defaults = target.clone().options(defaults.iter().copied());
        let pool = match bounded(url, pool().connect_with(with_defaults)).await {
            Err(StoreError::Connect { source, .. })
                if !defaults.is_empty() && refuses_startup_options(&source) =>
            {
                tracing::warn!(target: "inoutbox::postgres", target = %redact_url(url), error = %source,
                    "the server or pooler refuses startup options: connected without inoutbox's \
                     session timeouts and keepalives; set them on the server (docs/deployment.md)");
                bounded(url, pool().connect_with(target)).await?
            }
            pool => {
                let pool = pool?;
                if !defaults.is_empty() && !applied(&pool, &defaults).await {
                    tracing::warn!(target: "inoutbox::postgres", target = %redact_url(url),
                        "the server or pooler ignored startup options (PgBouncer's \
                         `ignore_startup_parameters = options`?): inoutbox's session timeouts and \
                         keepalives are not in force; set them on the server (docs/deployment.md)");
                }
                pool
            }
        };
        Ok(Self::new(pool))
    }

    /// A store on `pool` with the given table names.
    pub fn with_tables(pool: PgPool, tables: Tables) -> Self {
        let sql = Arc::new(Statements::new(&tables, false));
        Self {
            pool,
            tables,
            sql,
            partitions: None,
        }
    }

    /// The same store with its inbox table partitioned by the day rows are received (UTC), on
    /// PostgreSQL's declarative partitioning: retention then drops (or detaches) a whole day at
    /// a time instead of deleting rows (see [`maintain_partitions`](Self::maintain_partitions)
    /// and `docs/modes.md`).
    ///
    /// [`migrate`](Self::migrate) turns the inbox table into a partitioned one (moving its rows)
    /// and creates the partitions of today and the `ahead` days after it. Deduplication holds
    /// across partitions: a claim looks the event id (and business key) up in every partition,
    /// under a transaction-level advisory lock on the key, so an event received before
    /// midnight and redelivered after it is still a duplicate. The window rule: an event whose
    /// partition was dropped is processed again if it comes back.
    pub fn partitioned_by_day(mut self, layout: DailyPartitions) -> Self {
        self.sql = Arc::new(Statements::new(&self.tables, true));
        self.partitions = Some(layout);
        self
    }

    /// The partition layout, when the inbox is partitioned.
    pub fn partitions(&self) -> Option<&DailyPartitions> {
        self.partitions.as_ref()
    }

    /// Applies inoutbox's migrations (inbox and outbox tables): idempotent, and safe to call from
    /// several processes at once (they serialise on an advisory lock).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        migrate::migrate::<Postgres>(&mut conn, &self.tables).await?;
        drop(conn);
        if self.partitions.is_some() {
            self.partition_inbox().await?;
            self.maintain_partitions(None).await?;
        }
        Ok(())
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table names.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    fn shared(&self) -> Shared<'_, sqlx::Postgres> {
        Shared {
            pool: &self.pool,
            sql: &self.sql.shared,
        }
    }
}
