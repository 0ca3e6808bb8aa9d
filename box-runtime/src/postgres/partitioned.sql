-- inoutbox: the inbox table partitioned by received day (`PgStore::partitioned_by_day`), run by
-- `PgStore::migrate` after the versioned migrations; a no-op once the table is partitioned.
-- Names in braces are filled in from the configured table names (see store::migrate).
--
-- The table keeps its columns (and their defaults) and gains `received_day` (the UTC day it was
-- received), the partition column: the primary key becomes (group, source, event id, day) and
-- the business-key index (group, business key, day). Claims look the key up in every partition
-- under a lock (see `postgres::partitions`). Existing rows move to the partition of the day
-- they were received; rows of a day without a partition land in the default partition.
DO $$
DECLARE
    parent regclass := '{inbox}'::regclass;
    s      text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = '{inbox}'::regclass);
    t      text := (SELECT relname FROM pg_class WHERE oid = '{inbox}'::regclass);
    old    regclass;
    cols   text;
    defs   text[];
    r      record;
    d      date;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = parent) = 'p' THEN
        RETURN;
    END IF;
    FOR r IN SELECT i.indexrelid::regclass AS name FROM pg_index i
             WHERE i.indrelid = parent AND i.indisunique AND NOT i.indisprimary
               AND (SELECT relname FROM pg_class WHERE oid = i.indexrelid)
                   <> btrim('{inbox:business_key_idx}', '"') LOOP
        RAISE EXCEPTION 'cannot partition %: its unique index % does not include the partition column',
            parent, r.name;
    END LOOP;
    -- Non-unique indexes are created again on the partitioned table, as they are.
    SELECT coalesce(array_agg(pg_get_indexdef(i.indexrelid)), '{}') INTO defs
        FROM pg_index i WHERE i.indrelid = parent AND NOT i.indisunique;
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO cols
        FROM pg_attribute WHERE attrelid = parent AND attnum > 0 AND NOT attisdropped;
    EXECUTE format('ALTER TABLE %s RENAME TO %I', parent, t || '_unpartitioned');
    old := format('%I.%I', s, t || '_unpartitioned')::regclass;
    FOR r IN SELECT conname FROM pg_constraint WHERE conrelid = old AND contype IN ('p', 'u') LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', old, r.conname);
    END LOOP;
    FOR r IN SELECT i.indexrelid::regclass AS name FROM pg_index i WHERE i.indrelid = old LOOP
        EXECUTE format('DROP INDEX %s', r.name);
    END LOOP;
    EXECUTE format(
        'CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED, '
        'received_day date NOT NULL DEFAULT ((now() AT TIME ZONE ''UTC'')::date), '
        'PRIMARY KEY (consumer_group, source, event_id, received_day)) '
        'PARTITION BY RANGE (received_day)', s, t, old);
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I DEFAULT', s, t || '_default', s, t);
    FOR d IN EXECUTE format('SELECT DISTINCT (received_at AT TIME ZONE ''UTC'')::date FROM %s', old) LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
                       s, t || '_p' || to_char(d, 'YYYYMMDD'), s, t, d, d + 1);
    END LOOP;
    EXECUTE format('INSERT INTO %I.%I (%s, received_day) SELECT %s, (received_at AT TIME ZONE ''UTC'')::date FROM %s',
                   s, t, cols, cols, old);
    EXECUTE format('DROP TABLE %s', old);
    FOREACH cols IN ARRAY defs LOOP
        EXECUTE cols;
    END LOOP;
    EXECUTE format('CREATE UNIQUE INDEX %s ON %I.%I (consumer_group, business_key, received_day) '
                   'WHERE business_key IS NOT NULL', '{inbox:business_key_idx}', s, t);
END $$;
