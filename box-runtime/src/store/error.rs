//! Database errors, classified by what they mean: the SQLSTATE class (PostgreSQL), result
//! code (SQLite) or error number (MySQL/MariaDB) of the backend's own error type, and the driver's error kind. Never by text.
//!
//! | class | PostgreSQL SQLSTATE | SQLite | MySQL/MariaDB error number | what inoutbox does |
//! | --- | --- | --- | --- | --- |
//! | [`ErrorClass::Unavailable`] | class `08`, class `53`, `57P01`–`57P03`; I/O, TLS, pool errors | `SQLITE_IOERR`, `SQLITE_FULL`, `SQLITE_CANTOPEN` | 1040 (too many connections), 1053 (shutdown), 1077–1081, 1152, 1154–1161 (aborted, network), 1927 (connection killed), 2002, 2003, 2006, 2013 (gone away, lost), 4031 (idle disconnect) | back off and retry without limit; no handler attempt is counted |
//! | [`ErrorClass::Conflict`] | `40001`, `40P01` | `SQLITE_BUSY`, `SQLITE_LOCKED` | 1213 (deadlock), 1614, 1637 (XA/too many transactions) | retry after a backoff (the transaction lost a race); each run counted once the database answers the count, the message given up on after `busy_attempts` (default 10) |
//! | [`ErrorClass::Timeout`] | `55P03` (lock not available), `57014` (statement timeout, cancel) | — | 1205 (lock wait timeout), 3572 (`NOWAIT`), 1317 (interrupted), 1969, 3024 (statement timeout) | as `Conflict`; so is a transaction that outlives `transaction_timeout` |
//! | [`ErrorClass::Rejected`] | class `22` (data exception), class `23` (integrity constraint) | `SQLITE_CONSTRAINT`, `SQLITE_MISMATCH`, `SQLITE_TOOBIG`, `SQLITE_RANGE`; encode errors | 1062, 1586 (duplicate key), 1048, 1364 (NULL, no default), 1216, 1217, 1451, 1452 (foreign key), 3819, 4025 (check), 1264, 1265, 1292, 1366, 1406, 1365 (out of range, truncated, bad string, too long, division by 0), 1301, 1153 (too large), 3140 (bad JSON) | permanent for this message: a handler's error dead-letters it at once; inoutbox's own statements dead-letter it after a few tries |
//! | [`ErrorClass::Other`] | everything else | everything else | everything else | a handler's error is transient (retried, counted); inoutbox's own statements back off and retry |
//!
//! A handler overrides the class of its error with `HandlerError::permanent` or
//! `HandlerError::transient`.

use std::error::Error as StdError;

/// What a database error means for the operation that got it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The database cannot be reached, or the connection broke.
    Unavailable,
    /// The transaction lost a race (serialization failure, deadlock, a busy database).
    Conflict,
    /// A lock or statement timeout, or a cancel.
    Timeout,
    /// The statement can never succeed with this data (data exception, constraint violation).
    Rejected,
    /// Anything else.
    Other,
}

impl ErrorClass {
    /// Whether the same operation may succeed later without any change.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Unavailable | Self::Conflict | Self::Timeout)
    }
}

/// A database error, classified (see the module docs for the table).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database cannot be reached or the connection broke; retry after a backoff.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A serialization failure, deadlock, lock or statement timeout, or busy database: retry.
    #[error("database conflict or timeout (code {code}): {source}")]
    Conflict {
        /// The SQLSTATE or SQLite result code.
        code: String,
        /// The error.
        #[source]
        source: sqlx::Error,
    },
    /// The database rejects the data (SQLSTATE class 22 or 23): retrying cannot help.
    #[error("database rejected the data (code {code}): {source}")]
    Rejected {
        /// The SQLSTATE or SQLite result code.
        code: String,
        /// The error.
        #[source]
        source: sqlx::Error,
    },
    /// Anything else.
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
    /// Connecting failed (the target's password is hidden).
    #[error("cannot connect to {target}: {source}")]
    Connect {
        /// The URL, password hidden.
        target: String,
        /// The cause.
        #[source]
        source: sqlx::Error,
    },
    /// A shipped migration could not be rendered (a bug in inoutbox).
    #[error("migration error: {0}")]
    Migration(String),
    /// A configuration problem (invalid or colliding table names, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl From<crate::ident::IdentError> for StoreError {
    fn from(error: crate::ident::IdentError) -> Self {
        Self::Config(error.to_string())
    }
}

