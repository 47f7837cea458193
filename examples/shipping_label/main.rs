//! A handler with an external effect: it calls a shipping API inside its transaction and sends
//! the same `Idempotency-Key` on every attempt, so a repeated call takes effect once.
//!
//! ```sh
//! cargo run --example shipping_label
//! ```
//!
//! Runs on the embedded emulator and SQLite, with a stand-in shipping API that deduplicates by
//! key. The first attempt fails after its call (as a crash before the commit would), the message
//! comes back and calls again with the same key; a republished copy of the order (another
//! message id) is then recognised by the business key. It prints what the API saw and exits
//! non-zero unless the API created one shipment and the database holds one row.

mod consumer;
mod fake_api;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions, QueueConfig};
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};
use sb_inbox::{
    ConsumerName, Context, Contract, DecodeError, Handled, Handler, HandlerError, Message, Runtime,
    RuntimeConfig, SqliteStore,
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
            return Err(HandlerError::Transient(
                "simulated crash after the shipping call".into(),
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
    let broker = Broker::new(Config::new("sbemulatorns").with_queue(QueueConfig::new("orders")))?;
    let emulator = Emulator::start(broker, EmulatorOptions::default()).await?;
    let cs: ConnectionString = emulator.connection_string().parse()?;
    let client = ServiceBusClient::from_connection_string(&cs);
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
    let mut config = RuntimeConfig::new(ConsumerName::new(CONSUMER)?);
    config.concurrency = 1;
    let receiver = client.receiver("orders", 0);
    let runtime = Runtime::new(receiver.clone(), store.clone(), handler, config);
    let shutdown = CancellationToken::new();
    let entity = emulator.broker().entity("orders")?;
    let (result, drained) = tokio::join!(runtime.run(shutdown.clone()), async {
        let drained = tokio::time::timeout(Duration::from_secs(30), async {
            while entity.counts().completed < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        shutdown.cancel();
        drained.is_ok()
    });
    result?;
    receiver.close().await;

    let calls = api.calls();
    let rows = store
        .with_connection(|c| {
            c.query_row("SELECT count(*) FROM shipping_shipment", [], |r| {
                r.get::<_, i64>(0)
            })
        })
        .await?;
    let stats = runtime.stats().snapshot();
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
        "runtime: {} processed, {} transient, {} duplicates",
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
