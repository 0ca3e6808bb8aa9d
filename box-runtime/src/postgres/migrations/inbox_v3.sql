-- inoutbox migration (inbox, 3): the two-phase inbox (rows stored as received, with the message,
-- and claimed by workers with leases) and the effects table drained after commit.
-- Names in braces are filled in from the configured table names (see store::migrate).
ALTER TABLE {inbox}
    ADD COLUMN IF NOT EXISTS message_key   bytea,
    ADD COLUMN IF NOT EXISTS header_names  text[],
    ADD COLUMN IF NOT EXISTS header_values bytea[],
    ADD COLUMN IF NOT EXISTS lease_owner   text,
    ADD COLUMN IF NOT EXISTS lease_until   timestamptz,
    ADD COLUMN IF NOT EXISTS claims        integer NOT NULL DEFAULT 0;
-- Workers claim the oldest received rows of their group.
CREATE INDEX IF NOT EXISTS {inbox:received_idx}
    ON {inbox} (consumer_group, received_at) WHERE processed_at IS NULL;
-- Per-key order: the earlier received rows of a key.
CREATE INDEX IF NOT EXISTS {inbox:received_key_idx}
    ON {inbox} (consumer_group, topic, "partition", message_key, "offset") WHERE processed_at IS NULL;
CREATE TABLE IF NOT EXISTS {effects} (
    id              bigserial   PRIMARY KEY,
    consumer_group  text        NOT NULL,
    source          text        NOT NULL,
    event_id        text        NOT NULL,
    kind            text        NOT NULL,
    idempotency_key text        NOT NULL,
    payload         bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    lease_owner     text,
    lease_until     timestamptz,
    done_at         timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS {effects:key_idx} ON {effects} (idempotency_key);
CREATE INDEX IF NOT EXISTS {effects:pending_idx} ON {effects} (id) WHERE done_at IS NULL;
