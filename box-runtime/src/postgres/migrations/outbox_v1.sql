-- inoutbox migration (outbox, 1): outbox table
-- Names in braces are filled in from the configured table names (see store::migrate).
CREATE TABLE IF NOT EXISTS {outbox} (
    id              uuid        PRIMARY KEY,
    seq             bigserial   NOT NULL,
    aggregatetype   text,
    aggregateid     text,
    type            text        NOT NULL,
    topic           text        NOT NULL,
    message_key     text,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    parked_at       timestamptz
);
CREATE INDEX IF NOT EXISTS {outbox:pending_idx} ON {outbox} (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS {outbox:pending_key_idx} ON {outbox} (topic, message_key, seq)
    WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS {outbox:published_idx} ON {outbox} (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {outbox:parked_idx} ON {outbox} (parked_at)
    WHERE parked_at IS NOT NULL;
