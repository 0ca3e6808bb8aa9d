-- inoutbox migration (outbox, 1) for MySQL/MariaDB: the outbox table, with scheduled
-- publishing (`due_at`). Names in braces are filled in from the configured table names (see
-- store::migrate); double quotes become backticks. `payload` is the exact text the producer
-- serialised (`longtext`, not MySQL's normalising `json`). The relay's hold on the table is a
-- `GET_LOCK` of its connection: no lease table.
CREATE TABLE IF NOT EXISTS {outbox} (
    seq             bigint       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id              varchar(64)  NOT NULL,
    aggregatetype   text,
    aggregateid     text,
    type            text         NOT NULL,
    topic           varchar(255) NOT NULL,
    message_key     text,
    payload         longtext     NOT NULL,
    headers         longtext     NOT NULL,
    created_at      datetime(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    published_at    datetime(6),
    attempts        int          NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at datetime(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    parked_at       datetime(6),
    due_at          datetime(6),
    UNIQUE KEY {outbox:order} (id),
    KEY {outbox:pending_idx} (published_at, seq),
    -- The rows of a key that hold its later ones (a retry's backoff, a parked row).
    KEY {outbox:pending_key_idx} (topic, message_key(255), seq),
    KEY {outbox:scheduled_idx} (due_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
