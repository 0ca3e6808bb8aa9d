-- inoutbox migration (inbox, 2): dead letters deduplicated by (group, source, event id); sizes and
-- digests of payloads cut to the stored limit.
-- Names in braces are filled in from the configured table names (see store::migrate).
ALTER TABLE {dead_letters}
    ADD COLUMN IF NOT EXISTS times          integer NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS payload_size   bigint,
    ADD COLUMN IF NOT EXISTS payload_sha256 text;
UPDATE {dead_letters} SET source = '' WHERE source IS NULL;
-- Letters of one event written before this migration become one: the newest is kept.
DELETE FROM {dead_letters} d USING {dead_letters} n
    WHERE d.consumer_group = n.consumer_group AND d.source = n.source
      AND d.event_id = n.event_id AND d.id < n.id;
CREATE UNIQUE INDEX IF NOT EXISTS {dead_letters:event_idx}
    ON {dead_letters} (consumer_group, source, event_id) WHERE event_id IS NOT NULL;
