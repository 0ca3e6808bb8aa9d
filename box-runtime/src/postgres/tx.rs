//! The transaction a PostgreSQL handler takes, and what makes it one.

use crate::handler::HandlerTx;

/// The transaction type a PostgreSQL handler takes: `tx: &mut PgTx<'_>`.
pub type PgTx<'c> = sqlx::Transaction<'c, sqlx::Postgres>;

impl HandlerTx for PgTx<'_> {
    type Static = PgTx<'static>;
}
