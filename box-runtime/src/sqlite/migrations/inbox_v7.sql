-- inoutbox migration (inbox, 7): effects after commit on SQLite, as PostgreSQL keeps them
-- (its inbox_v3 and inbox_v7): a handler schedules an effect in its transaction; the consumer's
-- drain claims it with a lease (owner and expiry), runs its executor with no transaction open,
-- and marks it done or records the failed run; the retention task purges done effects, oldest
-- first. Timestamps are text in inoutbox's format, as in every SQLite table.
-- Names in braces are filled in from the configured table names (see store::migrate).
CREATE TABLE IF NOT EXISTS {effects} (
    id              integer PRIMARY KEY AUTOINCREMENT,
    consumer_group  text    NOT NULL,
    source          text    NOT NULL,
    event_id        text    NOT NULL,
    kind            text    NOT NULL,
    idempotency_key text    NOT NULL,
    payload         blob    NOT NULL,
    created_at      text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    lease_owner     text,
    lease_until     text,
    done_at         text
);
CREATE UNIQUE INDEX IF NOT EXISTS {effects:key_idx} ON {effects} (idempotency_key);
-- The drain claims a group's effects not done, oldest first.
CREATE INDEX IF NOT EXISTS {effects:pending_idx} ON {effects} (consumer_group, id) WHERE done_at IS NULL;
CREATE INDEX IF NOT EXISTS {effects:done_idx} ON {effects} (done_at) WHERE done_at IS NOT NULL;
