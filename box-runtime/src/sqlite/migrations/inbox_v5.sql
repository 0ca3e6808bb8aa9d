-- inoutbox migration (inbox, 5): business keys scoped by event type. A business key is unique
-- per (group, scope, key), where the scope is the handler's event type or the shared
-- `dedup_scope` it names; the inbox holds it as `scope:key` in `business_key`, so the unique
-- index of version 4 (group, business key) now holds the scope too. Keys stored before this
-- version take their row's event type as scope: they keep refusing events of their own type
-- and stop refusing events of other types (a handler with `dedup_scope` starts a new key space).
-- The index is dropped for the update and made again: rows change one at a time, and a key
-- that already read `<type>:..` could meet another row's new text before it changes itself.
-- Names in braces are filled in from the configured table names (see store::migrate).
DROP INDEX IF EXISTS {inbox:business_key_idx};
UPDATE {inbox} SET business_key = event_type || ':' || business_key WHERE business_key IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS {inbox:business_key_idx}
    ON {inbox} (consumer_group, business_key) WHERE business_key IS NOT NULL;
