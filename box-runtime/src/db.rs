//! Handlers written once for every store: the [`Db`] trait, implemented for PostgreSQL and SQLite,
//! and [`sql`], statements whose values are bound and whose rows are read the same way on both,
//! so that generic code needs no sqlx trait bounds.

use std::future::Future;
use std::pin::Pin;

use sqlx::{Column as _, Row as _, SqlSafeStr, SqlStr, TypeInfo as _, ValueRef as _};
use uuid::Uuid;

use crate::outbox::{EnqueueError, NewRow, OutboxTx};

/// The transaction of a handler generic over its store: `tx: &mut Tx<'_, D>` with `D: Db`
/// (`Tx<'_, sqlx::Postgres>` is [`PgTx`](crate::PgTx)).
pub type Tx<'c, D> = sqlx::Transaction<'c, D>;

/// A boxed, sendable future.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::Postgres {}
    #[cfg(feature = "sqlite")]
    impl Sealed for sqlx::Sqlite {}
    #[cfg(feature = "mysql")]
    impl Sealed for sqlx::MySql {}
}

/// A database inoutbox runs on: `sqlx::Postgres`, `sqlx::Sqlite` with the `sqlite` feature, or
/// `sqlx::MySql` with the `mysql` feature.
///
/// A handler generic over it is written once and registered for each store listed in
/// `#[inbox_handler(.., stores(postgres, sqlite, mysql))]`. Its body writes through [`sql`] and
/// enqueues with [`inoutbox::outbox::enqueue`](crate::outbox::enqueue), which work on a
/// `&mut Tx<'_, D>` for every `D: Db` without further bounds.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database inoutbox runs on",
    note = "inoutbox runs on `sqlx::Postgres` and `sqlx::Sqlite`: write `D: inoutbox::Db` and let \
            `stores(postgres, sqlite)` pick them"
)]
pub trait Db: sqlx::Database + sealed::Sealed {
    /// The store's name in `stores(..)`: `"postgres"`, `"sqlite"` or `"mysql"`.
    const STORE: &'static str;

    /// Runs a statement; returns the rows affected.
    #[doc(hidden)]
    fn run<'a>(
        conn: &'a mut Self::Connection,
        sql: SqlStr,
        args: Vec<Value>,
    ) -> BoxFuture<'a, Result<u64, sqlx::Error>>;

    /// Runs a query; returns its rows.
    #[doc(hidden)]
    fn fetch<'a>(
        conn: &'a mut Self::Connection,
        sql: SqlStr,
        args: Vec<Value>,
    ) -> BoxFuture<'a, Result<Vec<Row>, sqlx::Error>>;

    /// Inserts outbox rows (default table) on the connection.
    #[doc(hidden)]
    fn enqueue(
        conn: &mut Self::Connection,
        rows: Vec<NewRow>,
    ) -> BoxFuture<'_, Result<Vec<Uuid>, EnqueueError>>;
}

impl<D: Db> crate::sealed::Sealed for sqlx::Transaction<'_, D> {}
impl<D: Db> crate::sealed::Sealed for sqlx::pool::PoolConnection<D> {}

impl<D: Db> OutboxTx for sqlx::Transaction<'_, D> {
    fn insert_rows(
        &mut self,
        rows: Vec<NewRow>,
    ) -> impl Future<Output = Result<Vec<Uuid>, EnqueueError>> + Send {
        D::enqueue(&mut **self, rows)
    }
}

/// A value bound to a statement's `$1`, `$2`, ...: converted from `bool`, `i32`, `i64`, `f64`,
/// `&str`, `String`, `Uuid`, `Vec<u8>`, `&[u8]`, or an `Option` of one of them (`None` is a
/// typed `NULL`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// A boolean.
    Bool(Option<bool>),
    /// A 32-bit integer (PostgreSQL `int4`).
    I32(Option<i32>),
    /// A 64-bit integer (PostgreSQL `int8`, SQLite `INTEGER`).
    I64(Option<i64>),
    /// A float.
    F64(Option<f64>),
    /// Text.
    Text(Option<String>),
    /// Bytes.
    Bytes(Option<Vec<u8>>),
    /// A UUID (PostgreSQL `uuid`, SQLite a 16-byte blob).
    Uuid(Option<Uuid>),
}

