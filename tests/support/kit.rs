//! The stores the contract suite runs against: one generic test body, instantiated for
//! PostgreSQL (a schema per test) and SQLite (a database file per test).

use std::future::Future;

use inoutbox::outbox::OutboxTx;
use inoutbox::relay::{RelayConfig, RelayStore};
use inoutbox::store::InboxStore;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use super::TestDb;

/// A store with its business tables (`invoices`), fresh for one test.
pub trait Kit: Sized + Send + Sync + 'static {
    /// The store.
    type Store: InboxStore<Tx = Self::Tx> + Clone;
    /// Its transaction.
    type Tx: OutboxTx + Send + 'static;
    /// The relay's store on the same database.
    type RelayStore: RelayStore;
    /// Index of the store, for per-store counters in handlers: 0 PostgreSQL, 1 SQLite.
    const INDEX: usize;
    /// For messages.
    const NAME: &'static str;

    /// A fresh, migrated database for test `name`.
    fn new(name: &str) -> impl Future<Output = Self>;
    /// The store.
    fn store(&self) -> Self::Store;
    /// inoutbox's table names.
    fn tables(&self) -> &inoutbox::Tables;
    /// `SELECT count(*) ...` or any query returning one integer.
    fn count(&self, sql: &str) -> impl Future<Output = i64>;
    /// Runs a statement.
    fn exec(&self, sql: &str) -> impl Future<Output = ()>;
    /// A SQL expression for the time `days` ago, in the store's timestamp type.
    fn days_ago(days: u32) -> String;
    /// A relay store on this database.
    fn relay_store(&self) -> Self::RelayStore;
    /// In `tx`: the next sequence number of `key` (a counter row, so numbers follow commit order).
    fn next_seq<'a>(tx: &'a mut Self::Tx, key: &'a str) -> impl Future<Output = i64> + 'a;
    /// In `tx`: an invoice row.
    fn insert_invoice<'a>(
        tx: &'a mut Self::Tx,
        order: uuid::Uuid,
        cents: i64,
    ) -> impl Future<Output = ()> + 'a;

    /// Relay settings for tests: quick polls, no purge.
    fn relay_config() -> RelayConfig {
        let mut config = RelayConfig::default();
        config.source = "inoutbox-tests".to_owned();
        config.poll_interval = std::time::Duration::from_millis(100);
        config.retention = None;
        config
    }

    /// Invoice rows.
    fn invoices(&self) -> impl Future<Output = i64> {
        self.count("SELECT count(*) FROM invoices")
    }

    /// Inbox rows marked processed.
    fn processed(&self) -> impl Future<Output = i64> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE processed_at IS NOT NULL",
            self.tables().inbox
        );
        async move { self.count(&sql).await }
    }

    /// Dead letters.
    fn dead_letters(&self) -> impl Future<Output = i64> {
        let sql = format!("SELECT count(*) FROM {}", self.tables().dead_letters);
        async move { self.count(&sql).await }
    }
}

/// `Kit` methods whose SQL and code are the same on both stores (only `Self::Tx` differs).
macro_rules! same_sql_in_tx {
    () => {
        async fn next_seq<'a>(tx: &'a mut Self::Tx, key: &'a str) -> i64 {
            sqlx::query_scalar(
                "INSERT INTO seq_counters (k, n) VALUES ($1, 1) \
                 ON CONFLICT (k) DO UPDATE SET n = seq_counters.n + 1 RETURNING n",
            )
            .bind(key)
            .fetch_one(&mut **tx)
            .await
            .expect("next seq")
        }

        async fn insert_invoice(tx: &mut Self::Tx, order: uuid::Uuid, cents: i64) {
            sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
                .bind(order)
                .bind(cents)
                .execute(&mut **tx)
                .await
                .expect("insert invoice");
        }
    };
}

/// PostgreSQL: a schema of its own.
pub struct PgKit {
    pub db: TestDb,
    store: inoutbox::PgStore,
}

