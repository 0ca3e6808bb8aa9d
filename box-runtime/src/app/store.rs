//! The store of an [`App`](super::App): opened from a database URL, or the zero-setup SQLite
//! file in a temporary directory removed with the app.

use std::path::PathBuf;

use super::env::{self, Database};
use super::AppError;
use crate::postgres::PgStore;
use crate::store::StoreError;

/// Connections of the PostgreSQL pool [`App::from_env`](super::App::from_env) opens unless
/// `DATABASE_POOL_SIZE` says otherwise: each relay holds three (two workers and its listener),
/// each consumer transaction in flight one.
pub(crate) const PG_POOL_CONNECTIONS: u32 = 16;

/// The store of an [`App`](super::App): PostgreSQL, SQLite or MySQL/MariaDB, with inoutbox's tables migrated.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Store {
    /// PostgreSQL (`DATABASE_URL=postgres://...`).
    Postgres(PgStore),
    /// SQLite (`DATABASE_URL=sqlite:...`, or the zero-setup file).
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sqlite::SqliteStore),
    /// MySQL/MariaDB (`DATABASE_URL=mysql://...`, feature `mysql`).
    #[cfg(feature = "mysql")]
    MySql(crate::mysql::MySqlStore),
}

impl Store {
    /// `"postgres"`, `"sqlite"` or `"mysql"`.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Postgres(_) => "postgres",
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "sqlite",
            #[cfg(feature = "mysql")]
            Store::MySql(_) => "mysql",
        }
    }

    /// Applies inoutbox's migrations (idempotent).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Store::Postgres(store) => store.migrate().await,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(store) => store.migrate().await,
            #[cfg(feature = "mysql")]
            Store::MySql(store) => store.migrate().await,
        }
    }
}

/// The zero-setup database's directory, removed with the app.
pub(super) struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The store `database_url` names, or the zero-setup SQLite file; with the directory to remove
/// and the name for [`App::describe`](super::App::describe).
pub(super) async fn open_store(
    database_url: Option<&str>,
) -> Result<(Store, Option<TempDir>, String), AppError> {
    let pool_size = env::pool_size()?;
    let database = env::database(database_url)?;
    #[cfg(feature = "sqlite")]
    if pool_size.is_some() && matches!(database, Database::Sqlite(_) | Database::ZeroSetup) {
        return Err(AppError::Env {
            variable: env::DATABASE_POOL_SIZE,
            reason: "is set, but the database is SQLite, which has one writer at a time and \
                     sizes its own pool: unset it"
                .to_owned(),
        });
    }
    match database {
        Database::Postgres(url) => {
            let size = pool_size.unwrap_or(PG_POOL_CONNECTIONS);
            let store = PgStore::connect(url, size).await?;
            let name = format!("PostgreSQL ({})", env::postgres_target(url));
            Ok((Store::Postgres(store), None, name))
        }
        #[cfg(feature = "sqlite")]
        Database::Sqlite(url) => {
            let store = crate::sqlite::SqliteStore::connect(url).await?;
            Ok((Store::Sqlite(store), None, format!("SQLite ({url})")))
        }
        #[cfg(feature = "mysql")]
        Database::MySql(url) => {
            let size = pool_size.unwrap_or(crate::mysql::POOL_CONNECTIONS);
            let store = crate::mysql::MySqlStore::connect_sized(url, size).await?;
            let name = format!("MySQL/MariaDB ({})", crate::redact::redact_url(url));
            Ok((Store::MySql(store), None, name))
        }
        #[cfg(feature = "sqlite")]
        Database::ZeroSetup => zero_setup().await,
    }
}

/// A SQLite file in a directory of its own under the system's temporary directory.
#[cfg(feature = "sqlite")]
async fn zero_setup() -> Result<(Store, Option<TempDir>, String), AppError> {
    let dir = std::env::temp_dir().join(format!("inoutbox-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).map_err(|source| AppError::TempDir {
        path: dir.clone(),
        source,
    })?;
    let temp = TempDir(dir);
    let path = temp.0.join("app.db");
    let store = crate::sqlite::SqliteStore::connect(&format!("sqlite:{}", path.display())).await?;
    let name = format!("SQLite ({})", path.display());
    Ok((Store::Sqlite(store), Some(temp), name))
}