macro_rules! value_from {
    ($($ty:ty => $variant:ident $(via $conv:expr)?),* $(,)?) => {$(
        impl From<$ty> for Value {
            fn from(value: $ty) -> Self {
                Value::$variant(Some(value $(.pipe($conv))?))
            }
        }
        impl From<Option<$ty>> for Value {
            fn from(value: Option<$ty>) -> Self {
                Value::$variant(value $(.map($conv))?)
            }
        }
    )*};
}

/// `value.pipe(f)` is `f(value)`: lets [`value_from!`] convert borrowed values.
trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl<T> Pipe for T {}

value_from! {
    bool => Bool,
    i32 => I32,
    i64 => I64,
    f64 => F64,
    String => Text,
    &str => Text via str::to_owned,
    &String => Text via String::clone,
    Uuid => Uuid,
    &Uuid => Uuid via |u: &Uuid| *u,
    Vec<u8> => Bytes,
    &[u8] => Bytes via <[u8]>::to_vec,
}

/// One column of a fetched row (read it with [`Row::get`]).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Bool(bool),
    I64(i64),
    F64(f64),
    Text(String),
    Bytes(Vec<u8>),
    Uuid(Uuid),
}

/// A row fetched by [`Sql::fetch_all`], [`Sql::fetch_optional`] or [`Sql::fetch_one`], read
/// with [`Row::get`].
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    cells: Vec<Cell>,
}

impl Row {
    /// Column `index` (from 0) as `T`: `bool`, `i32`, `i64`, `f64`, `String`, `Uuid`,
    /// `Vec<u8>`, or `Option` of one of them for a nullable column.
    pub fn get<T: FromColumn>(&self, index: usize) -> Result<T, sqlx::Error> {
        let cell = self
            .cells
            .get(index)
            .ok_or(sqlx::Error::ColumnIndexOutOfBounds {
                index,
                len: self.cells.len(),
            })?;
        T::from_cell(cell).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: index.to_string(),
            source: format!("cannot read {cell:?} as `{}`", std::any::type_name::<T>()).into(),
        })
    }

    /// The number of columns.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether the row has no column.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
}

/// A type a column of a [`Row`] can be read as.
#[diagnostic::on_unimplemented(
    message = "a column cannot be read as `{Self}`",
    note = "read `bool`, `i32`, `i64`, `f64`, `String`, `Uuid`, `Vec<u8>`, or an `Option` of \
            one of them"
)]
pub trait FromColumn: Sized {
    /// `None` when the column holds something else.
    #[doc(hidden)]
    fn from_cell(cell: &Cell) -> Option<Self>;
}

impl FromColumn for bool {
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Bool(b) => Some(*b),
            Cell::I64(i) => Some(*i != 0),
            _ => None,
        }
    }
}

impl FromColumn for i64 {
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::I64(i) => Some(*i),
            _ => None,
        }
    }
}

impl FromColumn for i32 {
    fn from_cell(cell: &Cell) -> Option<Self> {
        i64::from_cell(cell).and_then(|i| i32::try_from(i).ok())
    }
}

impl FromColumn for f64 {
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::F64(f) => Some(*f),
            Cell::I64(i) => Some(*i as f64),
            _ => None,
        }
    }
}

impl FromColumn for String {
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Text(s) => Some(s.clone()),
            Cell::Uuid(u) => Some(u.to_string()),
            _ => None,
        }
    }
}

impl FromColumn for Vec<u8> {
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Bytes(b) => Some(b.clone()),
            _ => None,
        }
    }
}

impl FromColumn for Uuid {
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Uuid(u) => Some(*u),
            Cell::Bytes(b) => Uuid::from_slice(b).ok(),
            Cell::Text(s) => s.parse().ok(),
            _ => None,
        }
    }
}

