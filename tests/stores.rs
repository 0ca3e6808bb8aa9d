//! Handlers written once for every store (`stores(postgres, sqlite, mysql)`, `inoutbox::sql`),
//! and savepoints inside a handler, through the real inbox path on PostgreSQL, SQLite and
//! (feature `mysql`) MariaDB.

mod support;

use inoutbox::inbox::{Delivery, Inbox, InboxConfig};
use inoutbox::kafka::{HEADER_ID, HEADER_TYPE};
use inoutbox::prelude::*;
use inoutbox::{sql, Outcome};
use serde::{Deserialize, Serialize};
#[cfg(feature = "mysql")]
use support::kit::MySqlKit;
use support::kit::{Kit, PgKit, SqliteKit};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Payment", topic = "payments", key = order_id)]
pub struct Payment {
    pub order_id: Uuid,
    pub total_cents: i64,
}

/// Writes the invoice; writes a second row under a savepoint and rolls the savepoint back.
/// Written once, registered for every store (MySQL's with the `mysql` feature).
#[cfg_attr(
    feature = "mysql",
    inbox_handler(
        event = "Payment",
        group = "savepoint",
        stores(postgres, sqlite, mysql)
    )
)]
#[cfg_attr(
    not(feature = "mysql"),
    inbox_handler(event = "Payment", group = "savepoint", stores(postgres, sqlite))
)]
async fn invoice_with_savepoint<D: Db>(
    event: Payment,
    tx: &mut Tx<'_, D>,
) -> Result<(), HandlerError> {
    let insert = "INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)";
    sql(insert)
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(tx)
        .await?;
    sql("SAVEPOINT discount").execute(tx).await?;
    sql(insert)
        .bind(event.order_id)
        .bind(-1_i64)
        .execute(tx)
        .await?;
    sql("ROLLBACK TO SAVEPOINT discount").execute(tx).await?;
    sql("RELEASE SAVEPOINT discount").execute(tx).await?;
    Ok(())
}

/// The same with sqlx's nested transaction (`begin` on the handler's connection issues a
/// `SAVEPOINT`; dropping it uncommitted rolls back to it), one handler per store.
macro_rules! nested {
    ($tx:ident, $event:ident) => {{
        let insert = "INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)";
        sqlx::query(insert)
            .bind($event.order_id)
            .bind($event.total_cents)
            .execute(&mut **$tx)
            .await?;
        let mut inner = sqlx::Acquire::begin(&mut **$tx).await?;
        sqlx::query(insert)
            .bind($event.order_id)
            .bind(-1_i64)
            .execute(&mut *inner)
            .await?;
        inner.rollback().await?;
        Ok(())
    }};
}

#[inbox_handler(event = "Payment", group = "nested")]
async fn nested_pg(event: Payment, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    nested!(tx, event)
}

#[inbox_handler(event = "Payment", group = "nested")]
async fn nested_sqlite(event: Payment, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    nested!(tx, event)
}

#[cfg(feature = "mysql")]
#[inbox_handler(event = "Payment", group = "nested")]
async fn nested_mysql(event: Payment, tx: &mut inoutbox::MySqlTx<'_>) -> Result<(), HandlerError> {
    // MySQL's placeholders are `?`.
    let insert = "INSERT INTO invoices (order_id, total_cents) VALUES (?, ?)";
    sqlx::query(insert)
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    let mut inner = sqlx::Acquire::begin(&mut **tx).await?;
    sqlx::query(insert)
        .bind(event.order_id)
        .bind(-1_i64)
        .execute(&mut *inner)
        .await?;
    inner.rollback().await?;
    Ok(())
}

fn delivery(offset: i64, id: &str, payment: &Payment) -> Delivery {
    Delivery {
        topic: "payments".into(),
        partition: 0,
        offset,
        key: None,
        payload: Some(serde_json::to_vec(payment).expect("payload")),
        headers: vec![
            (HEADER_ID.to_owned(), Some(id.as_bytes().to_vec())),
            (HEADER_TYPE.to_owned(), Some(b"Payment".to_vec())),
        ],
    }
}

