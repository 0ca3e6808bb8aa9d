//! The transaction a MySQL/MariaDB handler takes, and what makes it one.

use crate::handler::HandlerTx;

/// The transaction type a MySQL/MariaDB handler takes: `tx: &mut MySqlTx<'_>`.
pub type MySqlTx<'c> = sqlx::Transaction<'c, sqlx::MySql>;

impl HandlerTx for MySqlTx<'_> {
    type Static = MySqlTx<'static>;
}