impl<T: FromColumn> FromColumn for Option<T> {
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Null => Some(None),
            other => T::from_cell(other).map(Some),
        }
    }
}

/// What [`Sql`] runs on: a handler's `tx` (`&mut Tx<'_, D>`, also written `&mut *tx`), a
/// producer's `&mut tx`, a pooled connection (`&mut pool.acquire().await?`), or a connection
/// (`&mut **tx`).
#[diagnostic::on_unimplemented(
    message = "a statement cannot run on `{Self}`",
    label = "expected a transaction or a connection of PostgreSQL, SQLite or MySQL",
    note = "in a handler, pass its transaction as it is: `.execute(tx)`; with a transaction \
            you own, `.execute(&mut tx)`"
)]
pub trait Executes: crate::sealed::Sealed + Send {
    /// The database.
    type Db: Db;
    /// The connection to run on.
    fn connection(&mut self) -> &mut <Self::Db as sqlx::Database>::Connection;
}

impl<D: Db> Executes for sqlx::Transaction<'_, D> {
    type Db = D;
    fn connection(&mut self) -> &mut D::Connection {
        self
    }
}

impl<D: Db> Executes for sqlx::pool::PoolConnection<D> {
    type Db = D;
    fn connection(&mut self) -> &mut D::Connection {
        self
    }
}

impl Executes for sqlx::PgConnection {
    type Db = sqlx::Postgres;
    fn connection(&mut self) -> &mut sqlx::PgConnection {
        self
    }
}

#[cfg(feature = "sqlite")]
impl Executes for sqlx::SqliteConnection {
    type Db = sqlx::Sqlite;
    fn connection(&mut self) -> &mut sqlx::SqliteConnection {
        self
    }
}

/// A statement for any store; see [`sql`].
#[must_use = "a statement does nothing until `execute` or a `fetch_*` is awaited"]
#[derive(Debug, Clone)]
pub struct Sql {
    sql: SqlStr,
    args: Vec<Value>,
}

/// A statement with `$1`, `$2`, ... placeholders, run the same way on PostgreSQL and SQLite.
///
/// Like sqlx 0.9's `query`, it takes a `&'static str`, or a string built at run time wrapped in
/// `sqlx::AssertSqlSafe` (bind values, never format them into the text):
///
/// ```no_run
/// # async fn reserve<D: inoutbox::Db>(tx: &mut inoutbox::Tx<'_, D>) -> Result<(), sqlx::Error> {
/// let reserved = inoutbox::sql("UPDATE stock SET available = available - $1 WHERE sku = $2 AND available >= $1")
///     .bind(2_i64)
///     .bind("apple")
///     .execute(tx)
///     .await?;
/// let left: i64 = inoutbox::sql("SELECT available FROM stock WHERE sku = $1")
///     .bind("apple")
///     .fetch_one(tx)
///     .await?
///     .get(0)?;
/// # Ok(()) }
/// ```
pub fn sql(sql: impl SqlSafeStr) -> Sql {
    Sql {
        sql: sql.into_sql_str(),
        args: Vec::new(),
    }
}

impl Sql {
    /// Binds the next placeholder.
    pub fn bind(mut self, value: impl Into<Value>) -> Self {
        self.args.push(value.into());
        self
    }

    /// Runs the statement; returns the number of rows affected.
    pub async fn execute<E: Executes + ?Sized>(self, on: &mut E) -> Result<u64, sqlx::Error> {
        E::Db::run(on.connection(), self.sql, self.args).await
    }

    /// Runs the query; returns every row.
    pub async fn fetch_all<E: Executes + ?Sized>(
        self,
        on: &mut E,
    ) -> Result<Vec<Row>, sqlx::Error> {
        E::Db::fetch(on.connection(), self.sql, self.args).await
    }

