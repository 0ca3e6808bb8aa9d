//! The environment an [`App`](super::App) reads: `DATABASE_URL` and one broker,
//! `KAFKA_BROKERS` or `NATS_URL`, both or neither (a half-configured service refuses to start,
//! as one with two brokers does), and which store a database URL names.

use super::AppError;
use crate::store::redact_url;

/// The variable naming the database.
pub(super) const DATABASE_URL: &str = "DATABASE_URL";
/// The variable naming the Kafka brokers.
pub(super) const KAFKA_BROKERS: &str = "KAFKA_BROKERS";
/// The variable naming the NATS server (JetStream; feature `nats`).
pub(super) const NATS_URL: &str = "NATS_URL";

/// The variable sizing the database's connection pool (PostgreSQL, MySQL/MariaDB).
pub(super) const DATABASE_POOL_SIZE: &str = "DATABASE_POOL_SIZE";

/// The smallest pool `DATABASE_POOL_SIZE` may ask for: a relay holds three connections (two
/// workers and its listener), and a consumer needs one more to make progress.
pub(super) const MIN_POOL_SIZE: u32 = 4;

/// The broker the environment names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BrokerUrl {
    /// `KAFKA_BROKERS`, trimmed.
    Kafka(String),
    /// `NATS_URL`, trimmed.
    Nats(String),
}

/// What the environment chose: both parts outside, or both embedded.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Choice {
    /// `DATABASE_URL` and a broker, trimmed.
    External {
        database_url: String,
        broker: BrokerUrl,
    },
    /// Neither is set: the zero-setup SQLite file and the in-process Kafka.
    Embedded,
}

/// The variable `name`, if set; not UTF-8 is an error naming it.
fn var(name: &'static str) -> Result<Option<String>, AppError> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(AppError::Env {
            variable: name,
            reason: "is not valid UTF-8".to_owned(),
        }),
    }
}

/// Reads `DATABASE_URL`, `KAFKA_BROKERS` and `NATS_URL` and chooses (see [`choose`]).
pub(super) fn read() -> Result<Choice, AppError> {
    choose(var(DATABASE_URL)?, var(KAFKA_BROKERS)?, var(NATS_URL)?)
}

/// `DATABASE_POOL_SIZE`, if set: the connections of the database's pool.
pub(super) fn pool_size() -> Result<Option<u32>, AppError> {
    var(DATABASE_POOL_SIZE)?
        .map(|value| parse_pool_size(&value))
        .transpose()
}

/// A pool size: a whole number, at least [`MIN_POOL_SIZE`].
pub(super) fn parse_pool_size(value: &str) -> Result<u32, AppError> {
    let invalid = |why: &str| AppError::Env {
        variable: DATABASE_POOL_SIZE,
        reason: format!(
            "is `{}`: {why}; it is the number of connections the database pool may open \
             (with the database a round trip of a millisecond or more away, about the events \
             per second wanted times the seconds a message's transaction is open; the defaults \
             and the rule: docs/deployment.md)",
            value.trim()
        ),
    };
    match value.trim().parse::<u32>() {
        Ok(n) if n >= MIN_POOL_SIZE => Ok(n),
        Ok(_) => Err(invalid(&format!(
            "give at least {MIN_POOL_SIZE} (a relay holds three connections, a consumer needs one more)"
        ))),
        Err(_) => Err(invalid("give a whole number")),
    }
}

/// `DATABASE_URL` and one broker (`KAFKA_BROKERS` or `NATS_URL`) set and not blank: the
/// external parts; none set: the embedded ones. A database without a broker or a broker
/// without a database, both brokers, or any variable set to nothing but whitespace, is an
/// error naming the variable (a typo in a deployment manifest must not send real rows to a
/// broker inside this process, nor to the other broker).
pub(super) fn choose(
    database_url: Option<String>,
    brokers: Option<String>,
    nats_url: Option<String>,
) -> Result<Choice, AppError> {
    for (variable, value) in [
        (DATABASE_URL, &database_url),
        (KAFKA_BROKERS, &brokers),
        (NATS_URL, &nats_url),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(AppError::Env {
                variable,
                reason: format!(
                    "is set but empty: give it a value, or unset {DATABASE_URL}, \
                     {KAFKA_BROKERS} and {NATS_URL} for the embedded SQLite file and in-process \
                     Kafka"
                ),
            });
        }
    }
    let broker = match (brokers, nats_url) {
        (Some(_), Some(_)) => {
            return Err(AppError::Env {
                variable: NATS_URL,
                reason: format!(
                    "is set, and so is {KAFKA_BROKERS}: a service runs on one broker; unset one \
                     of them"
                ),
            })
        }
        (Some(brokers), None) => Some(BrokerUrl::Kafka(brokers.trim().to_owned())),
        (None, Some(url)) => Some(BrokerUrl::Nats(url.trim().to_owned())),
        (None, None) => None,
    };
    match (database_url, broker) {
        (Some(url), Some(broker)) => Ok(Choice::External {
            database_url: url.trim().to_owned(),
            broker,
        }),
        (None, None) => Ok(Choice::Embedded),
        (Some(_), None) => Err(missing(
            KAFKA_BROKERS,
            &format!(" (nor {NATS_URL}), but {DATABASE_URL} is"),
        )),
        (None, Some(BrokerUrl::Kafka(_))) => {
            Err(missing(DATABASE_URL, &format!(", but {KAFKA_BROKERS} is")))
        }
        (None, Some(BrokerUrl::Nats(_))) => {
            Err(missing(DATABASE_URL, &format!(", but {NATS_URL} is")))
        }
    }
}

