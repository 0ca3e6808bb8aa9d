//! The environment an [`App`](super::App) reads: `DATABASE_URL` and `KAFKA_BROKERS` (empty is
//! unset), and which store a database URL names.

use super::AppError;
use crate::store::redact_url;

/// `DATABASE_URL` and `KAFKA_BROKERS`, when set and not empty.
pub(super) struct Env {
    pub(super) database_url: Option<String>,
    pub(super) brokers: Option<String>,
}

impl Env {
    /// Reads the variables.
    pub(super) fn read() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Self {
            database_url: var("DATABASE_URL"),
            brokers: var("KAFKA_BROKERS"),
        }
    }
}

/// The store a database URL names.
pub(super) enum Database<'a> {
    /// `postgres://...` or `postgresql://...`.
    Postgres(&'a str),
    /// `sqlite:...`.
    #[cfg(feature = "sqlite")]
    Sqlite(&'a str),
    /// No URL: a SQLite file in a temporary directory.
    #[cfg(feature = "sqlite")]
    ZeroSetup,
}

/// Which store `database_url` names, by its scheme; `None` is the zero-setup store.
pub(super) fn database(database_url: Option<&str>) -> Result<Database<'_>, AppError> {
    match database_url {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Ok(Database::Postgres(url))
        }
        #[cfg(feature = "sqlite")]
        Some(url) if url.starts_with("sqlite:") => Ok(Database::Sqlite(url)),
        #[cfg(feature = "sqlite")]
        None => Ok(Database::ZeroSetup),
        #[cfg(not(feature = "sqlite"))]
        None => Err(AppError::Config(
            "set DATABASE_URL=postgres://... (zero setup needs the `sqlite` feature)".to_owned(),
        )),
        Some(url) => Err(AppError::Config(format!(
            "DATABASE_URL must start with postgres://, postgresql:// or sqlite:, got `{}`",
            redact_url(url)
        ))),
    }
}

/// The host and database of a PostgreSQL URL, for [`App::describe`](super::App::describe):
/// without its scheme, credentials and options.
pub(super) fn postgres_target(url: &str) -> String {
    let redacted = redact_url(url);
    let target = redacted.split('?').next().unwrap_or_default();
    let target = target.rsplit('@').next().unwrap_or_default();
    target
        .trim_start_matches("postgres://")
        .trim_start_matches("postgresql://")
        .to_owned()
}
