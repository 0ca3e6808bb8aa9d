-- inoutbox migration (inbox, 2) for MySQL/MariaDB: two-phase handlers and effects after commit,
-- as the other stores keep them (PostgreSQL's inbox_v3 and inbox_v7, SQLite's inbox_v7 and
-- inbox_v8). A message of a two-phase handler is stored as a received row (no `processed_at`,
-- its key, headers and payload kept in the columns of migration 1) and claimed by the group's
-- workers with a lease (`lease_owner`, `lease_until`, also of migration 1); `claims` counts the
-- claims of a row (more than one: a worker died or lost its lease on it). A handler schedules an
-- effect in its transaction; the consumer's drain claims it with a lease, runs its executor with
-- no transaction open, and marks it done or records the failed run.
-- Names in braces are filled in from the configured table names (see store::migrate); double
-- quotes become backticks. MySQL commits each DDL statement: every statement here may run again
-- after a crash half-way. MySQL 8.0 has no `ADD COLUMN IF NOT EXISTS` nor `CREATE INDEX IF NOT
-- EXISTS`: the inbox is altered by a statement prepared from what `information_schema` shows
-- missing (`@inoutbox_schema` and `@inoutbox_inbox` are set by the migrator; both sides of each
-- name comparison are converted to one character set and collation, so that neither MySQL's nor
-- MariaDB's collation of `information_schema` makes them an illegal mix).
SET @inoutbox_ddl = IF((SELECT count(*) FROM information_schema.columns
    WHERE CONVERT(table_schema USING utf8mb4) = CONVERT(@inoutbox_schema USING utf8mb4)
      AND CONVERT(table_name USING utf8mb4) = CONVERT(@inoutbox_inbox USING utf8mb4)
      AND CONVERT(column_name USING utf8mb4) = CONVERT('claims' USING utf8mb4)) = 0,
    'ALTER TABLE {inbox} ADD COLUMN claims int NOT NULL DEFAULT 0', 'DO 0');
PREPARE inoutbox_ddl FROM @inoutbox_ddl;
EXECUTE inoutbox_ddl;
DEALLOCATE PREPARE inoutbox_ddl;
-- Workers claim the oldest received rows of their group (and the deferred worker the earliest
-- due ones) in this index's order: a claim reads and locks the rows it takes, not a sort's worth.
SET @inoutbox_ddl = IF((SELECT count(*) FROM information_schema.statistics
    WHERE CONVERT(table_schema USING utf8mb4) = CONVERT(@inoutbox_schema USING utf8mb4)
      AND CONVERT(table_name USING utf8mb4) = CONVERT(@inoutbox_inbox USING utf8mb4)
      AND CONVERT(index_name USING utf8mb4) = CONVERT(CONCAT(@inoutbox_inbox, '_received_idx') USING utf8mb4)) = 0,
    'CREATE INDEX {inbox:received_idx} ON {inbox} (consumer_group, processed_at, due_at, received_at)',
    'DO 0');
PREPARE inoutbox_ddl FROM @inoutbox_ddl;
EXECUTE inoutbox_ddl;
DEALLOCATE PREPARE inoutbox_ddl;
CREATE TABLE IF NOT EXISTS {effects} (
    id              bigint         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_group  varbinary(255) NOT NULL,
    source          varbinary(255) NOT NULL,
    event_id        varbinary(255) NOT NULL,
    kind            text           NOT NULL,
    idempotency_key varchar(255)   NOT NULL,
    payload         longblob       NOT NULL,
    created_at      datetime(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    attempts        int            NOT NULL DEFAULT 0,
    last_error      text,
    lease_owner     varchar(255),
    lease_until     datetime(6),
    done_at         datetime(6),
    UNIQUE KEY {effects:key_idx} (idempotency_key),
    -- The drain claims a group's effects not done, oldest first.
    KEY {effects:pending_idx} (consumer_group, done_at, id),
    -- The retention task purges done effects, oldest first.
    KEY {effects:done_idx} (done_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
