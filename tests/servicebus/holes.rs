//! The correctness holes of issue 14 on the Service Bus side: each sequence through our client
//! and the emulator (duplicate detection on, `released` not counted, undecodable deliveries),
//! and two through real `sb-inbox run` processes holding a PostgreSQL table lock.

use std::sync::Arc;
use std::time::Duration;

use sb_emulator::{Emulator, EntityProperties};
use sb_inbox::runtime::{DelayedRetry, JitterSource, RetryPolicy};
use sb_inbox::{ConsumerName, Delivery, Outcome, Receiver, Runtime, RuntimeConfig};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use sb_inbox_cli::ops::dlq;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::emulator::{client, duration, properties, queue, send, start};
use crate::support::handlers::{Flaky, Gate, Slow};
use crate::support::orders::order;
use crate::support::{pg_store, pg_url, schema_for, sqlite_store, with_search_path};
use crate::verification::{WorkerProcess, session, until};
use crate::worker::{drained, http_get};

/// An emulator with one queue `orders` with these properties.
async fn emulator_with(properties: EntityProperties) -> Emulator {
    start(vec![queue("orders", properties)], Default::default()).await
}

/// A session of the test's own holding `LOCK TABLE inventory_stock` in an open transaction
/// (`COMMIT` on it releases the lock), and the store URL of the test's schema.
async fn lock_stock_table(schema: &str) -> (tokio_postgres::Client, String) {
    let holder = session(schema).await;
    holder
        .batch_execute("BEGIN; LOCK TABLE inventory_stock")
        .await
        .unwrap();
    (holder, with_search_path(&pg_url(), schema))
}

fn inventory_config() -> RuntimeConfig {
    RuntimeConfig::new(ConsumerName::new(sb_inbox_cli::inventory::CONSUMER).unwrap())
}

/// Finding 2, with broker duplicate detection on (as our Bicep deploys it): the original and its
/// one delayed retry fail (`RetriesExhausted`), the dead letter is resubmitted, fails once more
/// and is retried again. That copy must not reuse `m-1/retry-1`, which the broker would drop as
/// a duplicate while the resubmitted message is completed: the message would be nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmitted_dead_letter_that_fails_again_is_retried_and_processed_once() {
    let store = pg_store("holes_resubmit_retry", 2).await;
    let emulator = emulator_with(EntityProperties {
        requires_duplicate_detection: true,
        duplicate_detection_history_time_window: duration("PT10M"),
        ..properties("PT5S", 5)
    })
    .await;
    let client = client(&emulator);
    send(&client, "orders", order("m-1", "o-1")).await;
    let policy = RetryPolicy::new(1, Duration::from_millis(200), Duration::from_secs(1))
        .unwrap()
        .with_jitter(0.0, JitterSource::fixed(0.0))
        .unwrap();
    let mut config = inventory_config();
    config.delayed_retry = Some(DelayedRetry::new(
        policy,
        sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone()),
        "orders",
    ));
    let receiver = client.receiver("orders", 0);
    let runtime = Runtime::new(
        receiver.clone(),
        store.clone(),
        Flaky::new(OrderPlacedConsumer::new(), 3),
        config,
    );
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        let dead_letters = emulator.broker().entity("orders/$DeadLetterQueue").unwrap();
        until("the retries are exhausted", || {
            let active = dead_letters.counts().active;
            async move { active == 1 }
        })
        .await;
        let dlq_receiver = client.receiver("orders/$DeadLetterQueue", 0);
        let mut options = dlq::ResubmitOptions::new(1);
        options.idle = Duration::from_secs(2);
        let report = dlq::resubmit(
            &dlq_receiver,
            &sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone()),
            "orders",
            &options,
        )
        .await
        .unwrap();
        dlq_receiver.close().await;
        assert_eq!(report.resubmitted.len(), 1, "{report:?}");
        until("the resubmitted message's retry is processed", || {
            let attempts = runtime.handler().attempts().len();
            async move { attempts == 4 }
        })
        .await;
        drained(&emulator, 3).await;
        shutdown.cancel();
    });
    result.unwrap();
    receiver.close().await;
    let ids = runtime.handler().attempted_ids();
    assert_eq!(
        ids,
        [
            "m-1",
            "m-1/retry-1",
            "m-1/resubmit-1",
            "m-1/resubmit-1/retry-1"
        ]
    );
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!(counts.duplicates, 0, "no copy was dropped as a duplicate");
    let stock = store.inventory_counts().await.unwrap();
    assert_eq!((stock.reservations, stock.inbox_rows), (1, 1));
}

