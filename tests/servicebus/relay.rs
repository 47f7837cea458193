//! The outbox relay over the emulator and PostgreSQL: a relay killed between publish and mark,
//! two relay instances at once, and a downstream consumer (the runtime with an inbox, on a
//! queue without broker duplicate detection) that applies every row exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use sb_inbox::relay::{Relay, RelayConfig};
use sb_inbox::servicebus::ServiceBusSenderPort;
use sb_inbox::{
    Clock, ConsumerName, Message, OutboxMessage, OutboxStore, PgStore, Runtime, RuntimeConfig,
    SendFailure, Sender, Store, StoreTx, Tx,
};
use sb_inbox_cli::inventory::OrderPlacedConsumer;
use tokio::sync::{Barrier, Notify};
use tokio_util::sync::CancellationToken;

use crate::support::emulator::{client, emulator};
use crate::support::{Count, inventory_totals, pg_store};
use crate::worker::queue_drained;

const ROWS: usize = 40;
const LEASE: Duration = Duration::from_secs(60);

/// Publishes through the real publisher and, once the broker has accepted the `after`-th
/// message, tells the test and never returns: the relay is killed between publish and mark.
struct KillAfterAccept {
    inner: ServiceBusSenderPort,
    after: usize,
    accepted: AtomicUsize,
    killed: Arc<Notify>,
}

