//! A handler with an external effect: it calls a shipping API inside its transaction and sends
//! the same `Idempotency-Key` on every attempt, so a repeated call takes effect once.
//!
//! ```sh
//! cargo run --example shipping_label
//! ```
//!
//! Hosted by the [`Worker`](sb_inbox::worker::Worker) on the embedded emulator and SQLite, with a stand-in shipping API that deduplicates by
//! key. The first attempt fails after its call (as a crash before the commit would), the message
//! comes back and calls again with the same key; a republished copy of the order (another
//! message id) is then recognised by the business key. It prints what the API saw and exits
//! non-zero unless the API created one shipment and the database holds one row.

#[path = "../common/mod.rs"]
mod common;
mod consumer;
mod fake_api;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use sb_inbox::worker::{ConsumerConfig, Worker};
use sb_inbox::{
    ConsumerName, Context, Contract, DecodeError, Handled, Handler, HandlerError, Message,
    SqliteStore,
};
use tokio_util::sync::CancellationToken;

use consumer::{CONSUMER, SCHEMA, ShipmentTx, ShippingApi, ShippingConsumer};
use fake_api::FakeShippingApi;

/// Fails the first attempt after the shipping call, as a crash between call and commit would.
struct FailOnceAfterCall {
    inner: ShippingConsumer,
    failed: AtomicBool,
}

impl<T: ShipmentTx> Handler<T> for FailOnceAfterCall {
    type Payload = <ShippingConsumer as Handler<T>>::Payload;

    fn contracts(&self) -> &[Contract] {
        Handler::<T>::contracts(&self.inner)
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<Self::Payload, DecodeError> {
        Handler::<T>::decode(&self.inner, contract, body)
    }

    async fn handle(
        &self,
        ctx: &Context<'_, Self::Payload>,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let handled = self.inner.handle(ctx, tx).await?;
        if !self.failed.swap(true, Ordering::SeqCst) {
            return Err(HandlerError::transient(
                "simulated crash after the shipping call",
            ));
        }
        Ok(handled)
    }
}

fn order(message_id: &str, order_id: &str) -> Message {
    let body = format!(r#"{{"orderId":"{order_id}","lines":[{{"sku":"A","quantity":1}}]}}"#);
    Message::new(message_id, "orders.order-placed.v1", body)
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    // reqwest's TLS needs a process-wide provider, even for plain http.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (emulator, client) = common::embedded(&["orders"]).await?;
    let api = FakeShippingApi::start().await?;
    let store = SqliteStore::open_in_memory()?;
    store.migrate().await?;
    store.with_connection(|c| c.execute(SCHEMA, [])).await?;

    let sender = client.sender("orders");
    sender.send(order("m-1", "o-1")).await?;
    sender.send(order("m-1-republished", "o-1")).await?;

    let handler = FailOnceAfterCall {
        inner: ShippingConsumer::new(ShippingApi::new(api.url())?),
        failed: AtomicBool::new(false),
    };
    let shutdown = CancellationToken::new();
    let worker = Worker::new(client, store.clone()).consumer(
        ConsumerConfig::new(ConsumerName::new(CONSUMER)?, "orders").with_concurrency(1),
        handler,
    );
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let drained = common::settled(&emulator, "orders", 2).await;
    shutdown.cancel();
    let stats = running.await??.total();

    let calls = api.calls();
    let rows = store
        .with_connection(|c| {
            c.query_row("SELECT count(*) FROM shipping_shipment", [], |r| {
                r.get::<_, i64>(0)
            })
        })
        .await?;
    println!("shipping API calls: {}", calls.len());
    for (n, call) in calls.iter().enumerate() {
        println!(
            "  {}. Idempotency-Key {} -> {} ({})",
            n + 1,
            call.key.as_deref().unwrap_or("-"),
            call.shipment_id.as_deref().unwrap_or("refused"),
            if call.replayed {
                "replayed, no new shipment"
            } else {
                "created"
            }
        );
    }
    println!("shipments created by the API: {}", api.shipments());
    println!("shipment rows in the database: {rows}");
    println!(
        "worker: {} processed, {} transient, {} duplicates",
        stats.processed, stats.transient, stats.duplicate
    );
    let one_key = calls.windows(2).all(|w| w[0].key == w[1].key);
    Ok(if drained && api.shipments() == 1 && rows == 1 && one_key {
        ExitCode::SUCCESS
    } else {
        eprintln!("expected one shipment, one row and one key");
        ExitCode::FAILURE
    })
}
