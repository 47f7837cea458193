//! The article's verification and outcome rules, run against PostgreSQL and SQLite, and SQL
//! Server when `SB_INBOX_MSSQL` is set.

use std::collections::BTreeMap;
use std::sync::Arc;

use sb_inbox::runtime::LAST_ERROR_PROPERTY;
use sb_inbox::testing::MemoryBroker;
use sb_inbox::{Clock, Delivery, DuplicateScope, Message, Outcome, PropertyValue, Runtime, Store};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

use crate::support::handlers::{BarrierStore, Flaky, Noop, Versioned};
use crate::support::orders::two_line_order;
use crate::support::runtime::{BATCH, batched, config, handle_all, handle_one, ready_deliveries};
use crate::support::{Count, inventory_totals, pg_store, sqlite_store};

const INVENTORY: &str = sb_inbox_cli::inventory::CONSUMER;

/// The same message delivered to 8 tasks at once (8 broker copies, as a relay that published
/// 8 times): one reservation, one inbox row, all 8 deliveries completed. Batched: two batches
/// of 4 copies at once (two workers), so copies meet both inside one transaction and across
/// two open transactions.
async fn concurrent_copies<S: InventoryStore + Clone>(store: S, barrier: bool, batch: usize) {
    const COPIES: usize = 8;
    let transactions = if batch == 1 { COPIES } else { 2 };
    let broker = MemoryBroker::new(Clock::new());
    broker.send_copies(two_line_order("m-1", "o-1"), COPIES);
    let reports = if barrier {
        let racing = BarrierStore {
            inner: store.clone(),
            barrier: Arc::new(Barrier::new(transactions)),
            parties: transactions,
            begun: Arc::default(),
        };
        run_all(
            Runtime::new(
                broker.receiver(),
                racing,
                OrderPlacedConsumer::new(),
                batched(INVENTORY, batch),
            ),
            &broker,
            COPIES / transactions,
        )
        .await
    } else {
        run_all(
            Runtime::new(
                broker.receiver(),
                store.clone(),
                OrderPlacedConsumer::new(),
                batched(INVENTORY, batch),
            ),
            &broker,
            COPIES / transactions,
        )
        .await
    };
    let processed = reports
        .iter()
        .filter(|r| r.outcome == Outcome::Processed)
        .count();
    let duplicates = reports
        .iter()
        .filter(|r| r.outcome == Outcome::Duplicate(DuplicateScope::Inbox))
        .count();
    assert_eq!((processed, duplicates), (1, COPIES - 1), "{reports:?}");
    assert!(
        reports.iter().all(|r| r.settled == Some(Ok(()))),
        "{reports:?}"
    );
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (1, 1));
    assert_eq!(counts.reserved_units, 3);
    assert_eq!(counts.line_units, 3);
    let broker_counts = broker.counts();
    assert_eq!(
        (
            broker_counts.completed,
            broker_counts.ready,
            broker_counts.locked
        ),
        (COPIES as u64, 0, 0)
    );
}