impl Sender for KillAfterAccept {
    async fn send(
        &self,
        destination: &str,
        message: Message,
        at: Option<SystemTime>,
    ) -> Result<(), SendFailure> {
        self.inner.send(destination, message, at).await?;
        if self.accepted.fetch_add(1, Ordering::SeqCst) + 1 == self.after {
            self.killed.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// Holds each relay's first send until every relay has claimed a batch: the relays hold
/// leases at the same time.
struct TogetherFirst {
    inner: ServiceBusSenderPort,
    barrier: Arc<Barrier>,
    started: AtomicBool,
}

impl Sender for TogetherFirst {
    async fn send(
        &self,
        destination: &str,
        message: Message,
        at: Option<SystemTime>,
    ) -> Result<(), SendFailure> {
        if !self.started.swap(true, Ordering::SeqCst) {
            self.barrier.wait().await;
        }
        self.inner.send(destination, message, at).await
    }
}

/// An order message in the outbox, for the `outbox` queue.
fn order_row(i: usize) -> OutboxMessage {
    let mut message = OutboxMessage::new(
        "outbox",
        sb_inbox_cli::inventory::CONTRACT,
        format!(r#"{{"orderId":"o-{i}","lines":[{{"sku":"A","quantity":2}}]}}"#).into_bytes(),
    );
    message.correlation_id = Some(format!("o-{i}"));
    message
}

/// Waits (bounded) until the outbox has nothing left to publish.
async fn outbox_empty<S: OutboxStore>(store: &S) {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if store.outbox_backlog().await.unwrap().pending == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the relays publish every row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_and_concurrent_relays_deliver_every_row_once_downstream() {
    crate::support::init_tracing();
    let producer: PgStore = pg_store("relay_producer", 6).await;
    let downstream: PgStore = pg_store("relay_downstream", 6).await;
    let emulator = emulator("PT5S").await;
    let client = client(&emulator);
    for i in 0..ROWS {
        let mut tx = producer.begin().await.unwrap();
        tx.append_outbox(&order_row(i)).await.unwrap();
        tx.commit().await.unwrap();
    }

    // The downstream consumer runs throughout: the runtime with its inbox on `outbox`.
    let config = RuntimeConfig::new(ConsumerName::new(sb_inbox_cli::inventory::CONSUMER).unwrap());
    let consumer = Arc::new(Runtime::new(
        client.receiver("outbox", 4),
        downstream.clone(),
        OrderPlacedConsumer::new(),
        config,
    ));
    let stop_consumer = CancellationToken::new();
    let consuming = tokio::spawn({
        let (consumer, stop) = (consumer.clone(), stop_consumer.clone());
        async move { consumer.run(stop).await }
    });

    // 1. A relay claims a batch of 10 and is killed after the broker accepted 3 of them.
    let killed = Arc::new(Notify::new());
    let victim = Relay::new(
        producer.clone(),
        KillAfterAccept {
            inner: sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone()),
            after: 3,
            accepted: AtomicUsize::new(0),
            killed: killed.clone(),
        },
        // One send at a time, so that the kill lands after exactly three accepted sends; the
        // two relays below send concurrently.
        RelayConfig::default()
            .with_batch_size(10)
            .with_lease(LEASE)
            .with_max_in_flight(1),
    );
    let victim_stats = victim.stats();
    let victim = tokio::spawn(async move { victim.run(CancellationToken::new()).await });
    tokio::time::timeout(Duration::from_secs(30), killed.notified())
        .await
        .expect("the victim publishes");
    victim.abort();
    assert!(victim.await.unwrap_err().is_cancelled());
    let victim_stats = victim_stats.snapshot();
    // The broker accepted three; the relay died before it learned of the third.
    assert_eq!((victim_stats.published, victim_stats.marked), (2, 0));
    assert_eq!(emulator.broker().entity("outbox").unwrap().counts().sent, 3);
    assert_eq!(
        producer
            .count("sb_outbox WHERE dispatched_at IS NULL")
            .await
            .unwrap(),
        ROWS as i64,
        "nothing marked: the accepted three are still pending"
    );

    // 2. Two relays whose clocks are past the victim's lease run at once, both holding a
    //    claim before either sends.
    let later = Clock::starting_at(SystemTime::now() + LEASE + Duration::from_secs(1));
    let barrier = Arc::new(Barrier::new(2));
    let stop_relays = CancellationToken::new();
    let relays: Vec<_> = (0..2)
        .map(|_| {
            Relay::with_clock(
                producer.clone(),
                TogetherFirst {
                    inner: sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone()),
                    barrier: barrier.clone(),
                    started: AtomicBool::new(false),
                },
                RelayConfig::default()
                    .with_batch_size(5)
                    .with_lease(LEASE)
                    .with_poll_interval(Duration::from_millis(20)),
                later,
            )
        })
        .collect();
    let stats: Vec<_> = relays.iter().map(Relay::stats).collect();
    let running: Vec<_> = relays
        .into_iter()
        .map(|relay| {
            let stop = stop_relays.clone();
            tokio::spawn(async move { relay.run(stop).await })
        })
        .collect();
    outbox_empty(&producer).await;
    stop_relays.cancel();
    for relay in running {
        relay.await.unwrap();
    }
    let (a, b) = (stats[0].snapshot(), stats[1].snapshot());
    assert!(
        a.published > 0 && b.published > 0,
        "both relays worked: {a:?} {b:?}"
    );
    assert_eq!(
        a.published + b.published,
        ROWS as u64,
        "each row once between them"
    );
    assert_eq!(a.marked + b.marked, ROWS as u64);
    // Its batch of 10 and (issue 42: the running relay claims the next batch while one is
    // published) the 10 it may have claimed ahead, all leased when it died: each claimed
    // twice in all (its stats may miss a claim the abort cut off after the database ran it).
    let twice = producer
        .count("sb_outbox WHERE attempts > 1")
        .await
        .unwrap();
    assert!([10, 20].contains(&twice), "{twice} claimed twice");
    assert_eq!(
        a.republished + b.republished,
        twice as u64,
        "the victim's claimed rows came back as retries"
    );
    assert_eq!(a.lease_lost + b.lease_lost, 0);

    // 3. Downstream: 43 messages arrived (no broker duplicate detection on `outbox`), the
    //    inbox dropped the victim's 3 as duplicates, every order took effect once.
    let sent = (ROWS + 3) as u64;
    queue_drained(&emulator, "outbox", sent).await;
    stop_consumer.cancel();
    consuming.await.unwrap().unwrap();
    assert_eq!(
        emulator.broker().entity("outbox").unwrap().counts().sent,
        sent
    );
    let outcomes = consumer.stats().snapshot();
    assert_eq!((outcomes.processed, outcomes.duplicate), (ROWS as u64, 3));
    assert_eq!(
        inventory_totals(&downstream).await,
        (ROWS as i64, ROWS as i64, 2 * ROWS as i64)
    );
}

/// The worker wires both: each reservation writes `inventory.stock-reserved.v1` to the outbox
/// and the worker's relay publishes it; the retention task deletes inbox rows older than the
/// configured retention (30 days), not merely older than the replay horizon (14 days).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_relays_its_events_and_keeps_the_configured_retention() {
    use crate::support::orders::order;
    use crate::support::{Backdate, pg_url, schema_for, with_search_path};

    crate::support::init_tracing();
    let store: PgStore = pg_store("worker_relay_retention", 4).await;
    let mut tx = store.begin().await.unwrap();
    for (consumer, i) in [("aged-40d", 0), ("aged-40d", 1), ("aged-20d", 0)] {
        tx.insert_inbox(consumer, &format!("m-{i}")).await.unwrap();
    }
    tx.commit().await.unwrap();
    store
        .backdate("sb_inbox", "processed_at", 40, "consumer = 'aged-40d'")
        .await
        .unwrap();
    store
        .backdate("sb_inbox", "processed_at", 20, "consumer = 'aged-20d'")
        .await
        .unwrap();

    let emulator = emulator("PT5S").await;
    let sender = client(&emulator).sender("orders");
    for i in 0..10 {
        sender
            .send(order(&format!("m-{i}"), &format!("o-{i}")))
            .await
            .unwrap();
    }
    let env = |name: &str| {
        Some(match name {
            "SB_INBOX_CONSUMER" => sb_inbox_cli::inventory::CONSUMER.to_owned(),
            "SB_INBOX_STORE" => with_search_path(&pg_url(), &schema_for("worker_relay_retention")),
            "SB_INBOX_SERVICEBUS_CONNECTION" => emulator.connection_string(),
            "SB_INBOX_ENTITY" => "orders".to_owned(),
            "SB_INBOX_LOCK_MARGIN_SECS" => "2".to_owned(),
            "SB_INBOX_OUTBOX_POLL_MS" => "20".to_owned(),
            "SB_INBOX_RETENTION_SECS" => (30 * 86_400).to_string(),
            "SB_INBOX_MESSAGE_TTL_SECS" => (14 * 86_400).to_string(),
            "SB_INBOX_LOCK_DURATION_SECS" => "5".to_owned(),
            "SB_INBOX_MAX_DELIVERY_COUNT" => "5".to_owned(),
            _ => return None,
        })
    };
    let config = sb_inbox::worker::WorkerConfig::load(None, &env).unwrap();
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let (config, shutdown) = (config.clone(), shutdown.clone());
        async move { sb_inbox_cli::run::run(&config, Some("outbox"), shutdown).await }
    });
    crate::worker::drained(&emulator, 10).await;
    outbox_empty(&store).await;
    let events = emulator.broker().entity("outbox").unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while events.counts().active < 10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("ten events published");
    tokio::time::timeout(Duration::from_secs(30), async {
        while store
            .count("sb_inbox WHERE consumer = 'aged-40d'")
            .await
            .unwrap()
            > 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("retention deletes the rows past 30 days");
    shutdown.cancel();
    assert_eq!(worker.await.unwrap().unwrap().processed, 10);
    assert_eq!(
        store
            .count("sb_inbox WHERE consumer = 'aged-20d'")
            .await
            .unwrap(),
        1,
        "20 days is past the horizon but inside the configured retention: kept"
    );
    assert_eq!(
        store
            .count("sb_inbox WHERE consumer = 'inventory.order-placed.v1'")
            .await
            .unwrap(),
        10
    );

    // The events carry the ids written with the rows, the contract and the order.
    let receiver = client(&emulator).receiver("outbox", 10);
    let mut orders = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let delivery = sb_inbox::Receiver::receive(&receiver)
            .await
            .unwrap()
            .unwrap();
        let message = sb_inbox::Delivery::message(&delivery).clone();
        assert_eq!(
            message.subject.as_deref(),
            Some(sb_inbox_cli::inventory::EVENT_CONTRACT)
        );
        let event: sb_inbox_cli::inventory::StockReserved =
            serde_json::from_slice(&message.body).unwrap();
        assert_eq!(
            message.correlation_id.as_deref(),
            Some(event.order_id.replace("o-", "m-").as_str())
        );
        let written: i64 = store
            .query(
                "SELECT count(*) FROM sb_outbox WHERE message_id = $1 AND dispatched_at IS NOT NULL",
                &[&message.message_id.clone().unwrap()],
            )
            .await
            .unwrap()[0]
            .get(0);
        assert_eq!(written, 1, "published under the id written with the row");
        orders.insert(event.order_id);
        sb_inbox::Delivery::complete(&delivery).await.unwrap();
    }
    assert_eq!(orders.len(), 10);
    receiver.close().await;
}

/// `sb-inbox run` refuses a retention shorter than the replay horizon and says which value to
/// change.
#[test]
fn run_refuses_a_retention_shorter_than_the_replay_horizon() {
    let output = std::process::Command::new(crate::support::cli::BINARY)
        .args(["run"])
        .env_clear()
        .env("SB_INBOX_CONSUMER", sb_inbox_cli::inventory::CONSUMER)
        .env("SB_INBOX_STORE", "sqlite::memory:")
        .env(
            "SB_INBOX_SERVICEBUS_CONNECTION",
            "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true",
        )
        .env("SB_INBOX_ENTITY", "orders")
        .env("SB_INBOX_RETENTION_SECS", "604800")
        .env("SB_INBOX_MESSAGE_TTL_SECS", "1209600")
        .env("SB_INBOX_LOCK_DURATION_SECS", "60")
        .env("SB_INBOX_MAX_DELIVERY_COUNT", "10")
        .env("SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS", "604800")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for part in [
        "retention.retention_secs (SB_INBOX_RETENTION_SECS)",
        "dedupe retention 604800 s is shorter than the replay horizon 1815000 s",
        "raise SB_INBOX_RETENTION_SECS (retention.retention_secs) to at least 1815000",
    ] {
        assert!(stderr.contains(part), "{part:?} missing from:\n{stderr}");
    }
    eprintln!("{stderr}");
}

/// Publishes through the real publisher, but fails every `every`-th send transiently before it
/// reaches the broker (a throttled or dropped link), so rows back off mid-session.
struct Flaky {
    inner: ServiceBusSenderPort,
    every: usize,
    calls: AtomicUsize,
    failed: AtomicUsize,
}

impl Sender for Flaky {
    async fn send(
        &self,
        destination: &str,
        message: Message,
        at: Option<SystemTime>,
    ) -> Result<(), SendFailure> {
        if (self.calls.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(self.every) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(SendFailure::Transient("server-busy (injected)".into()));
        }
        self.inner.send(destination, message, at).await
    }
}

/// Issue 40, M6 (must show): 1000 outbox rows over 10 session ids for one session-enabled
/// queue, relayed with every 7th send failing transiently. Each session's messages reach the
/// queue in commit order, each once, and carry their session id (before the session column the
/// queue refused every row).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_rows_reach_a_session_queue_in_commit_order_across_failures() {
    use crate::support::emulator::{queue, session_properties, start};
    use sb_emulator::EmulatorOptions;