/// Finding 12: on shutdown, deliveries received but never started are released, which Service
/// Bus (and the emulator) do not count as a delivery attempt; only the one interrupted past the
/// grace is abandoned and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_unstarted_deliveries_without_counting_a_delivery() {
    let store = sqlite_store("holes_shutdown", 1).await;
    let emulator = emulator_with(properties("PT30S", 5)).await;
    let client = client(&emulator);
    let sender = client.sender("orders");
    for i in 0..4 {
        sender
            .send(order(&format!("m-{i}"), &format!("o-{i}")))
            .await
            .unwrap();
    }
    let started = Arc::new(Notify::new());
    let handler = Gate {
        inner: OrderPlacedConsumer::new(),
        started: started.clone(),
        open: Arc::new(Notify::new()),
    };
    let mut config = inventory_config();
    config.concurrency = 1;
    config.prefetch = 3;
    config.shutdown_grace = Duration::from_millis(300);
    let receiver = client.receiver("orders", 0);
    let runtime = Runtime::new(receiver.clone(), store, handler, config);
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        started.notified().await;
        let orders = emulator.broker().entity("orders").unwrap();
        until("the runtime holds all four", || {
            let locked = orders.counts().locked;
            async move { locked == 4 }
        })
        .await;
        shutdown.cancel();
    });
    result.unwrap();
    receiver.close().await;
    assert_eq!(runtime.stats().snapshot().released, 3);

    let again = client.receiver("orders", 0);
    let mut counts = Vec::new();
    for _ in 0..4 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), again.receive())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        counts.push(delivery.delivery_count());
        delivery.complete().await.unwrap();
    }
    again.close().await;
    counts.sort_unstable();
    assert_eq!(counts, [0, 0, 0, 1], "only the interrupted delivery counts");
}

/// Finding 9: a delivery the client cannot decode is dead-lettered `UndecodableMessage` and
/// the next one is handled at once (no receive error, no back-off); a delivery whose lock was
/// lost is released when dropped. Neither stays on the link's unsettled deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_lock_lost_deliveries_do_not_stay_unsettled() {
    let emulator = emulator_with(properties("PT2S", 5)).await;
    let client = client(&emulator);
    let sender = client.sender("orders");
    sender.send(order("bad", "o-0")).await.unwrap();
    sender.send(order("m-1", "o-1")).await.unwrap();
    let orders = emulator.broker().entity("orders").unwrap();
    orders.undecodable_deliveries(1).unwrap();
    orders.refuse_renewals(10).unwrap();

    let receiver = client.receiver("orders", 0);
    let delivery = tokio::time::timeout(Duration::from_secs(10), receiver.receive())
        .await
        .expect("the undecodable delivery is skipped without a back-off")
        .unwrap()
        .unwrap();
    assert_eq!(delivery.message().message_id.as_deref(), Some("m-1"));
    let dead = client.peek("orders/$DeadLetterQueue", 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].message.message_id.as_deref(), Some("bad"));
    assert_eq!(dead[0].dead_letter_reason(), Some("UndecodableMessage"));
    assert!(
        dead[0]
            .dead_letter_description()
            .unwrap()
            .starts_with("the AMQP message does not decode")
    );
    assert_eq!(receiver.unsettled().await, 1, "only m-1 is unsettled");

    let store = sqlite_store("holes_unsettled", 1).await;
    let mut config = inventory_config();
    config.lock_margin = Duration::from_secs(1);
    let handler = Slow {
        inner: OrderPlacedConsumer::new(),
        duration: Duration::from_secs(30),
    };
    let runtime = Runtime::new(receiver.clone(), store, handler, config);
    let report = runtime.process(delivery).await;
    assert_eq!(report.outcome, Outcome::LockLost);
    until("the lock-lost delivery is settled on the link", || {
        let receiver = receiver.clone();
        async move { receiver.unsettled().await == 0 }
    })
    .await;
    receiver.close().await;
}

