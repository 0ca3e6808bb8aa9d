mod billing {
    pub mod handlers {
        use serde::{Deserialize, Serialize};
        use inoutbox::prelude::*;

        #[derive(Debug, Serialize, Deserialize, OutboxEvent)]
        #[outbox(event_type = "OrderCreated", topic = "orders")]
        pub struct OrderCreated {
            pub order_id: u64,
        }

        #[inbox_handler(event = "OrderCreated", group = "billing")]
        pub async fn create_invoice(
            _event: OrderCreated,
            _tx: &mut PgTx<'_>,
        ) -> Result<(), HandlerError> {
            Ok(())
        }
    }
}

#[allow(dead_code)]
async fn call_directly(tx: &mut inoutbox::PgTx<'_>) -> Result<(), inoutbox::HandlerError> {
    billing::handlers::create_invoice(billing::handlers::OrderCreated { order_id: 1 }, tx).await
}

fn main() {}
