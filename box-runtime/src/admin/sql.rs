//! The statements of [`Admin`](super::Admin), rendered once from the table names for one
//! backend. They are written once, in what the three stores all accept (`count(CASE ..)`
//! rather than `count(*) FILTER (..)`, `$n` placeholders, double-quoted names), and run
//! through [`crate::db::sql`], which rewrites them for MySQL (`?`, each value bound where its
//! placeholder stands; backticks).

use crate::store::sql::{stmt, Stmt};
use crate::store::Tables;

/// How a backend writes times and ages.
#[derive(Clone, Copy)]
pub(super) struct Flavor {
    /// The current time, as stored in inoutbox's timestamp columns.
    now: &'static str,
    /// A time `secs` (an SQL expression) seconds before now.
    ago: fn(&str) -> String,
    /// The seconds since the time `expr`, as a double.
    age: fn(&str) -> String,
    /// The time `expr` as `YYYY-MM-DDTHH:MM:SSZ` text.
    text: fn(&str) -> String,
    /// The integer type of a `CAST`.
    int: &'static str,
    /// The statement with its double-quoted names quoted as the backend quotes them.
    names: fn(String) -> String,
}

pub(super) const POSTGRES: Flavor = Flavor {
    now: "now()",
    ago: |secs| format!("now() - make_interval(secs => {secs})"),
    age: |expr| format!("CAST(extract(epoch FROM now() - {expr}) AS float8)"),
    text: |expr| format!("to_char({expr} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"),
    int: "bigint",
    names: |sql| sql,
};

#[cfg(feature = "sqlite")]
pub(super) const SQLITE: Flavor = Flavor {
    now: "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    ago: |secs| format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%f seconds', {secs}))"),
    age: |expr| format!("((julianday('now') - julianday({expr})) * 86400.0)"),
    text: |expr| format!("strftime('%Y-%m-%dT%H:%M:%SZ', {expr})"),
    int: "bigint",
    names: |sql| sql,
};

/// Times are UTC `DATETIME(6)` (sqlx sets the session's time zone to `+00:00`).
#[cfg(feature = "mysql")]
pub(super) const MYSQL: Flavor = Flavor {
    now: crate::mysql::NOW,
    ago: |secs| format!("(NOW(6) - INTERVAL ROUND(({secs}) * 1000000) MICROSECOND)"),
    age: |expr| format!("(TIMESTAMPDIFF(MICROSECOND, {expr}, NOW(6)) / 1e6)"),
    text: |expr| format!("DATE_FORMAT({expr}, '%Y-%m-%dT%H:%i:%sZ')"),
    int: "SIGNED",
    // No statement here holds a string literal with a double quote (see `mysql::adapt`).
    names: |sql| sql.replace('"', "`"),
};

/// Rows of the parked-keys list at most.
pub(super) const PARKED_KEYS: u32 = 50;

#[derive(Debug)]
pub(super) struct AdminSql {
    pub(super) groups: Stmt,
    pub(super) outbox: Stmt,
    pub(super) parked_keys: Stmt,
    pub(super) list: Stmt,
    pub(super) by_id: Stmt,
    pub(super) discard: Stmt,
    pub(super) unpark: Stmt,
    pub(super) effects: Stmt,
}