/// A payment delivered twice to `group`: the first run commits the handler's outer write once
/// and nothing of what it rolled back to its savepoint; the second is a duplicate.
async fn savepoint_rolled_back_inside_a_handler_keeps_the_outer_write_once<K: Kit>(group: &str) {
    let kit = K::new(group).await;
    let inbox = Inbox::new(kit.store(), group, InboxConfig::default()).expect("inbox");
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    let payment = Payment {
        order_id: Uuid::new_v4(),
        total_cents: 1250,
    };
    let d = delivery(0, "payment-1", &payment);
    assert_eq!(
        inbox.process(&d, &shutdown).await,
        Outcome::Processed { attempt: 1 },
        "{}: first delivery",
        K::NAME
    );
    assert_eq!(
        inbox
            .process(&delivery(1, "payment-1", &payment), &shutdown)
            .await,
        Outcome::Duplicate,
        "{}: second delivery",
        K::NAME
    );
    let outer = kit
        .count("SELECT count(*) FROM invoices WHERE total_cents = 1250")
        .await;
    let rolled_back = kit
        .count("SELECT count(*) FROM invoices WHERE total_cents = -1")
        .await;
    assert_eq!(
        (outer, rolled_back, kit.processed().await),
        (1, 0, 1),
        "{}: (outer writes, writes rolled back to the savepoint, inbox rows processed)",
        K::NAME
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sql_savepoint_in_a_generic_handler() {
    savepoint_rolled_back_inside_a_handler_keeps_the_outer_write_once::<PgKit>("savepoint").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sql_savepoint_in_a_generic_handler() {
    savepoint_rolled_back_inside_a_handler_keeps_the_outer_write_once::<SqliteKit>("savepoint")
        .await;
}

/// The generic handler, registered by `stores(.., mysql)`, on a `MySqlTx`: `inoutbox::sql`'s
/// `$1`, `$2` become MySQL's `?`.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sql_savepoint_in_a_generic_handler() {
    savepoint_rolled_back_inside_a_handler_keeps_the_outer_write_once::<MySqlKit>("savepoint")
        .await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sqlx_nested_transaction_in_a_handler() {
    savepoint_rolled_back_inside_a_handler_keeps_the_outer_write_once::<MySqlKit>("nested").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sqlx_nested_transaction_in_a_handler() {
    savepoint_rolled_back_inside_a_handler_keeps_the_outer_write_once::<PgKit>("nested").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sqlx_nested_transaction_in_a_handler() {
    savepoint_rolled_back_inside_a_handler_keeps_the_outer_write_once::<SqliteKit>("nested").await;
}

/// `inoutbox::sql` binds and reads the same types on both stores, on a transaction and on a
/// pooled connection.
async fn sql_binds_and_reads_alike<D: Db>(pool: &sqlx::Pool<D>) {
    let name = D::STORE;
    let mut conn = pool.acquire().await.expect("connection");
    sql(
        "CREATE TABLE kinds (id UUID, flag BOOLEAN, small INTEGER, big BIGINT, \
         f DOUBLE PRECISION, t TEXT, b BYTEA, n BIGINT)",
    )
    .execute(&mut conn)
    .await
    .expect("create kinds");
    let id = Uuid::new_v4();
    let mut tx = pool.begin().await.expect("begin");
    let inserted = sql("INSERT INTO kinds VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
        .bind(id)
        .bind(true)
        .bind(7_i32)
        .bind(1_i64 << 40)
        .bind(1.5_f64)
        .bind("text")
        .bind(vec![0_u8, 1, 255])
        .bind(None::<i64>)
        .execute(&mut tx)
        .await
        .expect("insert");
    assert_eq!(inserted, 1, "{name}");
    let row = sql("SELECT id, flag, small, big, f, t, b, n FROM kinds WHERE id = $1")
        .bind(id)
        .fetch_one(&mut tx)
        .await
        .expect("select");
    assert_eq!(row.get::<Uuid>(0).unwrap(), id, "{name}");
    assert!(row.get::<bool>(1).unwrap(), "{name}");
    assert_eq!(row.get::<i32>(2).unwrap(), 7, "{name}");
    assert_eq!(row.get::<i64>(3).unwrap(), 1 << 40, "{name}");
    assert_eq!(row.get::<f64>(4).unwrap(), 1.5, "{name}");
    assert_eq!(row.get::<String>(5).unwrap(), "text", "{name}");
    assert_eq!(row.get::<Vec<u8>>(6).unwrap(), vec![0, 1, 255], "{name}");
    assert_eq!(row.get::<Option<i64>>(7).unwrap(), None, "{name}");
    assert!(row.get::<i64>(7).is_err(), "{name}: NULL is no i64");
    assert!(
        row.get::<String>(3).is_err(),
        "{name}: an integer is no text"
    );
    let none = sql("SELECT id FROM kinds WHERE id = $1")
        .bind(Uuid::new_v4())
        .fetch_optional(&mut tx)
        .await
        .expect("select none");
    assert!(none.is_none(), "{name}");
    tx.rollback().await.expect("rollback");
    let left: i64 = sql("SELECT count(*) FROM kinds")
        .fetch_one(&mut conn)
        .await
        .expect("count")
        .get(0)
        .expect("a number");
    assert_eq!(left, 0, "{name}: rolled back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sql_binds_and_reads_alike() {
    let kit = PgKit::new("sqlrw").await;
    sql_binds_and_reads_alike(kit.store().pool()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sql_binds_and_reads_alike() {
    let kit = SqliteKit::new("sqlrw").await;
    sql_binds_and_reads_alike(kit.store().pool()).await;
}
