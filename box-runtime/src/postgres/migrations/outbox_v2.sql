-- inoutbox migration (outbox, 2): relay slots and the indexes relays read.
-- Names in braces are filled in from the configured table names (see store::migrate).
--
-- * `slot`: the key's hash, 0..63 (`postgres::relay::SLOTS`); every row of one key has the same
--   slot, and relays claim slots. `enqueue` computes it in its INSERT (the same expression as
--   below, `postgres::outbox::slot_expr`); rows inserted by other means get it from a trigger.
--   (Not a generated column: PostgreSQL 15 re-reads a generation expression at every INSERT,
--   which cost writers more than the rest of the row.) Rows published before this migration
--   keep a NULL slot: they are never read again.
-- * `next_attempt_at` is NULL for a row that never failed, so fresh rows and rows waiting for a
--   retry sit in two partial indexes.
ALTER TABLE {outbox}
    ALTER COLUMN next_attempt_at DROP NOT NULL,
    ALTER COLUMN next_attempt_at DROP DEFAULT,
    ADD COLUMN IF NOT EXISTS slot smallint;
UPDATE {outbox}
    SET slot = (hashtextextended(coalesce(message_key, id::text), 0) & 63)::int2,
        next_attempt_at = CASE WHEN attempts = 0 AND next_attempt_at <= now() THEN NULL
                               ELSE next_attempt_at END
    WHERE published_at IS NULL;
-- Fresh rows in `seq` order, with the slot beside it: a read of a range of slots walks this
-- index in `seq` order and skips other slots' entries without visiting the table.
CREATE INDEX IF NOT EXISTS {outbox:fresh_idx} ON {outbox} (seq, slot)
    WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL;
CREATE INDEX IF NOT EXISTS {outbox:retry_idx} ON {outbox} (slot, seq)
    WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NOT NULL;
-- In the table's own schema: the slot trigger, and the v1 read indexes dropped (seq order,
-- per-key LATERAL: no longer read, so writers stop paying for them).
DO $$
DECLARE s text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.oid = '{outbox}'::regclass);
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION %I.%s() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN '
        'NEW.slot := (hashtextextended(coalesce(NEW.message_key, NEW.id::text), 0) & 63)::int2; '
        'RETURN NEW; END $f$', s, '{outbox:slot}');
    IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{outbox}'::regclass
                   AND tgname = btrim('{outbox:slot}', '"')) THEN
        EXECUTE format('CREATE TRIGGER %s BEFORE INSERT ON {outbox} FOR EACH ROW '
                       'WHEN (NEW.slot IS NULL) EXECUTE FUNCTION %I.%s()',
                       '{outbox:slot}', s, '{outbox:slot}');
    END IF;
    EXECUTE format('DROP INDEX IF EXISTS %I.%s', s, '{outbox:pending_idx}');
    EXECUTE format('DROP INDEX IF EXISTS %I.%s', s, '{outbox:pending_key_idx}');
END $$;
