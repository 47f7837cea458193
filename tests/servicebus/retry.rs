//! Delayed retries end to end: the runtime over our client, the emulator's scheduled messages
//! and PostgreSQL; then the same through a real `sb-inbox run` process configured by
//! environment.

use std::time::Duration;

use sb_inbox::runtime::{DelayedRetry, JitterSource, LOGICAL_ID_PROPERTY, RetryPolicy};
use sb_inbox::{ConsumerName, PgStore, Runtime, RuntimeConfig};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::emulator::{client, emulator, send};
use crate::support::handlers::Flaky;
use crate::support::orders::order;
use crate::support::pg_store;
use crate::verification::{HeldRow, WorkerProcess, one_order_behind_a_held_row, until};
use crate::worker::drained;

const BASE: Duration = Duration::from_millis(400);

/// Runs the inventory consumer, failing `failures` times, with `max_retries` delayed retries of
/// 400 ms, 800 ms, … (no jitter) until `settled` messages were completed or dead-lettered.
async fn run_flaky(
    test: &str,
    failures: u32,
    max_retries: u32,
    settled: u64,
) -> (
    sb_emulator::Emulator,
    PgStore,
    Vec<(Instant, String)>,
    sb_inbox::StatsSnapshot,
) {
    let store = pg_store(test, 2).await;
    let emulator = emulator("PT5S").await;
    let client = client(&emulator);
    send(&client, "orders", order("m-1", "o-1")).await;
    let policy = RetryPolicy::new(max_retries, BASE, Duration::from_secs(10))
        .unwrap()
        .with_jitter(0.0, JitterSource::fixed(0.0))
        .unwrap();
    let mut config =
        RuntimeConfig::new(ConsumerName::new(sb_inbox_cli::inventory::CONSUMER).unwrap());
    config.delayed_retry = Some(DelayedRetry::new(
        policy,
        sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone()),
        "orders",
    ));
    let handler = Flaky::new(OrderPlacedConsumer::new(), failures);
    let receiver = client.receiver("orders", 0);
    let runtime = Runtime::new(receiver.clone(), store.clone(), handler, config);
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        drained(&emulator, settled).await;
        // The last copy's settlement is in; nothing is scheduled any more.
        assert_eq!(orders_scheduled(&emulator), 0);
        shutdown.cancel();
    });
    result.unwrap();
    receiver.close().await;
    let attempts = runtime.handler().attempts();
    (emulator, store, attempts, runtime.stats().snapshot())
}

/// Reservations, inbox rows and reserved units.
async fn effects(store: &PgStore) -> (i64, i64, i64) {
    let counts = store.inventory_counts().await.unwrap();
    (
        counts.reservations,
        counts.inbox_rows,
        counts.reserved_units,
    )
}

fn orders_scheduled(emulator: &sb_emulator::Emulator) -> usize {
    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .counts()
        .scheduled
}

/// Must show 3 through the emulator and PostgreSQL: two transient failures, each turned into a
/// scheduled copy (`m-1/retry-1` after 400 ms, `m-1/retry-1/retry-2` after 800 ms) with the original
/// completed; the second copy commits. One reservation, one inbox row keyed `m-1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transient_failures_are_retried_later_and_take_effect_once() {
    let (emulator, store, seen, stats) = run_flaky("sb_retry_twice", 2, 3, 3).await;
    let ids: Vec<&str> = seen.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids, ["m-1", "m-1/retry-1", "m-1/retry-1/retry-2"]);
    for (k, pair) in seen.windows(2).enumerate() {
        let waited = pair[1].0 - pair[0].0;
        assert!(
            waited >= BASE * (1 << k),
            "attempt {} came {waited:?} after the one before",
            k + 2
        );
    }
    assert_eq!((stats.transient, stats.retried, stats.processed), (2, 2, 1));
    let c = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!(
        (c.completed, c.active, c.locked, c.dead_lettered_total),
        (3, 0, 0, 0)
    );
    assert_eq!(effects(&store).await, (1, 1, 2));
    let rows = store
        .query("SELECT message_id FROM sb_inbox", &[])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, String>(0), "m-1");
}

/// A handler that never recovers: the original and two copies fail, and the last copy is read
/// back from the dead-letter queue with `RetriesExhausted` and the logical id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_are_dead_lettered_retries_exhausted() {
    let (emulator, store, seen, stats) = run_flaky("sb_retry_exhausted", u32::MAX, 2, 3).await;
    assert_eq!(seen.len(), 3);
    assert_eq!((stats.retried, stats.permanent), (2, 1));
    let dead = client(&emulator)
        .peek("orders/$DeadLetterQueue", 0, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].dead_letter_reason(), Some("RetriesExhausted"));
    let description = dead[0].dead_letter_description().unwrap();
    assert!(
        description
            .starts_with("delayed retries exhausted (2 of 2, 3 attempts in all); last error: "),
        "{description}"
    );
    assert_eq!(
        dead[0].message.message_id.as_deref(),
        Some("m-1/retry-1/retry-2")
    );
    assert_eq!(
        dead[0]
            .message
            .application_properties
            .get(LOGICAL_ID_PROPERTY),
        Some(&sb_servicebus::PropertyValue::String("m-1".into()))
    );
    // No effect; the one inbox row is the dead letter's verdict (issue 41), which a twin
    // delivery of `m-1` would meet.
    assert_eq!(effects(&store).await, (0, 1, 0));
}

/// A real `sb-inbox run` with `SB_INBOX_RETRY_*`: the test holds the stock row, so the attempt
/// times out on it (transient) and a copy is scheduled 2 s later with the original completed;
/// the row is released meanwhile and the copy commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_with_delayed_retries_schedules_a_copy_and_commits_it() {
    let HeldRow {
        store,
        emulator,
        holder,
        url,
    } = one_order_behind_a_held_row("sb_retry_process").await;
    let worker = WorkerProcess::spawn_with(
        &emulator,
        &url,
        1,
        &[
            ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
            ("SB_INBOX_RETRY_BASE_DELAY_SECS", "2"),
            ("SB_INBOX_RETRY_JITTER_PERCENT", "0"),
        ],
    );
    let emulator_ref = &emulator;
    // The copy is sent before the original is completed: wait for both.
    until(
        "the first attempt turned into a scheduled copy and the original completed",
        move || async move {
            let c = emulator_ref.broker().entity("orders").unwrap().counts();
            (c.scheduled, c.completed, c.active) == (1, 1, 0)
        },
    )
    .await;
    holder.batch_execute("COMMIT").await.unwrap();

    drained(&emulator, 2).await;
    let stats = worker.terminate().await;
    assert_eq!(
        (
            stats.get("transient"),
            stats.get("retried"),
            stats.get("processed")
        ),
        (1, 1, 1)
    );
    assert_eq!(effects(&store).await, (1, 1, 2));
    let c = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((c.completed, c.dead_lettered_total), (2, 0));
}