    /// Runs the query; returns its first row, if any.
    pub async fn fetch_optional<E: Executes + ?Sized>(
        self,
        on: &mut E,
    ) -> Result<Option<Row>, sqlx::Error> {
        Ok(self.fetch_all(on).await?.into_iter().next())
    }

    /// Runs the query; returns its first row, or `sqlx::Error::RowNotFound`.
    pub async fn fetch_one<E: Executes + ?Sized>(self, on: &mut E) -> Result<Row, sqlx::Error> {
        self.fetch_optional(on)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }
}

/// Binds `$args` to a query of `$db`.
macro_rules! bind_all {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for value in $args {
            query = match value {
                Value::Bool(v) => query.bind(v),
                Value::I32(v) => query.bind(v),
                Value::I64(v) => query.bind(v),
                Value::F64(v) => query.bind(v),
                Value::Text(v) => query.bind(v),
                Value::Bytes(v) => query.bind(v),
                Value::Uuid(v) => query.bind(v),
            };
        }
        query
    }};
}

fn unsupported(index: usize, type_name: &str) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: index.to_string(),
        source: format!("inoutbox::sql reads no column of type {type_name}; cast it in SQL").into(),
    }
}

/// `Db` for one sqlx database: the same statements on its connection, rows read by `$row`.
macro_rules! impl_db {
    ($db:ty, $conn:ty, $store:literal, $row:path) => {
        impl Db for $db {
            const STORE: &'static str = $store;

            fn run<'a>(
                conn: &'a mut $conn,
                sql: SqlStr,
                args: Vec<Value>,
            ) -> BoxFuture<'a, Result<u64, sqlx::Error>> {
                Box::pin(async move {
                    let query = bind_all!(sqlx::query(sql), args);
                    Ok(query.execute(conn).await?.rows_affected())
                })
            }

            fn fetch<'a>(
                conn: &'a mut $conn,
                sql: SqlStr,
                args: Vec<Value>,
            ) -> BoxFuture<'a, Result<Vec<Row>, sqlx::Error>> {
                Box::pin(async move {
                    let query = bind_all!(sqlx::query(sql), args);
                    let rows = query.fetch_all(conn).await?;
                    rows.iter().map($row).collect()
                })
            }

            fn enqueue(
                conn: &mut $conn,
                rows: Vec<NewRow>,
            ) -> BoxFuture<'_, Result<Vec<Uuid>, EnqueueError>> {
                Box::pin(OutboxTx::insert_rows(conn, rows))
            }
        }
    };
}

impl_db!(sqlx::Postgres, sqlx::PgConnection, "postgres", pg_row);

fn pg_row(row: &sqlx::postgres::PgRow) -> Result<Row, sqlx::Error> {
    let mut cells = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        if row.try_get_raw(i)?.is_null() {
            cells.push(Cell::Null);
            continue;
        }
        cells.push(match column.type_info().name() {
            "BOOL" => Cell::Bool(row.try_get(i)?),
            "INT2" => Cell::I64(row.try_get::<i16, _>(i)?.into()),
            "INT4" => Cell::I64(row.try_get::<i32, _>(i)?.into()),
            "INT8" => Cell::I64(row.try_get(i)?),
            "FLOAT4" => Cell::F64(row.try_get::<f32, _>(i)?.into()),
            "FLOAT8" => Cell::F64(row.try_get(i)?),
            "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" => Cell::Text(row.try_get(i)?),
            "UUID" => Cell::Uuid(row.try_get(i)?),
            "BYTEA" => Cell::Bytes(row.try_get(i)?),
            "JSON" | "JSONB" => Cell::Text(row.try_get::<serde_json::Value, _>(i)?.to_string()),
            other => return Err(unsupported(i, other)),
        });
    }
    Ok(Row { cells })
}

#[cfg(feature = "sqlite")]
impl_db!(sqlx::Sqlite, sqlx::SqliteConnection, "sqlite", sqlite_row);

