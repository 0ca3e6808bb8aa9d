-- inoutbox migration (outbox, 6): the commit trigger of v4, a third cheaper for the writers.
-- Names in braces are filled in from the configured table names (see store::migrate).
--
-- What the trigger does is unchanged (see outbox_v4.sql): its first call in a transaction takes
-- the listed key locks in ascending order, and each row then draws its `seq`. Measured with 16
-- writers committing a business insert and one enqueue each (`relay_bench --phases writers`),
-- v4's trigger cost 42 % of the writers' rate against an insert of the same row into a plain
-- table; most of it was the `UPDATE` built and planned anew for every row (`EXECUTE format`,
-- so that the function named no table). The `UPDATE` is now a static statement naming the
-- table, planned once per session, and one listed key (the common case) is locked without
-- the array, sort and de-duplication that several need. The price: the function names its
-- table, so a table renamed or moved by hand needs this function re-created for its new name
-- (`inoutbox`'s own renames of first-release tables happen before this migration runs).
DO $$
DECLARE
    s text;
    t text;
BEGIN
    SELECT n.nspname, c.relname INTO s, t FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = '{outbox}'::regclass;
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION %I.%s() RETURNS trigger LANGUAGE plpgsql AS $f$ '
        'DECLARE keys text := current_setting(''inoutbox.enqueue_keys'', true); '
        'BEGIN '
        '  IF keys <> '''' THEN '
        '    PERFORM set_config(''inoutbox.enqueue_keys'', '''', true); '
        '    IF strpos(keys, '','') = 0 THEN '
        '      PERFORM pg_advisory_xact_lock(keys::int8); '
        '    ELSE '
        '      PERFORM pg_advisory_xact_lock(k) FROM ( '
        '        SELECT DISTINCT k FROM unnest(string_to_array(keys, '','')::int8[]) AS k '
        '        ORDER BY k) AS sorted; '
        '    END IF; '
        '  END IF; '
        '  UPDATE %I.%I SET seq = DEFAULT WHERE id = NEW.id AND seq = 0; '
        '  RETURN NULL; '
        'END $f$', s, '{outbox:order}', s, t);
END $$;