fn missing(variable: &'static str, set: &str) -> AppError {
    AppError::Env {
        variable,
        reason: format!(
            "is not set{set}: a service needs a database and a broker (or neither, for the \
             embedded SQLite file and in-process Kafka, which keep nothing beyond the process)"
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
    use super::{
        choose, parse_pool_size, BrokerUrl, Choice, DATABASE_POOL_SIZE, DATABASE_URL,
        KAFKA_BROKERS, NATS_URL,
    };
    use crate::app::AppError;

    fn named(result: Result<Choice, AppError>) -> &'static str {
        match result {
            Err(AppError::Env { variable, .. }) => variable,
            other => panic!("expected an error naming a variable, got {other:?}"),
        }
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn both_or_neither_and_never_blank() {
        assert_eq!(choose(None, None, None).expect("neither"), Choice::Embedded);
        assert_eq!(
            choose(some(" postgres://h/db "), some("k:9092"), None).expect("both"),
            Choice::External {
                database_url: "postgres://h/db".to_owned(),
                broker: BrokerUrl::Kafka("k:9092".to_owned())
            }
        );
        assert_eq!(
            named(choose(some("postgres://h/db"), None, None)),
            KAFKA_BROKERS
        );
        assert_eq!(named(choose(None, some("k:9092"), None)), DATABASE_URL);
        for blank in ["", " ", "\t\n"] {
            assert_eq!(
                named(choose(some("postgres://h/db"), some(blank), None)),
                KAFKA_BROKERS
            );
            assert_eq!(
                named(choose(some(blank), some("k:9092"), None)),
                DATABASE_URL
            );
            assert_eq!(named(choose(None, some(blank), None)), KAFKA_BROKERS);
            assert_eq!(named(choose(some(blank), None, None)), DATABASE_URL);
        }
    }

    #[test]
    fn nats_url_stands_for_kafka_brokers_and_never_beside_it() {
        let nats = "nats://app:hunter2@n:4222";
        assert_eq!(
            choose(some("postgres://h/db"), None, some(&format!(" {nats} "))).expect("nats"),
            Choice::External {
                database_url: "postgres://h/db".to_owned(),
                broker: BrokerUrl::Nats(nats.to_owned())
            }
        );
        // Two brokers: refused, naming both.
        let both =
            choose(some("postgres://h/db"), some("k:9092"), some(nats)).expect_err("two brokers");
        assert!(
            matches!(&both, AppError::Env { variable, .. } if *variable == NATS_URL),
            "{both:?}"
        );
        let shown = both.to_string();
        assert!(
            shown.contains(NATS_URL) && shown.contains(KAFKA_BROKERS),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(named(choose(None, some("k:9092"), some(nats))), NATS_URL);
        // A broker without a database, or a database without a broker, names what is missing.
        let alone = choose(None, None, some(nats)).expect_err("no database");
        assert!(alone.to_string().contains(NATS_URL), "{alone}");
        assert!(!alone.to_string().contains("hunter2"), "{alone}");
        assert_eq!(named(Err(alone)), DATABASE_URL);
        let no_broker = choose(some("postgres://h/db"), None, None).expect_err("no broker");
        assert!(no_broker.to_string().contains(NATS_URL), "{no_broker}");
        for blank in ["", " ", "\t\n"] {
            assert_eq!(
                named(choose(some("postgres://h/db"), None, some(blank))),
                NATS_URL
            );
            assert_eq!(named(choose(None, None, some(blank))), NATS_URL);
            assert_eq!(named(choose(some(blank), None, some(nats))), DATABASE_URL);
        }
    }

    #[test]
    fn a_pool_size_is_a_whole_number_of_at_least_four() {
        assert_eq!(parse_pool_size("48").expect("48"), 48);
        assert_eq!(parse_pool_size(" 4\n").expect("trimmed"), 4);
        for bad in ["", " ", "3", "0", "-1", "4.5", "sixteen", "99999999999"] {
            match parse_pool_size(bad) {
                Err(AppError::Env { variable, reason }) => {
                    assert_eq!(variable, DATABASE_POOL_SIZE, "{bad:?}");
                    assert!(
                        reason.contains("whole number") || reason.contains("at least 4"),
                        "{bad:?}: {reason}"
                    );
                }
                other => panic!("{bad:?} accepted: {other:?}"),
            }
        }
    }
}