#[cfg(feature = "sqlite")]
fn sqlite_row(row: &sqlx::sqlite::SqliteRow) -> Result<Row, sqlx::Error> {
    let mut cells = Vec::with_capacity(row.len());
    for i in 0..row.len() {
        let raw = row.try_get_raw(i)?;
        if raw.is_null() {
            cells.push(Cell::Null);
            continue;
        }
        // The value's own storage class (SQLite columns are dynamically typed).
        let class = raw.type_info().name().to_owned();
        cells.push(match class.as_str() {
            "INTEGER" | "BOOLEAN" => Cell::I64(row.try_get(i)?),
            "REAL" => Cell::F64(row.try_get(i)?),
            "TEXT" => Cell::Text(row.try_get(i)?),
            "BLOB" => Cell::Bytes(row.try_get(i)?),
            other => return Err(unsupported(i, other)),
        });
    }
    Ok(Row { cells })
}

#[cfg(feature = "mysql")]
impl Executes for sqlx::MySqlConnection {
    type Db = sqlx::MySql;
    fn connection(&mut self) -> &mut sqlx::MySqlConnection {
        self
    }
}

/// `Db` for MySQL/MariaDB: a statement written with `$1`, `$2`, ... is rewritten to MySQL's
/// `?`, each bound in the order its placeholder appears (a placeholder used twice is bound
/// twice); one written with `?` runs as it is.
#[cfg(feature = "mysql")]
impl Db for sqlx::MySql {
    const STORE: &'static str = "mysql";

    fn run<'a>(
        conn: &'a mut sqlx::MySqlConnection,
        sql: SqlStr,
        args: Vec<Value>,
    ) -> BoxFuture<'a, Result<u64, sqlx::Error>> {
        Box::pin(async move {
            let (sql, args) = positional(sql, args)?;
            let query = bind_all!(sqlx::query(sql), args);
            Ok(query.execute(conn).await?.rows_affected())
        })
    }

    fn fetch<'a>(
        conn: &'a mut sqlx::MySqlConnection,
        sql: SqlStr,
        args: Vec<Value>,
    ) -> BoxFuture<'a, Result<Vec<Row>, sqlx::Error>> {
        Box::pin(async move {
            let (sql, args) = positional(sql, args)?;
            let query = bind_all!(sqlx::query(sql), args);
            let rows = query.fetch_all(conn).await?;
            rows.iter().map(mysql_row).collect()
        })
    }

    fn enqueue(
        conn: &mut sqlx::MySqlConnection,
        rows: Vec<NewRow>,
    ) -> BoxFuture<'_, Result<Vec<Uuid>, EnqueueError>> {
        Box::pin(OutboxTx::insert_rows(conn, rows))
    }
}

/// `$n` placeholders (outside quotes) rewritten to `?`, with the values in the order they are
/// now bound; a statement without them is returned as it is.
#[cfg(feature = "mysql")]
fn positional(sql: SqlStr, args: Vec<Value>) -> Result<(SqlStr, Vec<Value>), sqlx::Error> {
    let (out, numbers) = numbered_to_marks(sql.as_str());
    if numbers.is_empty() {
        return Ok((sql, args));
    }
    let order = numbers
        .into_iter()
        .map(|n| {
            n.checked_sub(1)
                .and_then(|i| args.get(i))
                .cloned()
                .ok_or_else(|| sqlx::Error::Protocol(format!("${n} has no bound value")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((sqlx::AssertSqlSafe(out).into_sql_str(), order))
}

/// `sql` with its `$n` placeholders outside quotes (`'..'`, `".."`, `` `..` ``) rewritten to
/// MySQL's `?`, and the numbers they had, in the order they stood: the one scanner of the
/// handlers' statements ([`positional`]) and the store's own (`mysql::adapt`).
#[cfg(feature = "mysql")]
pub(crate) fn numbered_to_marks(sql: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(sql.len());
    let mut numbers = Vec::new();
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), '\\') => out.extend(chars.next()),
            (Some(_), _) => {}
            (None, '\'' | '"' | '`') => quote = Some(c),
            (None, '$') if chars.peek().is_some_and(char::is_ascii_digit) => {
                out.pop();
                let mut n = 0_usize;
                while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                    n = n.saturating_mul(10).saturating_add(d as usize);
                    chars.next();
                }
                numbers.push(n);
                out.push('?');
            }
            (None, _) => {}
        }
    }
    (out, numbers)
}