    const SESSIONS: usize = 10;
    const PER_SESSION: usize = 100;
    crate::support::init_tracing();
    let emulator = start(
        vec![queue("events", session_properties("PT30S"))],
        EmulatorOptions::default(),
    )
    .await;
    let store = crate::support::sqlite_store("relay_sessions", 1).await;
    // One commit per row, interleaving the sessions as consumers would.
    for n in 0..SESSIONS * PER_SESSION {
        let mut tx = store.begin().await.unwrap();
        let message = OutboxMessage::new("events", "test.event.v1", b"{}".to_vec())
            .with_session_id(format!("s-{}", n % SESSIONS))
            .with_property("n", i64::try_from(n).unwrap());
        tx.append_outbox(&message).await.unwrap();
        tx.commit().await.unwrap();
    }
    let flaky = Flaky {
        inner: ServiceBusSenderPort::new(client(&emulator)),
        every: 7,
        calls: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
    };
    let config = RelayConfig::default()
        .with_batch_size(100)
        .with_poll_interval(Duration::from_millis(1));
    let relay = Relay::new(store.clone(), flaky, config);
    let stop = CancellationToken::new();
    tokio::time::timeout(Duration::from_secs(120), async {
        while relay.backlog().await.unwrap().pending > 0 {
            relay.relay_once(&stop).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the relay publishes every row");
    assert!(relay.publisher().failed.load(Ordering::SeqCst) > 100);

    let client = client(&emulator);
    for s in 0..SESSIONS {
        let session = format!("s-{s}");
        let receiver = client.accept_session("events", &session).await.unwrap();
        let mut received = Vec::new();
        while let Some(delivery) = receiver.receive(Duration::from_millis(500)).await.unwrap() {
            let message = Message::from(delivery.message());
            assert_eq!(message.session_id.as_deref(), Some(session.as_str()));
            let Some(sb_inbox::PropertyValue::Long(n)) = message.application_properties.get("n")
            else {
                panic!("{message:?}");
            };
            received.push(*n);
            delivery.complete().await.unwrap();
        }
        receiver.close().await;
        let expected: Vec<i64> = (0..PER_SESSION)
            .map(|k| i64::try_from(k * SESSIONS + s).unwrap())
            .collect();
        assert_eq!(received, expected, "{session}: in commit order, each once");
    }
}
