// Handlers declared inside a block (a `const _` block, as macros emit them, or a function body)
// are registered like module-level ones.
use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

const _: () = {
    #[inbox_handler(event = "OrderCreated", group = "in-a-const-block")]
    async fn create_invoice(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
};

fn main() {
    #[inbox_handler(event = "OrderCreated", group = "in-a-function-body")]
    async fn audit(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    for group in ["in-a-const-block", "in-a-function-body"] {
        assert!(
            inoutbox::__private::registrations().any(|r| r.group == group),
            "no handler registered for {group}"
        );
    }
}
