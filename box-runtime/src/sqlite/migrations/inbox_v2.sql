-- inoutbox migration (inbox, 2): dead letters deduplicated by (group, source, event id); sizes and
-- digests of payloads cut to the stored limit.
-- Names in braces are filled in from the configured table names (see store::migrate).
ALTER TABLE {dead_letters} ADD COLUMN times integer NOT NULL DEFAULT 1;
ALTER TABLE {dead_letters} ADD COLUMN payload_size integer;
ALTER TABLE {dead_letters} ADD COLUMN payload_sha256 text;
UPDATE {dead_letters} SET source = '' WHERE source IS NULL;
-- Letters of one event written before this migration become one: the newest is kept.
DELETE FROM {dead_letters} WHERE event_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM {dead_letters} n
    WHERE n.consumer_group = {dead_letters}.consumer_group AND n.source = {dead_letters}.source
      AND n.event_id = {dead_letters}.event_id AND n.id > {dead_letters}.id);
CREATE UNIQUE INDEX IF NOT EXISTS {dead_letters:event_idx}
    ON {dead_letters} (consumer_group, source, event_id) WHERE event_id IS NOT NULL;