impl Kit for PgKit {
    type Store = inoutbox::PgStore;
    type Tx = sqlx::Transaction<'static, sqlx::Postgres>;
    type RelayStore = inoutbox::relay::PgRelayStore;
    const INDEX: usize = 0;
    const NAME: &'static str = "postgres";

    async fn new(name: &str) -> Self {
        let db = TestDb::new(name).await;
        let store = db.migrated_store().await;
        sqlx::raw_sql("CREATE TABLE seq_counters (k text PRIMARY KEY, n bigint NOT NULL)")
            .execute(&db.pool)
            .await
            .expect("create seq_counters");
        Self { db, store }
    }

    fn store(&self) -> inoutbox::PgStore {
        self.store.clone()
    }

    fn tables(&self) -> &inoutbox::Tables {
        &self.db.tables
    }

    async fn count(&self, sql: &str) -> i64 {
        self.db.count(sql).await
    }

    async fn exec(&self, sql: &str) {
        self.db.exec(sql).await
    }

    fn days_ago(days: u32) -> String {
        format!("now() - interval '{days} days'")
    }

    fn relay_store(&self) -> Self::RelayStore {
        inoutbox::relay::PgRelayStore::new(self.db.pool.clone(), self.db.tables.clone())
    }

    same_sql_in_tx!();
}

/// SQLite: a database file of its own, in WAL mode.
pub struct SqliteKit {
    _dir: TempDir,
    pool: sqlx::SqlitePool,
    store: inoutbox::SqliteStore,
}

/// A directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("inoutbox-{name}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Kit for SqliteKit {
    type Store = inoutbox::SqliteStore;
    type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;
    type RelayStore = inoutbox::relay::SqliteRelayStore;
    const INDEX: usize = 1;
    const NAME: &'static str = "sqlite";

    async fn new(name: &str) -> Self {
        let dir = TempDir::new(name);
        let options = SqliteConnectOptions::new()
            .filename(dir.0.join("inoutbox.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("open SQLite");
        sqlx::raw_sql(
            "CREATE TABLE invoices (id integer PRIMARY KEY AUTOINCREMENT, order_id blob NOT NULL, \
             total_cents integer NOT NULL, created_at text NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .execute(&pool)
        .await
        .expect("create invoices");
        sqlx::raw_sql("CREATE TABLE seq_counters (k text PRIMARY KEY, n bigint NOT NULL)")
            .execute(&pool)
            .await
            .expect("create seq_counters");
        let store = inoutbox::SqliteStore::new(pool.clone());
        store.migrate().await.expect("migrate SQLite");
        Self {
            _dir: dir,
            pool,
            store,
        }
    }

    fn store(&self) -> inoutbox::SqliteStore {
        self.store.clone()
    }

    fn tables(&self) -> &inoutbox::Tables {
        self.store.tables()
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .expect(sql);
    }

    fn days_ago(days: u32) -> String {
        format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{days} days')")
    }

    fn relay_store(&self) -> Self::RelayStore {
        inoutbox::relay::SqliteRelayStore::new(self.pool.clone(), self.store.tables())
    }

    same_sql_in_tx!();
}

/// MySQL/MariaDB: a database of its own (`t_<name>_<random>`), dropped on drop. The kit's own
/// pool reads double quotes as identifiers (`ANSI_QUOTES`), so that the suite's SQL, written
/// with `Tables`' double-quoted names, runs as it is; the store's pool is left as users have it.
#[cfg(feature = "mysql")]
pub struct MySqlKit {
    name: String,
    ansi: sqlx::MySqlPool,
    pool: sqlx::MySqlPool,
    store: inoutbox::MySqlStore,
}

/// The MariaDB/MySQL server of the tests (`MYSQL_URL`, default the local MariaDB's `test`).
#[cfg(feature = "mysql")]
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A fresh database on the test server: its name and its URL.
#[cfg(feature = "mysql")]
pub async fn mysql_database(name: &str) -> (String, String) {
    use sqlx::Connection;
    let base = mysql_url();
    let mut admin = sqlx::MySqlConnection::connect(&base)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot reach MariaDB at {base}: {e} (start it: `service mariadb start`, or run \
             scripts/test, which starts it)"
            )
        });
    let db = format!(
        "t_{name}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{db}`")))
        .execute(&mut admin)
        .await
        .expect("create database");
    let url = match base.rfind('/') {
        Some(i) if i > "mysql://".len() => format!("{}/{db}", &base[..i]),
        _ => format!("{base}/{db}"),
    };
    (db, url)
}

