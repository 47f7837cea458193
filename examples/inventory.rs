//! The reference inventory consumer (`inventory.order-placed.v1`), hosted by a `Worker` on the
//! embedded emulator and SQLite: what `sb-inbox run` does, in code.
//!
//! ```sh
//! cargo run --example inventory
//! ```
//!
//! Sends ten orders, three of them twice and one malformed message; exits non-zero unless each
//! order is reserved once.

mod common;

use std::process::ExitCode;

use sb_inbox::worker::{ConsumerConfig, Worker};
use sb_inbox::{ConsumerName, Message, SqliteStore};
use sb_inbox_cli::inventory::{CONSUMER, InventoryStore, OrderPlacedConsumer};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (emulator, client) = common::embedded(&["orders"]).await?;
    let store = SqliteStore::open_in_memory()?;
    store.migrate().await?;
    store.migrate_inventory().await?;

    let sender = client.sender("orders");
    let mut sent = 0;
    for i in 0..10 {
        let body = format!(r#"{{"orderId":"o-{i}","lines":[{{"sku":"A","quantity":2}}]}}"#);
        let copies = if i < 3 { 2 } else { 1 };
        for _ in 0..copies {
            sender
                .send(Message::new(
                    format!("m-{i}"),
                    "orders.order-placed.v1",
                    body.clone(),
                ))
                .await?;
            sent += 1;
        }
    }
    sender
        .send(Message::new("poison", "orders.order-placed.v1", "{nope"))
        .await?;
    sent += 1;

    let shutdown = CancellationToken::new();
    let config = ConsumerConfig::new(ConsumerName::new(CONSUMER)?, "orders").with_concurrency(4);
    let worker = Worker::new(client, store.clone()).consumer(config, OrderPlacedConsumer::new());
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let drained = common::settled(&emulator, "orders", sent).await;
    shutdown.cancel();
    let stats = running.await??.total();

    let counts = store.inventory_counts().await?;
    println!(
        "worker: {} processed, {} duplicates, {} dead-lettered",
        stats.processed, stats.duplicate, stats.permanent
    );
    println!(
        "reservations: {}, reserved units: {}",
        counts.reservations, counts.reserved_units
    );
    let ok = drained && counts.reservations == 10 && counts.reserved_units == 20;
    println!("{}", if ok { "OK" } else { "FAILED" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
