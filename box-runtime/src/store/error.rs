//! Database errors, classified by what they mean (SQLSTATE and the driver's error kind).

/// A database error, classified by SQLSTATE where one exists.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database cannot be reached or the connection broke; retry after a backoff.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A serialization failure or deadlock (SQLSTATE 40001 / 40P01): retry the transaction.
    #[error("transaction conflict (SQLSTATE {code}): {source}")]
    Conflict {
        /// The SQLSTATE.
        code: String,
        /// The error.
        #[source]
        source: sqlx::Error,
    },
    /// Anything else.
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
    /// A shipped migration could not be rendered (a bug in txbox).
    #[error("migration error: {0}")]
    Migration(String),
    /// A configuration problem (invalid table name, ...).
    #[error(transparent)]
    Config(#[from] crate::ident::IdentError),
}

impl StoreError {
    /// The database went away while a handler ran (the handler's own error said so).
    pub(crate) fn lost_under_handler() -> Self {
        Self::Unavailable(sqlx::Error::PoolClosed)
    }

    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Conflict { .. })
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        classify(error)
    }
}

/// Classifies an sqlx error by what it means, never by its text.
pub(crate) fn classify(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => StoreError::Unavailable(error),
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            // SQLite reports numeric (extended) result codes: the low byte is the primary code.
            if let Ok(sqlite) = code.parse::<i32>() {
                return match sqlite & 0xff {
                    // SQLITE_BUSY, SQLITE_LOCKED: another writer holds the database.
                    5 | 6 => StoreError::Conflict {
                        code,
                        source: error,
                    },
                    // SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_FULL: the file is unusable now.
                    10 | 13 | 14 => StoreError::Unavailable(error),
                    _ => StoreError::Other(error),
                };
            }
            match code.as_str() {
                // serialization_failure, deadlock_detected
                "40001" | "40P01" => StoreError::Conflict {
                    code,
                    source: error,
                },
                // class 08: connection exception; 57P01..57P03: admin shutdown, crash shutdown,
                // cannot connect now; 53300: too many connections
                c if c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "53300") => {
                    StoreError::Unavailable(error)
                }
                _ => StoreError::Other(error),
            }
        }
        _ => StoreError::Other(error),
    }
}

/// Whether an sqlx error, e.g. one a handler returned, means the database went away.
pub fn is_unavailable(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(sqlx_error) = e.downcast_ref::<sqlx::Error>() {
            return match sqlx_error {
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
                sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                    c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")
                }),
                _ => false,
            };
        }
        next = e.source();
    }
    false
}
