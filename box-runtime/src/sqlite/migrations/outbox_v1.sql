-- inoutbox migration (outbox, 1): outbox table and relay key leases
-- Names in braces are filled in from the configured table names (see store::migrate).
CREATE TABLE IF NOT EXISTS {outbox} (
    seq             integer PRIMARY KEY AUTOINCREMENT,
    id              text    NOT NULL UNIQUE,
    aggregatetype   text,
    aggregateid     text,
    type            text    NOT NULL,
    topic           text    NOT NULL,
    message_key     text,
    payload         text    NOT NULL,
    headers         text    NOT NULL DEFAULT '{}',
    created_at      text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    published_at    text,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    parked_at       text
);
CREATE INDEX IF NOT EXISTS {outbox:pending_idx} ON {outbox} (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS {outbox:pending_key_idx} ON {outbox} (topic, message_key, seq)
    WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS {outbox:published_idx} ON {outbox} (published_at)
    WHERE published_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {outbox:relay_locks} (
    topic      text NOT NULL,
    lock_key   text NOT NULL,
    owner      text NOT NULL,
    expires_at text NOT NULL,
    PRIMARY KEY (topic, lock_key)
);
