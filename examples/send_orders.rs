//! A plain Kafka producer (rdkafka, no txbox) that sends `OrderCreated` messages in CloudEvents
//! binary mode, for feeding `examples/billing.rs`. Every `--duplicate-every`-th message is sent
//! twice with the same `ce_id`, the way a retrying producer or relay would.
//!
//! ```text
//! KAFKA_BROKERS=127.0.0.1:9092 cargo run --example send_orders -- --count 10 --duplicate-every 3
//! ```

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

fn flag(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let brokers =
        std::env::var("KAFKA_BROKERS").map_err(|_| "set KAFKA_BROKERS (e.g. 127.0.0.1:9092)")?;
    let topic = flag(&args, "--topic", "orders");
    let count: u32 = flag(&args, "--count", "10").parse()?;
    let duplicate_every: u32 = flag(&args, "--duplicate-every", "0").parse()?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .create()?;
    let mut sent = 0;
    for i in 1..=count {
        let id = Uuid::now_v7().to_string();
        let order_id = Uuid::new_v4();
        let payload = serde_json::to_vec(&serde_json::json!({
            "order_id": order_id,
            "total_cents": 1000 + i64::from(i),
        }))?;
        let copies = if duplicate_every > 0 && i % duplicate_every == 0 {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "ce_id",
                    value: Some(id.as_str()),
                })
                .insert(Header {
                    key: "ce_type",
                    value: Some("OrderCreated"),
                })
                .insert(Header {
                    key: "ce_source",
                    value: Some("send_orders"),
                })
                .insert(Header {
                    key: "ce_specversion",
                    value: Some("1.0"),
                })
                .insert(Header {
                    key: "content-type",
                    value: Some("application/json"),
                });
            let key = order_id.to_string();
            let record = FutureRecord::to(&topic)
                .key(&key)
                .payload(&payload)
                .headers(headers);
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