/// Finding 5 as a process: concurrency 1, prefetch 8, a 3 s lock, MaxDeliveryCount 1, and a
/// table lock holding the one handler for 12 s. The eight deliveries waiting for the slot keep
/// their locks, so all ten orders are reserved once and nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_deliveries_keep_their_locks_while_a_table_lock_holds_the_handler() {
    let test = "holes_prefetch_locks";
    let store = pg_store(test, 1).await;
    let schema = schema_for(test);
    let emulator = emulator_with(properties("PT3S", 1)).await;
    let sender = client(&emulator).sender("orders");
    for i in 0..10 {
        sender
            .send(order(&format!("m-{i}"), &format!("o-{i}")))
            .await
            .unwrap();
    }
    let (holder, url) = lock_stock_table(&schema).await;
    let worker = WorkerProcess::spawn_with(&emulator, &url, 1, &[("SB_INBOX_PREFETCH", "8")]);
    let orders = emulator.broker().entity("orders").unwrap();
    until(
        "the worker holds the slot and eight prefetched deliveries",
        || {
            let locked = orders.counts().locked;
            async move { locked >= 9 }
        },
    )
    .await;
    // The scenario itself: the handler is held by the table lock for four lock durations.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let during = orders.counts();
    holder.batch_execute("COMMIT").await.unwrap();
    drained(&emulator, 10).await;
    let stats = worker.terminate().await;
    assert_eq!(
        during.dead_lettered_total, 0,
        "no lock ran out while the handler was held"
    );
    let counts = orders.counts();
    assert_eq!((counts.completed, counts.dead_lettered_total), (10, 0));
    let stock = store.inventory_counts().await.unwrap();
    assert_eq!((stock.reservations, stock.inbox_rows), (10, 10));
    assert_eq!(stats.get("processed"), 10);
    assert!(stats.get("renewals") >= 8 * 3, "{stats:?}");
}

/// `/readyz` of a worker, bounded: a probe that does not answer is a failure, not a hang.
async fn readyz(worker: &WorkerProcess, health: std::net::SocketAddr) -> String {
    tokio::time::timeout(Duration::from_secs(10), http_get(health, "/readyz"))
        .await
        .unwrap_or_else(|_| panic!("/readyz did not answer in 10 s; log:\n{}", worker.log()))
}

/// Finding 6 as a process: a PostgreSQL session holds `LOCK TABLE inventory_stock` longer than
/// `max_processing_secs` (3 s). Each attempt is cancelled and the message abandoned within the
/// bound, the worker stays ready, and once the lock is released the message and a later one
/// are processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_held_past_max_processing_is_abandoned_and_the_worker_stays_ready() {
    const MAX: Duration = Duration::from_secs(3);
    let test = "holes_max_processing";
    let store = pg_store(test, 1).await;
    let schema = schema_for(test);
    let emulator = emulator_with(properties("PT30S", 10)).await;
    let client = client(&emulator);
    let (holder, url) = lock_stock_table(&schema).await;
    let worker = WorkerProcess::spawn_with(
        &emulator,
        &url,
        1,
        &[
            ("SB_INBOX_MAX_PROCESSING_SECS", "3"),
            ("SB_INBOX_HEALTH_PORT", "0"),
        ],
    );
    let health = worker.health_address().await;
    until("the worker is ready", || async {
        readyz(&worker, health).await.starts_with("HTTP/1.1 200")
    })
    .await;
    send(&client, "orders", order("m-1", "o-1")).await;
    let orders = emulator.broker().entity("orders").unwrap();
    until("the worker takes m-1", || {
        let locked = orders.counts().locked;
        async move { locked == 1 }
    })
    .await;
    let taken = tokio::time::Instant::now();
    let delivery_count = || async { client.peek("orders", 0, 1).await.unwrap()[0].delivery_count };
    until("m-1 is abandoned", || async { delivery_count().await >= 1 }).await;
    let abandoned_after = taken.elapsed();
    assert!(
        abandoned_after >= MAX - Duration::from_millis(100) && abandoned_after < MAX * 2,
        "abandoned {abandoned_after:?} after it was taken; the bound is {MAX:?}"
    );
    until("m-1 is abandoned a second time", || async {
        delivery_count().await >= 2
    })
    .await;
    let ready = readyz(&worker, health).await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(
        ready.ends_with("{\"not_ready\":{},\"ready\":true}"),
        "{ready}"
    );

    holder.batch_execute("COMMIT").await.unwrap();
    drained(&emulator, 1).await;
    send(&client, "orders", order("m-2", "o-2")).await;
    drained(&emulator, 2).await;
    assert!(readyz(&worker, health).await.starts_with("HTTP/1.1 200"));
    let log = worker.log();
    let stats = worker.terminate().await;
    assert!(
        log.contains("Processing took too long; cancelled."),
        "{log}"
    );
    assert_eq!(stats.get("processed"), 2);
    assert!(stats.get("transient") >= 2, "{stats:?}");
    let stock = store.inventory_counts().await.unwrap();
    assert_eq!((stock.reservations, stock.inbox_rows), (2, 2));
    assert_eq!(orders.counts().dead_lettered_total, 0);
}
