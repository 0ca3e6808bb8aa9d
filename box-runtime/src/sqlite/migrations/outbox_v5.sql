-- inoutbox migration (outbox, 5): scheduled publishing (`enqueue_at`, `enqueue_after`).
-- Names in braces are filled in from the configured table names (see store::migrate).
--
-- `due_at` (inoutbox's timestamp text, like `created_at`): NULL for a row the relay publishes
-- as soon as it commits (every row written before this migration); otherwise the relay
-- publishes it once `due_at` has passed. A row not yet due does not hold the later rows of its
-- key. `scheduled_idx` finds when the next scheduled row is due.
ALTER TABLE {outbox} ADD COLUMN due_at text;
CREATE INDEX IF NOT EXISTS {outbox:scheduled_idx} ON {outbox} (due_at)
    WHERE due_at IS NOT NULL AND published_at IS NULL AND parked_at IS NULL;