/// Drops a database of [`mysql_database`], best effort (waiting at most 60 s for the locks of
/// sessions still open on it).
#[cfg(feature = "mysql")]
pub async fn drop_mysql_database(name: &str) {
    use sqlx::Connection;
    if let Ok(mut c) = sqlx::MySqlConnection::connect(&mysql_url()).await {
        let drop = format!("SET SESSION lock_wait_timeout = 60; DROP DATABASE IF EXISTS `{name}`");
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
            .execute(&mut c)
            .await;
    }
}

#[cfg(feature = "mysql")]
impl Drop for MySqlKit {
    fn drop(&mut self) {
        // Best effort, on a thread of its own (the test's runtime may be shutting down).
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(drop_mysql_database(&name));
        })
        .join();
    }
}

#[cfg(feature = "mysql")]
impl Kit for MySqlKit {
    type Store = inoutbox::MySqlStore;
    type Tx = sqlx::Transaction<'static, sqlx::MySql>;
    type RelayStore = inoutbox::relay::MySqlRelayStore;
    const INDEX: usize = 2;
    const NAME: &'static str = "mysql";

    async fn new(name: &str) -> Self {
        let (db, url) = mysql_database(name).await;
        let store = inoutbox::MySqlStore::connect(&url)
            .await
            .expect("connect to MariaDB");
        let pool = store.pool().clone();
        let ansi = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(4)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::raw_sql("SET SESSION sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES')")
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
            })
            .connect(&url)
            .await
            .expect("connect to MariaDB");
        sqlx::raw_sql(
            "CREATE TABLE invoices (id bigint AUTO_INCREMENT PRIMARY KEY, order_id binary(16) NOT NULL, \
             total_cents bigint NOT NULL, created_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)); \
             CREATE TABLE seq_counters (k varchar(255) PRIMARY KEY, n bigint NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("create invoices and seq_counters");
        store.migrate().await.expect("migrate MariaDB");
        Self {
            name: db,
            ansi,
            pool,
            store,
        }
    }

    fn store(&self) -> inoutbox::MySqlStore {
        self.store.clone()
    }

    fn tables(&self) -> &inoutbox::Tables {
        self.store.tables()
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.ansi)
            .await
            .expect(sql)
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.ansi)
            .await
            .expect(sql);
    }

    fn days_ago(days: u32) -> String {
        format!("(NOW(6) - INTERVAL {days} DAY)")
    }

    fn relay_store(&self) -> Self::RelayStore {
        inoutbox::relay::MySqlRelayStore::new(self.pool.clone(), self.store.tables())
    }

    async fn next_seq<'a>(tx: &'a mut Self::Tx, key: &'a str) -> i64 {
        sqlx::query(
            "INSERT INTO seq_counters (k, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1",
        )
        .bind(key)
        .execute(&mut **tx)
        .await
        .expect("next seq");
        sqlx::query_scalar("SELECT n FROM seq_counters WHERE k = ?")
            .bind(key)
            .fetch_one(&mut **tx)
            .await
            .expect("next seq")
    }

    async fn insert_invoice(tx: &mut Self::Tx, order: uuid::Uuid, cents: i64) {
        sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES (?, ?)")
            .bind(order)
            .bind(cents)
            .execute(&mut **tx)
            .await
            .expect("insert invoice");
    }
}