impl AdminSql {
    pub(super) fn new(t: &Tables, f: Flavor) -> Self {
        let q = |sql: String| stmt((f.names)(sql));
        let letter_columns = letter_columns(f);
        let due = format!("(due_at IS NULL OR due_at <= {})", f.now);
        let int = f.int;
        Self {
            // Inbox rows and dead letters per group (a group may have either alone).
            groups: q(format!(
                "SELECT g, CAST(sum(n) AS {int}), CAST(sum(recent) AS {int}), \
                   CAST(sum(dead) AS {int}), CAST(sum(pending) AS {int}) FROM (\
                   SELECT consumer_group AS g, count(*) AS n, \
                     count(CASE WHEN processed_at >= {minute} THEN 1 END) AS recent, 0 AS dead, \
                     0 AS pending \
                   FROM {inbox} GROUP BY consumer_group \
                   UNION ALL \
                   SELECT consumer_group, 0, 0, count(*), count(CASE WHEN replayed_at IS NULL THEN 1 END) \
                   FROM {dead} GROUP BY consumer_group) AS s \
                 GROUP BY g ORDER BY g",
                minute = (f.ago)("60"),
                inbox = t.inbox,
                dead = t.dead_letters,
            )),
            // The fourth column: rows held behind a parked row of their key. Rows scheduled
            // for later (`due_at` ahead) are counted apart (the last column); a due scheduled
            // row's age runs from its due time.
            outbox: q(format!(
                "SELECT count(CASE WHEN parked_at IS NULL AND {due} THEN 1 END), \
                   {oldest}, count(CASE WHEN parked_at IS NOT NULL THEN 1 END), \
                   (SELECT count(*) FROM {outbox} h JOIN (\
                      SELECT topic, message_key, min(seq) AS first FROM {outbox} \
                      WHERE parked_at IS NOT NULL AND published_at IS NULL \
                        AND message_key IS NOT NULL GROUP BY topic, message_key) AS p \
                    ON h.topic = p.topic AND h.message_key = p.message_key AND h.seq > p.first \
                    WHERE h.published_at IS NULL AND h.parked_at IS NULL), \
                   count(CASE WHEN parked_at IS NULL AND NOT {due} THEN 1 END) \
                 FROM {outbox} WHERE published_at IS NULL",
                oldest = (f.age)(&format!(
                    "min(CASE WHEN parked_at IS NULL AND {due} THEN coalesce(due_at, created_at) END)"
                )),
                outbox = t.outbox,
            )),
            // The error of each parked key's latest parked row, and the rows it holds.
            parked_keys: q(format!(
                "SELECT p.topic, p.message_key, p.n, o.last_error, {parked}, \
                   (SELECT count(*) FROM {outbox} h WHERE h.topic = p.topic \
                      AND h.message_key = p.message_key AND h.seq > p.first \
                      AND h.published_at IS NULL AND h.parked_at IS NULL) FROM (\
                   SELECT topic, message_key, count(*) AS n, max(seq) AS last, min(seq) AS first \
                   FROM {outbox} WHERE parked_at IS NOT NULL AND published_at IS NULL \
                   GROUP BY topic, message_key) AS p \
                 JOIN {outbox} o ON o.seq = p.last \
                 ORDER BY p.n DESC, p.topic, p.message_key LIMIT {PARKED_KEYS}",
                parked = (f.text)("o.parked_at"),
                outbox = t.outbox,
            )),
            list: q(format!(
                "SELECT {letter_columns} FROM {dead} \
                 WHERE ($1 IS NULL OR consumer_group = $1) AND ($2 IS NULL OR event_type = $2) \
                   AND ($3 IS NULL OR dead_lettered_at >= {since}) \
                 ORDER BY id DESC LIMIT $4",
                dead = t.dead_letters,
                since = (f.ago)("$3"),
            )),
            by_id: q(format!(
                "SELECT {letter_columns} FROM {} WHERE id = $1",
                t.dead_letters
            )),
            discard: q(format!("DELETE FROM {} WHERE id = $1", t.dead_letters)),
            // Back to the retry path, due now, with a fresh count of attempts.
            unpark: q(format!(
                "UPDATE {outbox} SET parked_at = NULL, attempts = 0, next_attempt_at = {now} \
                 WHERE parked_at IS NOT NULL AND published_at IS NULL \
                   AND ($1 IS NULL OR message_key = $1) AND ($2 IS NULL OR topic = $2)",
                outbox = t.outbox,
                now = f.now,
            )),
            effects: effects(t, f),
        }
    }
}

/// The columns of a listed dead letter, its times as text.
fn letter_columns(f: Flavor) -> String {
    format!(
        "id, consumer_group, event_id, event_type, topic, \"partition\", \"offset\", attempts, \
         error, {} AS dead_lettered_at, {} AS replayed_at",
        (f.text)("dead_lettered_at"),
        (f.text)("replayed_at"),
    )
}

/// Every group's effects not done: pending, failed at least once, the oldest's age.
fn effects(t: &Tables, f: Flavor) -> Stmt {
    stmt((f.names)(format!(
        "SELECT consumer_group, count(*), count(CASE WHEN attempts > 0 THEN 1 END), {oldest} \
         FROM {effects} WHERE done_at IS NULL GROUP BY consumer_group ORDER BY consumer_group",
        oldest = (f.age)("min(created_at)"),
        effects = t.effects,
    )))
}
