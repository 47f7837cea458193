//! Two consumers in one process: the reference inventory consumer on `orders` and the payment
//! ledger on `payments`, hosted by one `Worker` over one Service Bus connection and one SQLite
//! store, each with its own consumer name (inbox key) and counters.
//!
//! ```sh
//! cargo run --example two_consumers
//! ```
//!
//! The same message id arrives on both queues: each consumer processes its copy once. Exits
//! non-zero unless both consumers applied each message once.

mod common;
#[path = "payments/consumer.rs"]
mod payments;

use std::process::ExitCode;

use sb_inbox::worker::{ConsumerConfig, Worker};
use sb_inbox::{ConsumerName, Json, Message, SqliteStore};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (emulator, client) = common::embedded(&["orders", "payments"]).await?;
    let store = SqliteStore::open_in_memory()?;
    store.migrate().await?;
    // Each consumer brings its own schema.
    store.migrate_inventory().await?;
    store.apply_migrations(&[payments::MIGRATION]).await?;

    let (orders, ledger) = (client.sender("orders"), client.sender("payments"));
    for i in 0..5 {
        let id = format!("m-{i}");
        let order = format!(r#"{{"orderId":"o-{i}","lines":[{{"sku":"A","quantity":1}}]}}"#);
        for _ in 0..2 {
            orders
                .send(Message::new(&id, "orders.order-placed.v1", order.clone()))
                .await?;
            ledger
                .send(payments::captured(
                    &id,
                    &format!("pay-{i}"),
                    &format!("o-{i}"),
                    100,
                    1,
                ))
                .await?;
        }
    }

    let shutdown = CancellationToken::new();
    let inventory = ConsumerName::new(sb_inbox_cli::inventory::CONSUMER)?;
    let worker = Worker::new(client, store.clone())
        .consumer(
            ConsumerConfig::new(inventory, "orders"),
            OrderPlacedConsumer::new(),
        )
        .consumer(
            ConsumerConfig::new(ConsumerName::new(payments::CONSUMER)?, "payments")
                .with_concurrency(2),
            Json::new(payments::PaymentLedger),
        );
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let drained = common::settled(&emulator, "orders", 10).await
        && common::settled(&emulator, "payments", 10).await;
    shutdown.cancel();
    let stats = running.await??;

    for (name, s) in &stats.consumers {
        println!(
            "{name}: {} processed, {} duplicates",
            s.processed, s.duplicate
        );
    }
    let reservations = store.inventory_counts().await?.reservations;
    let payments = store
        .with_connection(|c| {
            c.query_row("SELECT count(*) FROM payment_ledger", [], |r| {
                r.get::<_, i64>(0)
            })
        })
        .await?;
    println!("reservations: {reservations}, ledger rows: {payments}");
    let each_once = stats
        .consumers
        .iter()
        .all(|(_, s)| (s.processed, s.duplicate) == (5, 5));
    let ok = drained && each_once && reservations == 5 && payments == 5;
    println!("{}", if ok { "OK" } else { "FAILED" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