/// Runs each named generic test body `async fn name<K: Kit>()` against every store:
/// `postgres::name`, `sqlite::name` and, with the `mysql` feature, `mysql::name`.
#[macro_export]
macro_rules! contract_tests {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name::<$crate::support::kit::PgKit>().await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name::<$crate::support::kit::SqliteKit>().await
                }
            )*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name::<$crate::support::kit::MySqlKit>().await
                }
            )*
        }
    };
}

/// Runs each named generic test body `async fn name<K: Kit, B: Bus>()` against every store on
/// every broker: on Kafka as `postgres::name`, `sqlite::name` and, with the `mysql` feature,
/// `mysql::name`; with the `nats` feature, on NATS JetStream as `nats::postgres::name`,
/// `nats::sqlite::name` and `nats::mysql::name`.
#[macro_export]
macro_rules! broker_contract_tests {
    ($($name:ident),* $(,)?) => {
        $crate::broker_contract_tests!(@stores $crate::support::bus::Kafka, $($name),*);
        #[cfg(feature = "nats")]
        mod nats {
            #[allow(unused_imports)]
            use super::*;
            $crate::broker_contract_tests!(@stores $crate::support::bus::Nats, $($name),*);
        }
    };
    (@stores $bus:ty, $($name:ident),*) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name::<$crate::support::kit::PgKit, $bus>().await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name::<$crate::support::kit::SqliteKit, $bus>().await
                }
            )*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name::<$crate::support::kit::MySqlKit, $bus>().await
                }
            )*
        }
    };
}

/// Declares one `#[inbox_handler]` per store for an `OrderCreated` handler body. The body sees
/// the event, the transaction, the metadata and `store`: the kit index, plus 3 for a message
/// of the contract suite's NATS topics (`support::bus::slot`), for per-test counters.
#[macro_export]
macro_rules! handlers {
    ($group:tt, |$event:ident, $tx:ident, $meta:ident, $store:ident| $body:block) => {
        const _: () = {
            use inoutbox::prelude::*;

            #[inbox_handler(event = "OrderCreated", group = $group)]
            async fn on_postgres(
                $event: OrderCreated,
                $tx: &mut PgTx<'_>,
                $meta: &MessageMeta,
            ) -> Result<(), HandlerError> {
                let $store: usize = $crate::support::bus::slot(0, &$meta.topic);
                let _ = (&$meta, $store);
                $body
            }

            #[inbox_handler(event = "OrderCreated", group = $group)]
            async fn on_sqlite(
                $event: OrderCreated,
                $tx: &mut inoutbox::SqliteTx<'_>,
                $meta: &MessageMeta,
            ) -> Result<(), HandlerError> {
                let $store: usize = $crate::support::bus::slot(1, &$meta.topic);
                let _ = (&$meta, $store);
                $body
            }

            #[cfg(feature = "mysql")]
            #[inbox_handler(event = "OrderCreated", group = $group)]
            async fn on_mysql(
                $event: OrderCreated,
                $tx: &mut inoutbox::MySqlTx<'_>,
                $meta: &MessageMeta,
            ) -> Result<(), HandlerError> {
                let $store: usize = $crate::support::bus::slot(2, &$meta.topic);
                let _ = (&$meta, $store);
                $body
            }
        };
    };
}

/// Inserts the event's invoice through the handler's transaction (same SQL on every store:
/// `inoutbox::sql` binds `$n` on MySQL too).
#[macro_export]
macro_rules! insert_invoice {
    ($event:expr, $tx:expr) => {
        inoutbox::sql("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
            .bind($event.order_id)
            .bind($event.total_cents)
            .execute(&mut **$tx)
            .await
            .map(|_| ())
            .map_err(inoutbox::HandlerError::from)
    };
}
