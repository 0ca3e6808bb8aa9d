//! One place for every default name: tables, headers, settings.

/// The prefix of every default table name.
pub const TABLE_PREFIX: &str = "inoutbox_";
/// Default name of the inbox table.
pub const INBOX_TABLE: &str = "inoutbox_inbox";
/// Default name of the table holding failed attempts (outside the rolled-back transaction).
pub const ATTEMPTS_TABLE: &str = "inoutbox_inbox_attempts";
/// Default name of the dead-letter table.
pub const DEAD_LETTER_TABLE: &str = "inoutbox_dead_letters";
/// Default name of the outbox table.
pub const OUTBOX_TABLE: &str = "inoutbox_outbox";
/// Default name of the table recording applied migrations.
pub const MIGRATIONS_TABLE: &str = "inoutbox_migrations";
/// The default effects table: work a handler scheduled to run after its transaction commits.
pub const EFFECTS_TABLE: &str = "inoutbox_effects";

/// CloudEvents (Kafka binary mode) header carrying the event id.
pub const HEADER_ID: &str = "ce_id";
/// CloudEvents header carrying the event type.
pub const HEADER_TYPE: &str = "ce_type";
/// CloudEvents header carrying the event source.
pub const HEADER_SOURCE: &str = "ce_source";
/// CloudEvents header carrying the spec version.
pub const HEADER_SPECVERSION: &str = "ce_specversion";
/// The CloudEvents spec version inoutbox writes.
pub const SPECVERSION: &str = "1.0";
/// Content type header.
pub const HEADER_CONTENT_TYPE: &str = "content-type";
/// The content type of inoutbox payloads.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// W3C trace context header.
pub const HEADER_TRACEPARENT: &str = "traceparent";

/// `ce_source` the relay writes unless configured (name your service instead).
pub const DEFAULT_SOURCE: &str = "inoutbox";
/// Environment variable arming a failpoint, `<name>:<n>` (crate feature `failpoints` only).
pub const FAILPOINT_ENV: &str = "INOUTBOX_FAILPOINT";
