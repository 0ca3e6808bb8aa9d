-- inoutbox migration (inbox, 1) for MySQL/MariaDB: inbox, attempts and dead-letter tables, with
-- business keys and deferred messages (the schema the other stores reached by version 6).
-- Names in braces are filled in from the configured table names (see store::migrate); double
-- quotes become backticks. MySQL commits each DDL statement: every statement here may run again
-- after a crash half-way (`IF NOT EXISTS`). Statements are those MariaDB >= 10.6 and MySQL >= 8.0
-- both accept. Keys are `varbinary`: compared byte by byte, trailing spaces included (a `varchar`
-- of MySQL's and MariaDB's binary collations pads them away); timestamps are UTC `DATETIME(6)`.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer_group varbinary(255) NOT NULL,
    source         varbinary(255) NOT NULL DEFAULT '',
    event_id       varbinary(255) NOT NULL,
    event_type     text         NOT NULL,
    topic          text,
    "partition"    int,
    "offset"       bigint,
    payload        longblob,
    received_at    datetime(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    processed_at   datetime(6),
    -- `scope:key`, unique per group (NULLs do not collide).
    business_key   varbinary(1024),
    -- Which claim inserted the row (MySQL has no `RETURNING`): a random number per claim.
    claim_token    bigint,
    -- Deferred messages: the kept message, its lease, due time and deferral count.
    message_key    longblob,
    headers        longtext,
    lease_owner    varchar(64),
    lease_until    datetime(6),
    due_at         datetime(6),
    deferrals      int          NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer_group, source, event_id),
    UNIQUE KEY {inbox:business_key_idx} (consumer_group, business_key),
    KEY {inbox:processed_idx} (processed_at),
    KEY {inbox:unprocessed_idx} (received_at),
    KEY {inbox:due_idx} (consumer_group, due_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE IF NOT EXISTS {attempts} (
    consumer_group  varbinary(255) NOT NULL,
    source          varbinary(255) NOT NULL,
    event_id        varbinary(255) NOT NULL,
    attempts        int          NOT NULL,
    last_error      text         NOT NULL,
    first_failed_at datetime(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    last_failed_at  datetime(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer_group, source, event_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE IF NOT EXISTS {dead_letters} (
    id               bigint       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_group   varbinary(255) NOT NULL,
    source           varbinary(255) NOT NULL DEFAULT '',
    event_id         varbinary(255),
    event_type       text,
    topic            text         NOT NULL,
    "partition"      int          NOT NULL,
    "offset"         bigint       NOT NULL,
    message_key      longblob,
    headers          longtext     NOT NULL,
    payload          longblob,
    payload_size     bigint,
    payload_sha256   varchar(64),
    error            text         NOT NULL,
    attempts         int          NOT NULL,
    times            int          NOT NULL DEFAULT 1,
    first_failed_at  datetime(6)  NOT NULL,
    last_failed_at   datetime(6)  NOT NULL,
    dead_lettered_at datetime(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    replayed_at      datetime(6),
    -- One letter per event (NULL event ids do not collide).
    UNIQUE KEY {dead_letters:event_idx} (consumer_group, source, event_id),
    KEY {dead_letters:group_idx} (consumer_group, dead_lettered_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