impl StoreError {
    /// A transaction took longer than its bound (a connection left half-open, for one).
    pub(crate) fn timed_out(limit: std::time::Duration) -> Self {
        Self::Unavailable(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the transaction took longer than {limit:?}; its connection was dropped"),
        )))
    }

    /// The database went away while a handler ran (the handler's own error said so).
    pub(crate) fn lost_under_handler() -> Self {
        Self::Unavailable(sqlx::Error::PoolClosed)
    }

    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Conflict { .. })
    }

    /// Whether the database rejects the data: the operation can never succeed as it is.
    pub fn is_rejected(&self) -> bool {
        matches!(self, Self::Rejected { .. })
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        let code = || database_code(&error).unwrap_or_default();
        match classify(&error) {
            ErrorClass::Unavailable => Self::Unavailable(error),
            ErrorClass::Conflict | ErrorClass::Timeout => Self::Conflict {
                code: code(),
                source: error,
            },
            ErrorClass::Rejected => Self::Rejected {
                code: code(),
                source: error,
            },
            ErrorClass::Other => Self::Other(error),
        }
    }
}

fn database_code(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Classifies an sqlx error by the backend's error type and code, never by its text.
pub fn classify(error: &sqlx::Error) -> ErrorClass {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => ErrorClass::Unavailable,
        sqlx::Error::Encode(_) => ErrorClass::Rejected,
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                return postgres_class(pg.code());
            }
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return mysql_class(my.number());
            }
            #[cfg(feature = "sqlite")]
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
                return sqlite_class(code);
            }
            ErrorClass::Other
        }
        _ => ErrorClass::Other,
    }
}

/// The class of a PostgreSQL SQLSTATE.
pub(crate) fn postgres_class(sqlstate: &str) -> ErrorClass {
    match sqlstate {
        "40001" | "40P01" => ErrorClass::Conflict,
        "55P03" | "57014" => ErrorClass::Timeout,
        "57P01" | "57P02" | "57P03" => ErrorClass::Unavailable,
        s if s.starts_with("08") || s.starts_with("53") => ErrorClass::Unavailable,
        s if s.starts_with("22") || s.starts_with("23") => ErrorClass::Rejected,
        _ => ErrorClass::Other,
    }
}

/// The class of a MySQL/MariaDB error number (the server's, or the client's 2xxx).
#[cfg(feature = "mysql")]
pub(crate) fn mysql_class(number: u16) -> ErrorClass {
    match number {
        1213 | 1614 | 1637 => ErrorClass::Conflict,
        1205 | 3572 | 1317 | 1969 | 3024 => ErrorClass::Timeout,
        1040
        | 1053
        | 1077..=1081
        | 1152
        | 1154..=1161
        | 1927
        | 2002
        | 2003
        | 2006
        | 2013
        | 4031 => ErrorClass::Unavailable,
        1062 | 1586 | 1048 | 1364 | 1216 | 1217 | 1451 | 1452 | 3819 | 4025 | 1264 | 1265
        | 1292 | 1366 | 1406 | 1365 | 1301 | 1153 | 3140 => ErrorClass::Rejected,
        _ => ErrorClass::Other,
    }
}