/// Every delivery of `broker` at once, `per_task` to a task (in one batch when batching).
async fn run_all<R, S>(
    runtime: Runtime<R, S, OrderPlacedConsumer>,
    broker: &MemoryBroker,
    per_task: usize,
) -> Vec<sb_inbox::Report>
where
    R: sb_inbox::Receiver,
    S: Store,
    S::Tx: sb_inbox_cli::inventory::InventoryTx,
{
    let runtime = Arc::new(runtime);
    let batch = if per_task == 1 { 1 } else { BATCH };
    let mut tasks = tokio::task::JoinSet::new();
    let deliveries: Vec<_> = ready_deliveries(broker);
    let mut deliveries = deliveries.into_iter().peekable();
    while deliveries.peek().is_some() {
        let (runtime, chunk) = (
            runtime.clone(),
            deliveries.by_ref().take(per_task).collect(),
        );
        tasks.spawn(async move { handle_all(&runtime, batch, chunk).await });
    }
    tasks.join_all().await.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_postgres() {
    concurrent_copies(pg_store("rt_concurrent_copies", 8).await, true, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_sqlite() {
    concurrent_copies(sqlite_store("rt_concurrent_copies", 1).await, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_mssql() {
    if let Some(store) = crate::support::mssql_store("rt_concurrent_copies", 8).await {
        concurrent_copies(store, true, 1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_batched_postgres() {
    concurrent_copies(
        pg_store("rt_concurrent_copies_batched", 8).await,
        true,
        BATCH,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_batched_sqlite() {
    concurrent_copies(
        sqlite_store("rt_concurrent_copies_batched", 1).await,
        false,
        BATCH,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_batched_mssql() {
    if let Some(store) = crate::support::mssql_store("rt_concurrent_copies_batched", 8).await {
        concurrent_copies(store, true, BATCH).await;
    }
}

/// The process stops after commit and before settlement: the lock runs out, the message is
/// redelivered, recognised as a duplicate and completed; the effect is not repeated.
async fn settle_fails_after_commit<S: InventoryStore + Clone>(store: S, batch: usize) {
    let broker = MemoryBroker::new(Clock::new());
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        OrderPlacedConsumer::new(),
        batched(INVENTORY, batch),
    );
    broker.send(two_line_order("m-1", "o-1"));
    broker.fail_next_settlements(1);
    let report = handle_one(&runtime, batch, broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::Processed);
    assert!(matches!(report.settled, Some(Err(_))), "{report:?}");
    assert!(
        broker.try_receive().is_none(),
        "still locked until the lock runs out"
    );

    broker.expire_all_locks();
    let redelivery = broker
        .try_receive()
        .expect("redelivered after the lock ran out");
    assert_eq!(redelivery.delivery_count(), 1);
    let report = handle_one(&runtime, batch, redelivery).await;
    assert_eq!(report.outcome, Outcome::Duplicate(DuplicateScope::Inbox));
    assert_eq!(report.settled, Some(Ok(())));

    assert_eq!(inventory_totals(&store).await, (1, 1, 3));
    let broker_counts = broker.counts();
    assert_eq!(
        (
            broker_counts.completed,
            broker_counts.ready,
            broker_counts.locked
        ),
        (1, 0, 0)
    );
}

/// The transaction is forced to roll back after the business writes: no inbox row, no
/// reservation; the abandoned message is processed once on redelivery.
async fn rollback_then_redelivery<S: InventoryStore + Clone>(store: S, batch: usize) {
    let broker = MemoryBroker::new(Clock::new());
    let handler = Flaky::new(OrderPlacedConsumer::new(), 1);
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        handler,
        batched(INVENTORY, batch),
    );
    broker.send(two_line_order("m-1", "o-1"));
    let report = handle_one(&runtime, batch, broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::Transient);
    assert_eq!(report.settled, Some(Ok(())), "abandoned");
    assert_eq!(inventory_totals(&store).await, (0, 0, 0));

    let redelivery = broker
        .try_receive()
        .expect("abandon makes it available again");
    assert_eq!(redelivery.delivery_count(), 1);
    assert!(matches!(
        redelivery.message().application_properties.get(LAST_ERROR_PROPERTY),
        Some(PropertyValue::String(text)) if text.contains("injected failure")
    ));
    let report = handle_one(&runtime, batch, redelivery).await;
    assert_eq!(report.outcome, Outcome::Processed);
    assert_eq!(inventory_totals(&store).await, (1, 1, 3));
}

/// Two consumers share a database: each processes the same message id once.
async fn two_consumers_are_independent<S: Store + Count + Clone>(store: S, batch: usize) {
    let broker = MemoryBroker::new(Clock::new());
    let billing = Runtime::new(
        broker.receiver(),
        store.clone(),
        Noop::new(),
        batched("billing.order-placed.v1", batch),
    );
    let audit = Runtime::new(
        broker.receiver(),
        store.clone(),
        Noop::new(),
        batched("audit.order-placed.v1", batch),
    );
    broker.send_copies(two_line_order("m-1", "o-1"), 3);
    assert_eq!(
        handle_one(&billing, batch, broker.try_receive().unwrap())
            .await
            .outcome,
        Outcome::Processed
    );
    assert_eq!(
        handle_one(&audit, batch, broker.try_receive().unwrap())
            .await
            .outcome,
        Outcome::Processed
    );
    assert_eq!(
        handle_one(&billing, batch, broker.try_receive().unwrap())
            .await
            .outcome,
        Outcome::Duplicate(DuplicateScope::Inbox)
    );
    assert_eq!(store.count("sb_inbox").await.unwrap(), 2);
}

/// A message id reused for another order is a duplicate of the message id; another message
/// id for an order already reserved is a duplicate of the business key.
async fn business_key_duplicate<S: InventoryStore + Clone>(store: S, batch: usize) {
    let broker = MemoryBroker::new(Clock::new());
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        OrderPlacedConsumer::new(),
        batched(INVENTORY, batch),
    );
    broker.send(two_line_order("m-1", "o-1"));
    broker.send(two_line_order("m-2", "o-1"));
    // Batched, both are in one transaction: the second meets the first's uncommitted key.
    let deliveries: Vec<_> = ready_deliveries(&broker);
    let [first, report]: [sb_inbox::Report; 2] = handle_all(&runtime, batch, deliveries)
        .await
        .try_into()
        .unwrap();
    assert_eq!(first.outcome, Outcome::Processed);
    assert_eq!(
        report.outcome,
        Outcome::Duplicate(DuplicateScope::BusinessKey)
    );
    assert_eq!(report.settled, Some(Ok(())));
    assert_eq!(inventory_totals(&store).await, (1, 1, 3));
}

/// Older versions are stale: recorded, completed, not applied.
async fn stale_messages<S: Store + Count + Clone>(store: S, batch: usize) {
    let broker = MemoryBroker::new(Clock::new());
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        Versioned::new(),
        batched("orders.status", batch),
    );
    for (id, version) in [("s-1", 1), ("s-3", 3), ("s-2", 2), ("s-3b", 3)] {
        broker.send(Versioned::message(id, "o-1", version));
    }
    let deliveries: Vec<_> = ready_deliveries(&broker);
    let mut outcomes = Vec::new();
    for report in handle_all(&runtime, batch, deliveries).await {
        assert_eq!(report.settled, Some(Ok(())));
        outcomes.push(report.outcome);
    }
    assert_eq!(
        outcomes,
        [
            Outcome::Processed,
            Outcome::Processed,
            Outcome::Stale,
            Outcome::Stale
        ]
    );
    assert_eq!(
        store.count("sb_inbox").await.unwrap(),
        4,
        "stale messages are recorded"
    );
    assert_eq!(broker.counts().completed, 4);
}

/// Every kind of bad envelope is dead-lettered with its reason and never recorded, while the
/// running runtime goes on to process the good message.
async fn bad_envelopes_are_dead_lettered<S: InventoryStore + Count + Clone>(
    store: S,
    batch: usize,
) {
    let broker = MemoryBroker::new(Clock::new());
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        OrderPlacedConsumer::new(),
        batched(INVENTORY, batch),
    );
    let good_body = r#"{"orderId":"o-1","lines":[{"sku":"A","quantity":1}]}"#;
    let cases: Vec<(&str, Message, &str)> = vec![
        (
            "no id",
            {
                let mut message = Message::new("x", "orders.order-placed.v1", good_body);
                message.message_id = None;
                message
            },
            "MissingMessageId",
        ),
        (
            "empty id",
            Message::new("", "orders.order-placed.v1", good_body),
            "MissingMessageId",
        ),
        (
            "long id",
            Message::new("i".repeat(129), "orders.order-placed.v1", good_body),
            "InvalidMessageId",
        ),
        (
            "no subject",
            {
                let mut message = Message::new("m-4", "x", good_body);
                message.subject = None;
                message
            },
            "MissingContract",
        ),
        (
            "unknown contract",
            Message::new("m-5", "billing.charge.v1", good_body),
            "UnsupportedContract",
        ),
        (
            "no version",
            Message::new("m-6", "orders.order-placed", good_body),
            "UnsupportedContract",
        ),
        (
            "new version",
            Message::new("m-7", "orders.order-placed.v2", good_body),
            "UnsupportedContractVersion",
        ),
        (
            "not json",
            Message::new("m-8", "orders.order-placed.v1", "SECRET-VALUE {"),
            "InvalidPayload",
        ),
        (
            "wrong shape",
            Message::new(
                "m-9",
                "orders.order-placed.v1",
                r#"{"orderId":"SECRET-VALUE","lines":"SECRET-VALUE"}"#,
            ),
            "InvalidPayload",
        ),
        (
            "no lines",
            Message::new(
                "m-10",
                "orders.order-placed.v1",
                r#"{"orderId":"o-2","lines":[]}"#,
            ),
            "InvalidPayload",
        ),
        (
            "zero quantity",
            Message::new(
                "m-11",
                "orders.order-placed.v1",
                r#"{"orderId":"o-3","lines":[{"sku":"A","quantity":0}]}"#,
            ),
            "PermanentStoreError",
        ),
    ];
    let mut expected = BTreeMap::new();
    for (case, mut message, reason) in cases {
        message
            .application_properties
            .insert("case".into(), case.into());
        expected.insert(case.to_owned(), reason.to_owned());
        broker.send(message);
    }
    broker.send(two_line_order("m-good", "o-good"));
    let shutdown = CancellationToken::new();
    let running = {
        let shutdown = shutdown.clone();
        async move { runtime.run(shutdown).await }
    };
    let (result, ()) = tokio::join!(running, async {
        broker.wait_idle().await;
        shutdown.cancel();
    });
    result.unwrap();

    let dead: BTreeMap<String, String> = broker
        .dead_letters()
        .into_iter()
        .map(|d| {
            assert!(
                !d.description.contains("SECRET-VALUE"),
                "payload echoed: {}",
                d.description
            );
            assert!(d.description.len() <= sb_inbox::runtime::MAX_DESCRIPTION_LEN);
            let Some(PropertyValue::String(case)) = d.message.application_properties.get("case")
            else {
                panic!("case property lost");
            };
            (case.clone(), d.reason)
        })
        .collect();
    assert_eq!(dead, expected);
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!(
        (counts.reservations, counts.inbox_rows),
        (1, 1),
        "only the good message is recorded"
    );
    assert_eq!(broker.counts().completed, 1);
}

macro_rules! on_both_stores {
    ($($scenario:ident),* $(,)?) => {
        on_both_stores!(@stores 1, $($scenario),*);
        /// The same scenarios with batched transactions.
        mod batched {
            use super::*;
            on_both_stores!(@stores super::BATCH, $($scenario),*);
        }
    };
    (@stores $batch:expr, $($scenario:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::support::init_tracing();
                    super::$scenario(crate::support::pg_store(&format!("rt_{}_{}", stringify!($scenario), $batch), 4).await, $batch).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::support::init_tracing();
                    super::$scenario(crate::support::sqlite_store(&format!("{}_{}", stringify!($scenario), $batch), 1).await, $batch).await;
                }
            )*
        }
        // SQL Server when SB_INBOX_MSSQL is set (GitHub Actions); skipped otherwise.
        mod mssql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::support::init_tracing();
                    if let Some(store) = crate::support::mssql_store(&format!("rt_{}_{}", stringify!($scenario), $batch), 4).await {
                        super::$scenario(store, $batch).await;
                    }
                }
            )*
        }
    };
}

on_both_stores!(
    settle_fails_after_commit,
    rollback_then_redelivery,
    two_consumers_are_independent,
    business_key_duplicate,
    stale_messages,
    bad_envelopes_are_dead_lettered,
);

/// Issue 14, finding 7: a table missing because the code was rolled out before `migrate` is
/// not the message's fault. The message is abandoned (not dead-lettered), the runtime reports
/// the store unfit (`/readyz` consults it), and once the table is there the redelivery commits
/// and the store is fit again.
#[tokio::test]
async fn a_deployment_error_is_retried_and_reported_not_dead_lettered() {
    let store = sqlite_store("rt_deployment_error", 1).await;
    let rename = |from: &'static str, to: &'static str| {
        let store = store.clone();
        async move {
            store
                .with_connection(move |conn| {
                    conn.execute_batch(&format!("ALTER TABLE {from} RENAME TO {to}"))
                })
                .await
                .unwrap();
        }
    };
    rename("inventory_stock", "inventory_stock_not_yet").await;
    let broker = MemoryBroker::new(Clock::new());
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        OrderPlacedConsumer::new(),
        config(INVENTORY),
    );
    broker.send(two_line_order("m-1", "o-1"));
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::Transient, "{report:?}");
    assert_eq!(report.settled, Some(Ok(())));
    assert!(broker.dead_letters().is_empty());
    let problem = runtime
        .store_health()
        .problem()
        .expect("store reported unfit");
    assert!(problem.starts_with("deployment"), "{problem}");

    rename("inventory_stock_not_yet", "inventory_stock").await;
    let redelivery = broker.try_receive().expect("abandoned, so redelivered");
    let report = runtime.process(redelivery).await;
    assert_eq!(report.outcome, Outcome::Processed, "{report:?}");
    assert_eq!(runtime.store_health().problem(), None);
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 1);
}
