//! The transaction a SQLite handler takes, and what makes it one.

use crate::handler::HandlerTx;

/// The transaction type a SQLite handler takes: `tx: &mut SqliteTx<'_>`.
pub type SqliteTx<'c> = sqlx::Transaction<'c, sqlx::Sqlite>;

impl HandlerTx for SqliteTx<'_> {
    type Static = SqliteTx<'static>;
}