/// The class of a SQLite (extended) result code: the low byte is the primary code.
#[cfg(feature = "sqlite")]
fn sqlite_class(code: i32) -> ErrorClass {
    match code & 0xff {
        // SQLITE_BUSY, SQLITE_LOCKED: another writer holds the database.
        5 | 6 => ErrorClass::Conflict,
        // SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN: the file is unusable now.
        10 | 13 | 14 => ErrorClass::Unavailable,
        // SQLITE_TOOBIG, SQLITE_CONSTRAINT, SQLITE_MISMATCH, SQLITE_RANGE.
        18 | 19 | 20 | 25 => ErrorClass::Rejected,
        _ => ErrorClass::Other,
    }
}

/// The class of the first sqlx error in an error's chain (e.g. one a handler returned), if any.
pub fn class_of(error: &(dyn StdError + 'static)) -> Option<ErrorClass> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(sqlx_error) = e.downcast_ref::<sqlx::Error>() {
            return Some(classify(sqlx_error));
        }
        if let Some(store_error) = e.downcast_ref::<StoreError>() {
            return Some(match store_error {
                StoreError::Unavailable(_) => ErrorClass::Unavailable,
                StoreError::Conflict { .. } => ErrorClass::Conflict,
                StoreError::Rejected { .. } => ErrorClass::Rejected,
                _ => ErrorClass::Other,
            });
        }
        next = e.source();
    }
    None
}

/// Whether an error's chain says the database went away.
pub fn is_unavailable(error: &(dyn StdError + 'static)) -> bool {
    class_of(error) == Some(ErrorClass::Unavailable)
}

/// The error of a store that lacks a feature.
pub(crate) fn unsupported(store: &str, what: &str) -> StoreError {
    StoreError::Config(format!(
        "the {store} store does not support {what} (PostgreSQL does)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_codes_are_classified_by_class_not_by_digits() {
        for (code, class) in [
            ("40001", ErrorClass::Conflict),
            ("40P01", ErrorClass::Conflict),
            ("53300", ErrorClass::Unavailable),
            ("53100", ErrorClass::Unavailable),
            ("08006", ErrorClass::Unavailable),
            ("08001", ErrorClass::Unavailable),
            ("57P01", ErrorClass::Unavailable),
            ("55P03", ErrorClass::Timeout),
            ("57014", ErrorClass::Timeout),
            ("22021", ErrorClass::Rejected),
            ("22001", ErrorClass::Rejected),
            ("23505", ErrorClass::Rejected),
            ("23514", ErrorClass::Rejected),
            ("42P01", ErrorClass::Other),
            ("XX000", ErrorClass::Other),
        ] {
            assert_eq!(postgres_class(code), class, "{code}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_codes_use_the_primary_code() {
        assert_eq!(sqlite_class(5), ErrorClass::Conflict);
        assert_eq!(sqlite_class(517), ErrorClass::Conflict); // SQLITE_BUSY_SNAPSHOT
        assert_eq!(sqlite_class(2067), ErrorClass::Rejected); // SQLITE_CONSTRAINT_UNIQUE
        assert_eq!(sqlite_class(10), ErrorClass::Unavailable);
        assert_eq!(sqlite_class(1), ErrorClass::Other);
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_numbers_are_classified() {
        assert_eq!(mysql_class(1213), ErrorClass::Conflict);
        assert_eq!(mysql_class(1205), ErrorClass::Timeout);
        assert_eq!(mysql_class(1062), ErrorClass::Rejected);
        assert_eq!(mysql_class(1406), ErrorClass::Rejected);
        assert_eq!(mysql_class(2013), ErrorClass::Unavailable);
        assert_eq!(mysql_class(1927), ErrorClass::Unavailable);
        assert_eq!(mysql_class(1146), ErrorClass::Other);
    }

    #[test]
    fn retryable_classes() {
        assert!(ErrorClass::Unavailable.is_retryable());
        assert!(ErrorClass::Conflict.is_retryable());
        assert!(ErrorClass::Timeout.is_retryable());
        assert!(!ErrorClass::Rejected.is_retryable());
        assert!(!ErrorClass::Other.is_retryable());
    }
}
