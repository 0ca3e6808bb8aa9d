//! Connecting a store from a URL: the scheme must match the store, connecting is bounded in
//! time, and every message names the target with its password hidden.

use crate::redact::redact_url;
use std::time::Duration;

use super::StoreError;

/// How long connecting may take before it fails with the target and the cause.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks that `url` is one of `schemes` (`"postgres"`, ...), for the store named `store`.
pub(crate) fn check_scheme(url: &str, schemes: &[&str], store: &str) -> Result<(), StoreError> {
    let scheme = url.split_once(':').map_or("", |(s, _)| s);
    if schemes.contains(&scheme) {
        return Ok(());
    }
    Err(StoreError::Config(format!(
        "{store} needs a URL starting with {}, got `{}`",
        schemes
            .iter()
            .map(|s| format!("`{s}:`"))
            .collect::<Vec<_>>()
            .join(" or "),
        redact_url(url)
    )))
}

/// Runs `connect`, failing after [`CONNECT_TIMEOUT`] with the (redacted) target and the cause.
pub(crate) async fn bounded<T>(
    url: &str,
    connect: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, StoreError> {
    let target = redact_url(url);
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(pool)) => Ok(pool),
        Ok(Err(source)) => Err(StoreError::Connect { target, source }),
        Err(_) => Err(StoreError::Connect {
            target,
            source: sqlx::Error::PoolTimedOut,
        }),
    }
}

/// How long a connection given back to the pool may take to answer the ping sqlx sends before
/// reusing it (it also flushes the rollback of a transaction dropped mid-statement).
const RELEASE_PING: Duration = Duration::from_secs(5);

/// Pings a connection given back to the pool within [`RELEASE_PING`]; one that does not answer
/// (left half-open: a transaction abandoned after its timeout) is dropped at once. sqlx's own
/// ping on release has no bound: a half-open connection would hold its pool slot for good, and
/// once every slot is held so, the consumer would wait on the pool for ever. The pooled stores
/// pass it to `after_release`.
pub(crate) fn release_ping<C: sqlx::Connection>(
    conn: &mut C,
    _: sqlx::pool::PoolConnectionMetadata,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool, sqlx::Error>> + Send + '_>> {
    Box::pin(async move {
        match tokio::time::timeout(RELEASE_PING, conn.ping()).await {
            Ok(answered) => answered.map(|()| true),
            Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a pooled connection did not answer a ping: dropped",
            ))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_everywhere() {
        assert_eq!(
            redact_url("postgresql://u:p%40ss@h/db?sslmode=require"),
            "postgresql://u:***@h/db?sslmode=require"
        );
        assert_eq!(redact_url("sqlite:/tmp/x.db"), "sqlite:/tmp/x.db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn a_wrong_scheme_is_refused_with_the_url_redacted() {
        let err = check_scheme("mysql://u:pw@h/db", &["postgres", "postgresql"], "PgStore")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`postgres:` or `postgresql:`"), "{err}");
        assert!(err.contains("mysql://u:***@h/db"), "{err}");
        assert!(!err.contains("pw"), "{err}");
    }
}
