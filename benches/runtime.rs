//! Runtime overhead per message: the in-memory receiver and SQLite in memory, against the bare
//! handler work (decode, business key, reservation rows, commit) run side by side.
//!
//! `cargo bench --bench runtime` prints µs per message for both and their ratio.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sb_inbox::testing::MemoryBroker;
use sb_inbox::{
    Clock, ConsumerName, Message, Runtime, RuntimeConfig, SqliteStore, Store, StoreTx, Tx,
};
use sb_inbox_cli::inventory::{InventoryTx, OrderPlaced, OrderPlacedConsumer};

const MESSAGES: usize = 20_000;
const ROUNDS: usize = 3;

fn body(i: usize) -> String {
    format!(
        r#"{{"orderId":"o-{i}","lines":[{{"sku":"A","quantity":2}},{{"sku":"B","quantity":1}}]}}"#
    )
}

async fn store() -> SqliteStore {
    let store = SqliteStore::open_in_memory().unwrap();
    store.migrate().await.unwrap();
    sb_inbox_cli::inventory::InventoryStore::migrate_inventory(&store)
        .await
        .unwrap();
    store
}

/// The handler's own work, called directly: what a hand-written consumer without the runtime
/// would do (minus the inbox row, the lock keeper and settlement).
async fn bare(messages: usize) -> Duration {
    let store = store().await;
    let start = Instant::now();
    for i in 0..messages {
        let body = body(i);
        let order: OrderPlaced = serde_json::from_slice(body.as_bytes()).unwrap();
        let mut tx = store.begin().await.unwrap();
        tx.claim_business_key("c", &format!("order:{}", order.order_id), &format!("m-{i}"))
            .await
            .unwrap();
        tx.reserve(&format!("m-{i}"), &order).await.unwrap();
        tx.commit().await.unwrap();
    }
    start.elapsed()
}

/// The same work through the runtime: receive, envelope check, lock keeper, inbox row,
/// handler, commit, complete.
async fn through_runtime(messages: usize) -> Duration {
    let store = store().await;
    let broker = MemoryBroker::new(Clock::new());
    let config = RuntimeConfig::new(ConsumerName::new("c").unwrap());
    let runtime = Runtime::new(broker.receiver(), store, OrderPlacedConsumer::new(), config);
    for i in 0..messages {
        broker.send(Message::new(
            format!("m-{i}"),
            "orders.order-placed.v1",
            body(i),
        ));
    }
    let start = Instant::now();
    while let Some(delivery) = broker.try_receive() {
        runtime.process(delivery).await;
    }
    let elapsed = start.elapsed();
    assert_eq!(runtime.stats().snapshot().processed, messages as u64);
    elapsed
}

fn per_message_us(elapsed: Duration, messages: usize) -> f64 {
    elapsed.as_secs_f64() * 1e6 / messages as f64
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        bare(1_000).await;
        through_runtime(1_000).await;
        let mut bare_best = f64::MAX;
        let mut runtime_best = f64::MAX;
        for _ in 0..ROUNDS {
            bare_best = bare_best.min(per_message_us(bare(MESSAGES).await, MESSAGES));
            runtime_best = runtime_best.min(per_message_us(through_runtime(MESSAGES).await, MESSAGES));
        }
        println!("runtime overhead, {MESSAGES} messages, best of {ROUNDS} (SQLite in memory, in-memory receiver)");
        println!("  bare handler : {bare_best:8.2} µs/message (baseline)");
        println!("  runtime      : {runtime_best:8.2} µs/message");
        println!("  overhead     : {:8.2} µs/message, ratio {:.2}x", runtime_best - bare_best, runtime_best / bare_best);
    });
}
