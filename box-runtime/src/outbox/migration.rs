//! The outbox table, shipped as migration `("outbox", 1)` of
//! [`migrate`](crate::store::postgres::migrate).

use crate::store::Tables;

/// The SQL of migration `("outbox", 1)`: the outbox table and the indexes the relay and the
/// retention job use. Column names follow the Debezium outbox event router (see
/// [`crate::outbox`]).
pub fn outbox_v1(t: &Tables) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {outbox} (
    id              uuid        PRIMARY KEY,
    seq             bigserial   NOT NULL,
    aggregatetype   text,
    aggregateid     text,
    type            text        NOT NULL,
    topic           text        NOT NULL,
    message_key     text,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{{}}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    parked_at       timestamptz
);
CREATE INDEX IF NOT EXISTS {pending} ON {outbox} (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS {pending_key} ON {outbox} (topic, message_key, seq)
    WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS {published} ON {outbox} (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {parked} ON {outbox} (parked_at)
    WHERE parked_at IS NOT NULL;
"#,
        outbox = t.outbox,
        pending = t.outbox.derived("pending_idx"),
        pending_key = t.outbox.derived("pending_key_idx"),
        published = t.outbox.derived("published_idx"),
        parked = t.outbox.derived("parked_idx"),
    )
}
