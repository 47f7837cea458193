//! A typed JSON consumer on SQLite, hosted by a `Worker`: `payments.payment-captured.v1` →
//! a payment ledger, using the business idempotency key and the aggregate version check.
//!
//! ```sh
//! cargo run --example payments
//! ```
//!
//! Runs on the embedded emulator and an in-memory SQLite database. It sends a capture, its exact
//! redelivery, the same capture republished under another message id, a newer capture, a late
//! older one and a malformed one; prints what the worker did and exits non-zero unless the
//! ledger holds exactly the newest capture.

#[path = "../common/mod.rs"]
mod common;
mod consumer;

use std::process::ExitCode;

use sb_inbox::worker::{ConsumerConfig, Worker};
use sb_inbox::{ConsumerName, Json, SqliteStore};
use tokio_util::sync::CancellationToken;

use consumer::{CONSUMER, MIGRATION, PaymentLedger, captured};

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (emulator, client) = common::embedded(&["payments"]).await?;
    let store = SqliteStore::open_in_memory()?;
    store.migrate().await?;
    store.apply_migrations(&[MIGRATION]).await?;

    let sender = client.sender("payments");
    for message in [
        captured("m-1", "pay-1", "o-1", 500, 1),
        captured("m-1", "pay-1", "o-1", 500, 1),
        captured("m-1-republished", "pay-1", "o-1", 500, 1),
        captured("m-3", "pay-3", "o-1", 1200, 3),
        captured("m-2", "pay-2", "o-1", 800, 2),
        sb_inbox::Message::new("m-bad", "payments.payment-captured.v1", "{nope"),
    ] {
        sender.send(message).await?;
    }

    // One at a time, so the late capture really arrives after the newer one.
    let payments =
        ConsumerConfig::new(ConsumerName::new(CONSUMER)?, "payments").with_concurrency(1);
    let shutdown = CancellationToken::new();
    let worker = Worker::new(client, store.clone()).consumer(payments, Json::new(PaymentLedger));
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let drained = common::settled(&emulator, "payments", 6).await;
    shutdown.cancel();
    let stats = running.await??;

    let ledger =
        store
            .with_connection(|c| {
                c.query_row(
                "SELECT payment_id, captured, version FROM payment_ledger WHERE order_id = 'o-1'",
                [],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)),
            )
            })
            .await?;
    let s = stats.total();
    println!(
        "worker: {} processed, {} duplicates, {} stale, {} dead-lettered",
        s.processed, s.duplicate, s.stale, s.permanent
    );
    println!(
        "ledger o-1: {} captured {} cents at version {}",
        ledger.0, ledger.1, ledger.2
    );
    let ok = drained
        && ledger == ("pay-3".to_owned(), 1200, 3)
        && (s.processed, s.duplicate, s.stale, s.permanent) == (2, 2, 1, 1);
    println!("{}", if ok { "OK" } else { "FAILED" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
