//! A plain Kafka producer (rdkafka, no inoutbox) that sends `OrderCreated` messages in CloudEvents
//! binary mode, for feeding `examples/billing.rs`. Every `--duplicate-every`-th message is sent
//! twice with the same `ce_id`, the way a retrying producer or relay would.
//!
//! ```text
//! KAFKA_BROKERS=127.0.0.1:9092 cargo run --example send_orders -- --count 10 --duplicate-every 3
//! ```

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{env, flag, order_created_headers, OrderCreated};

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let brokers = env("KAFKA_BROKERS", "127.0.0.1:9092")?;
    let topic = flag(&args, "--topic", "orders")?;
    let count: u32 = flag(&args, "--count", "10")?.parse()?;
    let duplicate_every: u32 = flag(&args, "--duplicate-every", "0")?.parse()?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .create()?;
    let mut sent = 0;
    for i in 1..=count {
        let id = Uuid::now_v7().to_string();
        let order_id = Uuid::new_v4();
        let payload = serde_json::to_vec(&OrderCreated {
            order_id,
            total_cents: 1000 + i64::from(i),
        })?;
        let copies = if duplicate_every > 0 && i % duplicate_every == 0 {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let key = order_id.to_string();
            let record = FutureRecord::to(&topic)
                .key(&key)
                .payload(&payload)
                .headers(order_created_headers(&id, "send_orders"));
            producer
                .send(record, Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)?;
            sent += 1;
        }
    }
    println!(
        "sent {sent} messages ({count} orders, {} duplicates) to {topic}",
        sent - count
    );
    Ok(())
}
