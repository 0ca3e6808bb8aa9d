//! [`HandlerTx`]: the transaction types a handler may take. Each backend implements it for its
//! own transaction (`PgTx`, `SqliteTx`), in its room.

use std::any::Any;

/// A transaction type a handler may take as its second parameter (`tx: &mut PgTx<'_>`, or
/// `tx: &mut SqliteTx<'_>` with the `sqlite` feature). It also says which store the handler
/// runs on.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction type inoutbox can hand to a handler",
    label = "expected `&mut PgTx<'_>` (or `&mut SqliteTx<'_>`) here",
    note = "the second parameter of an inbox handler is the transaction inoutbox opens for the \
            message: write `tx: &mut inoutbox::PgTx<'_>` for PostgreSQL or \
            `tx: &mut inoutbox::SqliteTx<'_>` for SQLite",
    note = "inoutbox builds on sqlx 0.9: a transaction of another sqlx major is another type. \
            Depend on `sqlx = \"0.9\"` (`cargo tree -i sqlx` lists every sqlx in the build)"
)]
pub trait HandlerTx: Send {
    /// The same type with its lifetime made `'static`: what the store hands out.
    type Static: Any + Send;
}
