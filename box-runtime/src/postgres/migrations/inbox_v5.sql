-- inoutbox migration (inbox, 5): business keys scoped by event type. A business key is unique
-- per (group, scope, key), where the scope is the handler's event type or the shared
-- `dedup_scope` it names; the inbox holds it as `scope:key` in `business_key`, so the unique
-- index of version 4 (group, business key) now holds the scope too. Keys stored before this
-- version take their row's event type as scope: they keep refusing events of their own type
-- and stop refusing events of other types (a handler with `dedup_scope` starts a new key space).
-- The index is dropped for the update and made again: rows change one at a time, and a key
-- that already read `<type>:..` could meet another row's new text before it changes itself.
-- Names in braces are filled in from the configured table names (see store::migrate).
DO $$
DECLARE
    idx regclass := (SELECT i.indexrelid::regclass FROM pg_index i
                     JOIN pg_class c ON c.oid = i.indexrelid
                     WHERE i.indrelid = '{inbox}'::regclass
                       AND c.relname = btrim('{inbox:business_key_idx}', '"'));
BEGIN
    IF idx IS NOT NULL THEN
        EXECUTE format('DROP INDEX %s', idx);
    END IF;
    UPDATE {inbox} SET business_key = event_type || ':' || business_key
        WHERE business_key IS NOT NULL;
    -- The daily-partitioned inbox (`PgStore::partitioned_by_day`) keeps the day in its keys.
    IF (SELECT relkind FROM pg_class WHERE oid = '{inbox}'::regclass) = 'p' THEN
        CREATE UNIQUE INDEX {inbox:business_key_idx}
            ON {inbox} (consumer_group, business_key, received_day) WHERE business_key IS NOT NULL;
    ELSE
        CREATE UNIQUE INDEX {inbox:business_key_idx}
            ON {inbox} (consumer_group, business_key) WHERE business_key IS NOT NULL;
    END IF;
END $$;