#[cfg(feature = "mysql")]
fn mysql_row(row: &sqlx::mysql::MySqlRow) -> Result<Row, sqlx::Error> {
    let mut cells = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        if row.try_get_raw(i)?.is_null() {
            cells.push(Cell::Null);
            continue;
        }
        cells.push(match column.type_info().name() {
            "BOOLEAN" => Cell::Bool(row.try_get(i)?),
            "TINYINT" => Cell::I64(row.try_get::<i8, _>(i)?.into()),
            "SMALLINT" => Cell::I64(row.try_get::<i16, _>(i)?.into()),
            "INT" | "MEDIUMINT" => Cell::I64(row.try_get::<i32, _>(i)?.into()),
            "BIGINT" => Cell::I64(row.try_get(i)?),
            "TINYINT UNSIGNED" | "SMALLINT UNSIGNED" | "MEDIUMINT UNSIGNED" | "INT UNSIGNED" => {
                Cell::I64(row.try_get::<u32, _>(i)?.into())
            }
            "BIGINT UNSIGNED" => {
                let n: u64 = row.try_get(i)?;
                Cell::I64(i64::try_from(n).map_err(|e| sqlx::Error::ColumnDecode {
                    index: i.to_string(),
                    source: e.into(),
                })?)
            }
            "FLOAT" => Cell::F64(row.try_get::<f32, _>(i)?.into()),
            "DOUBLE" => Cell::F64(row.try_get(i)?),
            "VARCHAR" | "CHAR" | "TEXT" | "TINYTEXT" | "MEDIUMTEXT" | "LONGTEXT" | "ENUM" => {
                Cell::Text(row.try_get(i)?)
            }
            "BINARY" | "VARBINARY" | "BLOB" | "TINYBLOB" | "MEDIUMBLOB" | "LONGBLOB" => {
                Cell::Bytes(row.try_get(i)?)
            }
            other => return Err(unsupported(i, other)),
        });
    }
    Ok(Row { cells })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "mysql")]
    #[test]
    fn numbered_placeholders_become_marks_bound_in_order() {
        let (sql, args) = positional(
            "UPDATE s SET a = a - $1 WHERE k = $2 AND a >= $1 AND n <> '$3'".into_sql_str(),
            vec![Value::from(2_i64), Value::from("apple")],
        )
        .unwrap();
        assert_eq!(
            sql.as_str(),
            "UPDATE s SET a = a - ? WHERE k = ? AND a >= ? AND n <> '$3'"
        );
        assert_eq!(
            args,
            vec![Value::from(2_i64), Value::from("apple"), Value::from(2_i64)]
        );
    }

    #[test]
    fn values_convert_from_the_types_handlers_bind() {
        assert_eq!(Value::from(3_i64), Value::I64(Some(3)));
        assert_eq!(Value::from("a"), Value::Text(Some("a".into())));
        assert_eq!(Value::from(None::<Uuid>), Value::Uuid(None));
        assert_eq!(Value::from(&[1_u8, 2][..]), Value::Bytes(Some(vec![1, 2])));
    }

    #[test]
    fn columns_read_as_the_types_asked_or_fail() {
        let id = Uuid::new_v4();
        let row = Row {
            cells: vec![
                Cell::I64(1),
                Cell::Bytes(id.as_bytes().to_vec()),
                Cell::Null,
            ],
        };
        assert!(row.get::<bool>(0).unwrap());
        assert_eq!(row.get::<Uuid>(1).unwrap(), id);
        assert_eq!(row.get::<Option<i64>>(2).unwrap(), None);
        assert!(row.get::<i64>(2).is_err());
        assert!(row.get::<String>(0).is_err());
        assert!(row.get::<i64>(3).is_err());
    }
}
