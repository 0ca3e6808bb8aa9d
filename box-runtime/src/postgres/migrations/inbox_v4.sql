-- inoutbox migration (inbox, 4): business keys. An inbox row may hold the business key of its
-- event (an operation id from the payload: `idempotency_key` on the event or `dedup_by` on the
-- handler); a second event with the same business key in the same group is refused like a
-- redelivery (the claim's `ON CONFLICT DO NOTHING` meets this index).
-- Names in braces are filled in from the configured table names (see store::migrate).
ALTER TABLE {inbox} ADD COLUMN IF NOT EXISTS business_key text;
CREATE UNIQUE INDEX IF NOT EXISTS {inbox:business_key_idx}
    ON {inbox} (consumer_group, business_key) WHERE business_key IS NOT NULL;
