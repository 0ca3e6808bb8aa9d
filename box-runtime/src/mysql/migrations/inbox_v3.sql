-- inoutbox migration (inbox, 3) for MySQL/MariaDB: two secondary indexes fewer on the inbox,
-- whose every claim writes one entry per index and row. `unprocessed_idx` (received_at) served
-- the stuck count, which `processed_idx` (processed_at) serves as well (the stuck rows are the
-- few with no `processed_at`, found by it; their age is read from those rows); `due_idx`
-- (consumer_group, due_at) served the deferred worker's claim and count, which `received_idx`
-- (consumer_group, processed_at, due_at, received_at) of migration 2 serves in the same order.
-- Each drop is prepared from what `information_schema` shows present (MySQL 8.0 has no `DROP
-- INDEX IF EXISTS`), so the migration may run again after a crash half-way.
SET @inoutbox_ddl = IF((SELECT count(*) FROM information_schema.statistics
    WHERE CONVERT(table_schema USING utf8mb4) = CONVERT(@inoutbox_schema USING utf8mb4)
      AND CONVERT(table_name USING utf8mb4) = CONVERT(@inoutbox_inbox USING utf8mb4)
      AND CONVERT(index_name USING utf8mb4) = CONVERT(CONCAT(@inoutbox_inbox, '_unprocessed_idx') USING utf8mb4)) > 0,
    'DROP INDEX {inbox:unprocessed_idx} ON {inbox}',
    'DO 0');
PREPARE inoutbox_ddl FROM @inoutbox_ddl;
EXECUTE inoutbox_ddl;
DEALLOCATE PREPARE inoutbox_ddl;
SET @inoutbox_ddl = IF((SELECT count(*) FROM information_schema.statistics
    WHERE CONVERT(table_schema USING utf8mb4) = CONVERT(@inoutbox_schema USING utf8mb4)
      AND CONVERT(table_name USING utf8mb4) = CONVERT(@inoutbox_inbox USING utf8mb4)
      AND CONVERT(index_name USING utf8mb4) = CONVERT(CONCAT(@inoutbox_inbox, '_due_idx') USING utf8mb4)) > 0,
    'DROP INDEX {inbox:due_idx} ON {inbox}',
    'DO 0');
PREPARE inoutbox_ddl FROM @inoutbox_ddl;
EXECUTE inoutbox_ddl;
DEALLOCATE PREPARE inoutbox_ddl;
