-- inoutbox migration (inbox, 1): inbox, attempts and dead-letter tables
-- Names in braces are filled in from the configured table names (see store::migrate).
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer_group text        NOT NULL,
    source         text        NOT NULL DEFAULT '',
    event_id       text        NOT NULL,
    event_type     text        NOT NULL,
    topic          text,
    "partition"    integer,
    "offset"       bigint,
    payload        bytea,
    received_at    timestamptz NOT NULL DEFAULT now(),
    processed_at   timestamptz,
    PRIMARY KEY (consumer_group, source, event_id)
);
CREATE INDEX IF NOT EXISTS {inbox:unprocessed_idx} ON {inbox} (received_at) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS {inbox:processed_idx} ON {inbox} (processed_at) WHERE processed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {attempts} (
    consumer_group  text        NOT NULL,
    source          text        NOT NULL,
    event_id        text        NOT NULL,
    attempts        integer     NOT NULL,
    last_error      text        NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, source, event_id)
);
CREATE TABLE IF NOT EXISTS {dead_letters} (
    id               bigserial   PRIMARY KEY,
    consumer_group   text        NOT NULL,
    source           text,
    event_id         text,
    event_type       text,
    topic            text        NOT NULL,
    "partition"      integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    message_key      bytea,
    header_names     text[]      NOT NULL,
    header_values    bytea[]     NOT NULL,
    payload          bytea,
    error            text        NOT NULL,
    attempts         integer     NOT NULL,
    first_failed_at  timestamptz NOT NULL,
    last_failed_at   timestamptz NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now(),
    replayed_at      timestamptz
);
CREATE INDEX IF NOT EXISTS {dead_letters:group_idx} ON {dead_letters} (consumer_group, dead_lettered_at);
