-- inoutbox migration (outbox, 5): scheduled publishing (`enqueue_at`, `enqueue_after`).
-- Names in braces are filled in from the configured table names (see store::migrate).
--
-- * `due_at`: NULL for a row the relay publishes as soon as it commits (every row written
--   before this migration, and every row enqueued with `enqueue`); otherwise the relay
--   publishes the row once `due_at <= now()`. A row not yet due does not hold the later rows of
--   its key; among due rows, each key's rows go out in `seq` order.
-- * `ready_idx` replaces v2's `fresh_idx` with one more condition, `due_at IS NULL`: the
--   relay's walk in `seq` order never passes over rows waiting for their time, however many.
--   Rows with a due time sit in `scheduled_idx`, by due time: the relay reads the due ones
--   from its front, and finds there when the next one is due.
ALTER TABLE {outbox} ADD COLUMN IF NOT EXISTS due_at timestamptz;
CREATE INDEX IF NOT EXISTS {outbox:ready_idx} ON {outbox} (seq, slot)
    WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL
      AND due_at IS NULL;
CREATE INDEX IF NOT EXISTS {outbox:scheduled_idx} ON {outbox} (due_at, slot)
    WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL
      AND due_at IS NOT NULL;
-- In the table's own schema: v2's fresh index, no longer read (writers stop paying for it).
DO $$
DECLARE s text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.oid = '{outbox}'::regclass);
BEGIN
    EXECUTE format('DROP INDEX IF EXISTS %I.%s', s, '{outbox:fresh_idx}');
END $$;
