-- inoutbox migration (outbox, 4): per-key order taken at commit, so enqueues never deadlock.
-- Names in braces are filled in from the configured table names (see store::migrate).
--
-- Until v3, `enqueue` took each key's advisory lock when it inserted the row and drew `seq` under
-- it: two transactions that enqueued keys A then B, and B then A, in separate calls, waited for
-- each other until PostgreSQL aborted one (a deadlock). Now `enqueue` inserts its row with
-- `seq = 0` and adds the key's lock id to a transaction-local list (`inoutbox.enqueue_keys`); this
-- deferred trigger runs at commit: its first call takes every listed key lock in ascending
-- order (a transaction waits only for keys above those it holds, so no cycle can form), and
-- each row then draws its `seq`, in the order the rows were inserted. A key's lock is thus held
-- from its rows' `seq` to the commit, and per key `seq` order stays commit order. Rows inserted
-- by other means (their `seq` from the sequence) are left alone. The function names no table
-- (the trigger's own), so a renamed table keeps it working.
DO $$
DECLARE
    s text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = '{outbox}'::regclass);
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION %I.%s() RETURNS trigger LANGUAGE plpgsql AS $f$ '
        'DECLARE keys text := current_setting(''inoutbox.enqueue_keys'', true); '
        'BEGIN '
        '  IF keys IS NOT NULL AND keys <> '''' THEN '
        '    PERFORM set_config(''inoutbox.enqueue_keys'', '''', true); '
        '    PERFORM pg_advisory_xact_lock(k) FROM ( '
        '      SELECT DISTINCT k FROM unnest(string_to_array(keys, '','')::int8[]) AS k '
        '      ORDER BY k) AS sorted; '
        '  END IF; '
        '  EXECUTE format(''UPDATE %%I.%%I SET seq = DEFAULT WHERE id = $1 AND seq = 0'', '
        '                 TG_TABLE_SCHEMA, TG_TABLE_NAME) USING NEW.id; '
        '  RETURN NULL; '
        'END $f$', s, '{outbox:order}');
    IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{outbox}'::regclass
                   AND tgname = btrim('{outbox:order}', '"')) THEN
        EXECUTE format('CREATE CONSTRAINT TRIGGER %s AFTER INSERT ON {outbox} '
                       'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.seq = 0) '
                       'EXECUTE FUNCTION %I.%s()',
                       '{outbox:order}', s, '{outbox:order}');
    END IF;
END $$;
