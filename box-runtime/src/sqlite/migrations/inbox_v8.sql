-- inoutbox migration (inbox, 8): two-phase handlers on SQLite, as PostgreSQL has them (its
-- inbox_v3): a message of a two-phase handler is stored as a received row (no `processed_at`,
-- its key, headers and payload kept in the columns of migration 6) and claimed by the group's
-- workers with a lease (`lease_owner`, `lease_until`, also of migration 6); `claims` counts the
-- claims of a row (more than one: a worker died or lost its lease on it).
-- Names in braces are filled in from the configured table names (see store::migrate).
ALTER TABLE {inbox} ADD COLUMN claims integer NOT NULL DEFAULT 0;
-- Workers claim the oldest received rows of their group.
CREATE INDEX IF NOT EXISTS {inbox:received_idx}
    ON {inbox} (consumer_group, received_at) WHERE processed_at IS NULL;
-- Per-key order: the earlier received rows of a key.
CREATE INDEX IF NOT EXISTS {inbox:received_key_idx}
    ON {inbox} (consumer_group, topic, "partition", message_key, "offset") WHERE processed_at IS NULL;
