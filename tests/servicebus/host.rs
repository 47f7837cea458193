//! `Worker` hosting two consumers (two handlers, two entities) over one emulator connection and
//! one PostgreSQL store.

use std::sync::Arc;

use sb_emulator::Emulator;
use sb_inbox::worker::{ConsumerConfig, HostingError, Worker, WorkerError, store_ready};
use sb_inbox::{ConsumerName, PgStore};
use sb_inbox_cli::inventory::OrderPlacedConsumer;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::emulator::{client, properties, queue, start};
use crate::support::handlers::{Gate, Versioned};
use crate::support::orders::order;
use crate::support::{Count, pg_store};

async fn two_queues() -> Emulator {
    start(
        vec![
            queue("orders", properties("PT30S", 5)),
            queue("status", properties("PT30S", 5)),
        ],
        Default::default(),
    )
    .await
}

fn name(name: &str) -> ConsumerName {
    ConsumerName::new(name).unwrap()
}

/// A handler's gate: each delivery that reaches it says so, then waits to be let through.
#[derive(Default)]
struct Turnstile {
    started: Arc<Notify>,
    open: Arc<Notify>,
}

impl Turnstile {
    fn gate<H>(&self, inner: H) -> Gate<H> {
        Gate {
            inner,
            started: self.started.clone(),
            open: self.open.clone(),
        }
    }

    /// Lets `n` deliveries through, one at a time.
    async fn pass(&self, n: usize) {
        for _ in 0..n {
            self.started.notified().await;
            self.open.notify_one();
        }
    }
}

async fn inbox_rows(store: &PgStore, consumer: &str) -> i64 {
    let rows = store
        .query(
            "SELECT count(*) FROM sb_inbox WHERE consumer = $1",
            &[&consumer],
        )
        .await
        .unwrap();
    rows[0].get(0)
}

/// Issue 16: two consumers on two queues in one `Worker`, the same message ids on both: each
/// consumer keeps its own inbox key and counters, duplicates are per consumer, and a shutdown
/// while both have a delivery in flight drains both (committed and completed, nothing locked,
/// the next message left in its queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_hosts_two_consumers_with_their_own_inbox_keys_and_drains_both() {
    crate::support::init_tracing();
    let store = pg_store("host_two_consumers", 4).await;
    let emulator = two_queues().await;
    let sb = client(&emulator);
    // Same message ids on both queues; one exact redelivery on each.
    let orders = sb.sender("orders");
    let status = sb.sender("status");
    for (id, copies) in [("m-0", 2), ("m-1", 1), ("m-2", 1), ("m-3", 1)] {
        for _ in 0..copies {
            orders.send(order(id, &format!("o-{id}"))).await.unwrap();
            status
                .send(Versioned::message(id, &format!("o-{id}"), 1))
                .await
                .unwrap();
        }
    }

    let (inventory, versions) = (Turnstile::default(), Turnstile::default());
    let one_at_a_time = |n: &str, entity: &str| {
        ConsumerConfig::new(name(n), entity)
            .with_concurrency(1)
            .with_prefetch(0)
    };
    let shutdown = CancellationToken::new();
    let worker = Worker::new(client(&emulator), store.clone())
        .consumer(
            one_at_a_time("shop.inventory", "orders"),
            inventory.gate(OrderPlacedConsumer::new()),
        )
        .consumer(
            one_at_a_time("shop.status", "status"),
            versions.gate(Versioned::new()),
        );
    let running = tokio::spawn(worker.run(shutdown.clone()));

    // m-0, its copy (a duplicate: never reaches the handler) and m-1 go through; m-2 is then
    // in flight on both consumers when the shutdown comes.
    tokio::join!(inventory.pass(2), versions.pass(2));
    tokio::join!(inventory.started.notified(), versions.started.notified());
    shutdown.cancel();
    inventory.open.notify_one();
    versions.open.notify_one();
    let stats = running.await.unwrap().unwrap();

    for consumer in ["shop.inventory", "shop.status"] {
        let counts = stats.consumer(consumer).unwrap();
        assert_eq!(
            (counts.processed, counts.duplicate, counts.handled()),
            (3, 1, 4),
            "{consumer}: {counts:?}"
        );
        assert_eq!(inbox_rows(&store, consumer).await, 3, "{consumer}");
    }
    assert_eq!(stats.total().processed, 6);
    assert_eq!(store.count("inventory_reservation").await.unwrap(), 3);
    for queue in ["orders", "status"] {
        let counts = emulator.broker().entity(queue).unwrap().counts();
        assert_eq!(
            (counts.locked, counts.completed, counts.active),
            (0, 4, 1),
            "{queue}: the drained delivery completed, m-3 left for the next worker"
        );
    }
    emulator.shutdown().await;
}

/// Noticed in review: `/readyz`'s store ping waited for a pool connection, so a pool saturated
/// by busy transactions answered 503. With the pool's one connection held by an open
/// transaction a ping cannot answer (what the old probe did), yet the `store` probe is ready
/// while a transaction committed moments ago; once the connection is back the ping answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_pool_is_ready_on_recent_commits_and_a_free_one_on_a_ping() {
    use sb_inbox::Store as _;
    let store = pg_store("host_saturated_pool", 1).await;
    let held = store.begin().await.unwrap();
    let error = store_ready(&store, None).await.unwrap_err();
    assert!(
        error.contains("no store connection answered within 1750 ms"),
        "{error}"
    );
    assert_eq!(
        store_ready(&store, Some(tokio::time::Instant::now())).await,
        Ok(()),
        "a commit just now stands for the busy store"
    );
    drop(held);
    let free = async {
        while store_ready(&store, None).await.is_err() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), free)
        .await
        .expect("the returned connection answers the ping");
}

/// Two consumer names on one entity compete for its messages: a redelivery that lands on the
/// other one finds no inbox row under its name and applies the effect again. Refused before
/// anything runs, however the entity is spelled.
#[tokio::test]
async fn a_worker_refuses_two_consumers_on_one_entity() {
    let emulator = two_queues().await;
    let stopped = CancellationToken::new();
    stopped.cancel();
    let store = sb_inbox::SqliteStore::open_in_memory().unwrap();
    let result = Worker::new(client(&emulator), store)
        .consumer(
            ConsumerConfig::new(name("shop.status"), "status"),
            Versioned::new(),
        )
        .consumer(
            ConsumerConfig::new(name("shop.audit"), "Status"),
            Versioned::new(),
        )
        // Stopped already: were it accepted, it would return at once instead of refusing.
        .run(stopped)
        .await;
    assert!(
        matches!(&result, Err(WorkerError::Config(problem))
            if problem.to_string().contains("shop.status and shop.audit both receive from Status")),
        "{result:?}"
    );
}

/// Two consumers under one name would share an inbox key: refused before anything runs.
#[tokio::test]
async fn a_worker_refuses_one_consumer_name_twice() {
    let emulator = two_queues().await;
    let store = sb_inbox::SqliteStore::open_in_memory().unwrap();
    let result = Worker::new(client(&emulator), store)
        .consumer(
            ConsumerConfig::new(name("shop.status"), "orders"),
            Versioned::new(),
        )
        .consumer(
            ConsumerConfig::new(name("shop.status"), "status"),
            Versioned::new(),
        )
        .run(CancellationToken::new())
        .await;
    assert!(
        matches!(&result, Err(WorkerError::Config(HostingError::HostedTwice(twice))) if twice.as_str() == "shop.status"),
        "{result:?}"
    );
}
