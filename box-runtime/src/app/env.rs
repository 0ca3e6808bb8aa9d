//! The environment an [`App`](super::App) reads: `DATABASE_URL` and `KAFKA_BROKERS`, both or
//! neither (a half-configured service refuses to start), and which store a database URL names.

use super::AppError;
use crate::store::redact_url;

/// The variable naming the database.
pub(super) const DATABASE_URL: &str = "DATABASE_URL";
/// The variable naming the brokers.
pub(super) const KAFKA_BROKERS: &str = "KAFKA_BROKERS";

/// What the environment chose: both parts outside, or both embedded.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Choice {
    /// `DATABASE_URL` and `KAFKA_BROKERS`, trimmed.
    External {
        database_url: String,
        brokers: String,
    },
    /// Neither is set: the zero-setup SQLite file and the in-process Kafka.
    Embedded,
}

/// Reads `DATABASE_URL` and `KAFKA_BROKERS` and chooses (see [`choose`]).
pub(super) fn read() -> Result<Choice, AppError> {
    let var = |name| match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(AppError::Env {
            variable: name,
            reason: "is not valid UTF-8".to_owned(),
        }),
    };
    choose(var(DATABASE_URL)?, var(KAFKA_BROKERS)?)
}

/// Both set and not blank: the external parts; neither set: the embedded ones. One set without
/// the other, or either set to nothing but whitespace, is an error naming the variable (a
/// typo in a deployment manifest must not send real rows to a broker inside this process).
pub(super) fn choose(
    database_url: Option<String>,
    brokers: Option<String>,
) -> Result<Choice, AppError> {
    for (variable, value) in [(DATABASE_URL, &database_url), (KAFKA_BROKERS, &brokers)] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(AppError::Env {
                variable,
                reason: format!(
                    "is set but empty: give it a value, or unset both {DATABASE_URL} and \
                     {KAFKA_BROKERS} for the embedded SQLite file and in-process Kafka"
                ),
            });
        }
    }
    match (database_url, brokers) {
        (Some(url), Some(brokers)) => Ok(Choice::External {
            database_url: url.trim().to_owned(),
            brokers: brokers.trim().to_owned(),
        }),
        (None, None) => Ok(Choice::Embedded),
        (Some(_), None) => Err(missing(KAFKA_BROKERS, DATABASE_URL)),
        (None, Some(_)) => Err(missing(DATABASE_URL, KAFKA_BROKERS)),
    }
}

fn missing(variable: &'static str, set: &str) -> AppError {
    AppError::Env {
        variable,
        reason: format!(
            "is not set, but {set} is: a service needs both (or neither, for the embedded SQLite \
             file and in-process Kafka, which keep nothing beyond the process)"
        ),
    }
}

/// A value given to [`App::connect`](super::App::connect): present, it must not be blank.
pub(super) fn given<'a>(
    variable: &'static str,
    value: Option<&'a str>,
) -> Result<Option<&'a str>, AppError> {
    match value.map(str::trim) {
        Some("") => Err(AppError::Env {
            variable,
            reason: "is empty: give a value, or `None` for the embedded part".to_owned(),
        }),
        other => Ok(other),
    }
}

/// The store a database URL names.
pub(super) enum Database<'a> {
    /// `postgres://...` or `postgresql://...`.
    Postgres(&'a str),
    /// `sqlite:...`.
    #[cfg(feature = "sqlite")]
    Sqlite(&'a str),
    /// `mysql://...` or `mariadb://...` (MySQL/MariaDB).
    #[cfg(feature = "mysql")]
    MySql(&'a str),
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
        #[cfg(feature = "mysql")]
        Some(url) if url.starts_with("mysql://") || url.starts_with("mariadb://") => {
            Ok(Database::MySql(url))
        }
        #[cfg(feature = "sqlite")]
        None => Ok(Database::ZeroSetup),
        #[cfg(not(feature = "sqlite"))]
        None => Err(AppError::Config(
            "set DATABASE_URL=postgres://... (zero setup needs the `sqlite` feature)".to_owned(),
        )),
        Some(url) => Err(AppError::Config(format!(
            "DATABASE_URL must start with postgres://, postgresql://, sqlite: or (feature `mysql`) mysql://, got `{}`",
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

#[cfg(test)]
mod tests {
    use super::{choose, Choice, DATABASE_URL, KAFKA_BROKERS};
    use crate::app::AppError;

    fn named(result: Result<Choice, AppError>) -> &'static str {
        match result {
            Err(AppError::Env { variable, .. }) => variable,
            other => panic!("expected an error naming a variable, got {other:?}"),
        }
    }

    #[test]
    fn both_or_neither_and_never_blank() {
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(choose(None, None).expect("neither"), Choice::Embedded);
        assert_eq!(
            choose(some(" postgres://h/db "), some("k:9092")).expect("both"),
            Choice::External {
                database_url: "postgres://h/db".to_owned(),
                brokers: "k:9092".to_owned()
            }
        );
        assert_eq!(named(choose(some("postgres://h/db"), None)), KAFKA_BROKERS);
        assert_eq!(named(choose(None, some("k:9092"))), DATABASE_URL);
        for blank in ["", " ", "\t\n"] {
            assert_eq!(
                named(choose(some("postgres://h/db"), some(blank))),
                KAFKA_BROKERS
            );
            assert_eq!(named(choose(some(blank), some("k:9092"))), DATABASE_URL);
            assert_eq!(named(choose(None, some(blank))), KAFKA_BROKERS);
            assert_eq!(named(choose(some(blank), None)), DATABASE_URL);
        }
    }
}
