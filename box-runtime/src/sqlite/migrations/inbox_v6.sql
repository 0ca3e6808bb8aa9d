-- inoutbox migration (inbox, 6): deferred messages. A handler may answer "not yet, again in
-- 30 s": the message is kept as an unprocessed inbox row with its due time, key, headers and
-- payload; a worker of the consumer claims it when due (a lease: owner and time) and runs its
-- handler again. `deferrals` counts how often it was deferred, for the limit after which it is
-- dead-lettered.
-- Names in braces are filled in from the configured table names (see store::migrate).
ALTER TABLE {inbox} ADD COLUMN message_key blob;
ALTER TABLE {inbox} ADD COLUMN headers text;
ALTER TABLE {inbox} ADD COLUMN lease_owner text;
ALTER TABLE {inbox} ADD COLUMN lease_until text;
ALTER TABLE {inbox} ADD COLUMN due_at text;
ALTER TABLE {inbox} ADD COLUMN deferrals integer NOT NULL DEFAULT 0;
-- Workers claim the group's due rows, earliest first.
CREATE INDEX IF NOT EXISTS {inbox:due_idx}
    ON {inbox} (consumer_group, due_at) WHERE processed_at IS NULL AND due_at IS NOT NULL;
