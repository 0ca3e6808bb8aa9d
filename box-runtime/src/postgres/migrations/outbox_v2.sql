-- txbox migration (outbox, 2): relay slots and keyset reads.
-- Names in braces are filled in from the configured table names (see store::migrate).
--
-- * `slot`: the key's hash, 0..63 (`relay::postgres::SLOTS`); every row of one key has the same
--   slot, and a relay claims slots. A generated column, so rows inserted by any means get it.
--   Adding it rewrites the table under an exclusive lock: run this migration while the table
--   is small (e.g. after a retention purge).
-- * `next_attempt_at` is NULL for a row that never backed off, so fresh rows and rows waiting
--   for a retry sit in two partial indexes, and a key that backs off leaves the fresh index.
ALTER TABLE {outbox}
    ALTER COLUMN next_attempt_at DROP NOT NULL,
    ALTER COLUMN next_attempt_at DROP DEFAULT,
    ADD COLUMN IF NOT EXISTS slot smallint NOT NULL
        GENERATED ALWAYS AS ((hashtextextended(coalesce(message_key, id::text), 0) & 63)::smallint) STORED;
UPDATE {outbox} SET next_attempt_at = NULL
    WHERE published_at IS NULL AND parked_at IS NULL AND attempts = 0 AND next_attempt_at <= now();
-- Fresh rows in `seq` order, with the slot beside it: a read of a range of slots walks this
-- index in `seq` order and skips other slots' entries without visiting the table.
CREATE INDEX IF NOT EXISTS {outbox:fresh_idx} ON {outbox} (seq, slot)
    WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL;
CREATE INDEX IF NOT EXISTS {outbox:retry_idx} ON {outbox} (slot, seq)
    WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NOT NULL;
-- The v1 read indexes (seq order, per-key LATERAL) are no longer used; writers stop paying
-- for them. Dropped in the table's own schema.
DO $$
DECLARE s text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.oid = '{outbox}'::regclass);
BEGIN
    EXECUTE format('DROP INDEX IF EXISTS %I.%s', s, '{outbox:pending_idx}');
    EXECUTE format('DROP INDEX IF EXISTS %I.%s', s, '{outbox:pending_key_idx}');
END $$;
