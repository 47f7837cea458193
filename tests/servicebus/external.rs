//! Issue 13, an independent broker: a selected set of the client's cases and the worker's
//! process test, written against nothing but what any Service Bus shows a client (no emulator
//! internals), so they run against an external broker given by `SB_INBOX_EXTERNAL_SERVICEBUS`
//! (a connection string): Microsoft's Service Bus emulator in GitHub Actions
//! (`.github/workflows/servicebus-emulator.yml`), or a namespace of your own. Each case uses a
//! queue of its own from `.github/servicebus-emulator/Config.json` and first drains what an
//! earlier run left there.
//!
//! Without the variable each test says `skipped: … needs an external Service Bus …` and passes,
//! also under `CI=true` (an opt-in dependency, `sb_testkit::opt_in`): this machine kind has no
//! Docker. So that the cases themselves stay verified here, one test runs them all against
//! `sb-emulator` loaded from that same Config.json.
//!
//! What Microsoft's emulator cannot do is left out by design: AMQP over WebSockets, partitioned
//! entities, more than 10 connections per namespace (the workflow runs two tests at a time),
//! messages over 256 KB, a lock over 5 minutes or a time-to-live over an hour
//! (learn.microsoft.com/azure/service-bus-messaging/overview-emulator, "Known limitations" and
//! "Usage quotas"; the installer repository's Config-schema.json).

use std::time::{Duration, SystemTime};

use sb_inbox::servicebus::{
    ConnectionString, SendErrorKind, ServiceBusClient, ServiceBusDelivery, ServiceBusReceiver,
};
use sb_inbox::{Delivery, Message, PropertyValue, ReceiveError, Receiver, SendFailure, Sender};
use sb_inbox_cli::inventory::InventoryStore;

use crate::support::inventory_totals;
use crate::support::orders::order;
use crate::worker::{health_address, ready, sigterm_exits_0, sqlite_worker};

/// The connection string of the external broker.
const ENV: &str = "SB_INBOX_EXTERNAL_SERVICEBUS";
/// The entities of the external broker, as the workflow loads them.
const CONFIG: &str = ".github/servicebus-emulator/Config.json";
/// How long a case waits for a message it expects.
const ARRIVAL: Duration = Duration::from_secs(30);

/// The external broker's connection string, or `None` (and a visible skip).
fn external() -> Option<String> {
    let connection = std::env::var(ENV).ok().filter(|v| !v.trim().is_empty());
    sb_testkit::opt_in(sb_testkit::EXTERNAL_SERVICEBUS, connection.is_some()).then_some(())?;
    connection
}

fn client_for(connection: &str) -> ServiceBusClient {
    let cs: ConnectionString = connection.parse().expect("the connection string parses");
    ServiceBusClient::from_connection_string(&cs)
}

fn message(id: &str) -> Message {
    Message::new(
        id,
        "orders.order-placed.v1",
        format!(r#"{{"orderId":"{id}","lines":[{{"sku":"A","quantity":1}}]}}"#),
    )
}

/// A message id unique to this run, so a leftover of an earlier run is never taken for it.
fn unique(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// The next delivery of `receiver`, within [`ARRIVAL`]. A transient failure (the service may
/// detach a link at any time) is retried, as the runtime does.
async fn next(receiver: &impl Receiver<Delivery = ServiceBusDelivery>) -> ServiceBusDelivery {
    tokio::time::timeout(ARRIVAL, async {
        loop {
            match receiver.receive().await {
                Ok(Some(delivery)) => return delivery,
                Ok(None) | Err(ReceiveError::Transient(_)) => {}
                Err(error) => panic!("receive: {error:?}"),
            }
        }
    })
    .await
    .expect("a message arrives")
}

/// Completes whatever `entity` holds (an earlier run's leftovers) until it stays quiet for 1 s;
/// returns the receiver for the case to go on with.
async fn drain(client: &ServiceBusClient, entity: &str) -> ServiceBusReceiver {
    let receiver = client.receiver(entity, 0);
    while let Ok(received) = tokio::time::timeout(Duration::from_secs(1), receiver.receive()).await
    {
        match received {
            Ok(Some(delivery)) => delivery.complete().await.expect("complete a leftover"),
            Ok(None) => {}
            Err(ReceiveError::Transient(_)) => {}
            Err(error) => panic!("draining {entity}: {error:?}"),
        }
    }
    receiver
}

async fn round_trip_keeps_every_field(connection: &str) {
    const QUEUE: &str = "ext.roundtrip";
    let client = client_for(connection);
    let receiver = drain(&client, QUEUE).await;
    let id = unique("m");
    let mut sent = message(&id);
    sent.correlation_id = Some("c-1".into());
    sent.application_properties
        .insert("tenant".into(), "t1".into());
    sent.application_properties
        .insert("n".into(), PropertyValue::Long(7));
    client.sender(QUEUE).send(sent.clone()).await.unwrap();
    let delivery = next(&receiver).await;
    let got = delivery.message();
    assert_eq!(got.message_id, sent.message_id);
    assert_eq!(
        (&got.subject, &got.correlation_id, &got.body),
        (&sent.subject, &sent.correlation_id, &sent.body)
    );
    for (name, value) in &sent.application_properties {
        assert_eq!(got.application_properties.get(name), Some(value), "{name}");
    }
    assert_eq!(delivery.delivery_count(), 0);
    assert!(!delivery.lock_token().is_nil());
    assert!(delivery.locked_until() > SystemTime::now(), "a live lock");
    assert!(delivery.sequence_number().is_some_and(|n| n > 0));
    assert!(
        delivery.enqueued_time().is_some(),
        "the broker's enqueued time"
    );
    delivery.complete().await.unwrap();
    assert!(
        client.peek(QUEUE, 0, 10).await.unwrap().is_empty(),
        "completed means gone"
    );
}

async fn abandon_redelivers_with_the_properties_and_a_higher_count(connection: &str) {
    const QUEUE: &str = "ext.abandon";
    let client = client_for(connection);
    let receiver = drain(&client, QUEUE).await;
    let id = unique("m");
    client.sender(QUEUE).send(message(&id)).await.unwrap();
    let first = next(&receiver).await;
    let properties = [(
        "sb-inbox-last-error".to_owned(),
        PropertyValue::String("timeout".into()),
    )]
    .into_iter()
    .collect();
    first.abandon(properties).await.unwrap();
    let second = next(&receiver).await;
    assert_eq!(second.message().message_id.as_deref(), Some(id.as_str()));
    assert_eq!(second.delivery_count(), 1);
    assert_eq!(
        second
            .message()
            .application_properties
            .get("sb-inbox-last-error"),
        Some(&PropertyValue::String("timeout".into()))
    );
    second.complete().await.unwrap();
}

async fn scheduled_messages_wait_and_unknown_queues_are_permanent(connection: &str) {
    const QUEUE: &str = "ext.schedule";
    let client = client_for(connection);
    let receiver = drain(&client, QUEUE).await;
    let publisher = sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone());
    let (later, now) = (unique("later"), unique("now"));
    let at = SystemTime::now() + Duration::from_secs(5);
    publisher
        .send(QUEUE, message(&later), Some(at))
        .await
        .unwrap();
    publisher.send(QUEUE, message(&now), None).await.unwrap();
    let first = next(&receiver).await;
    assert_eq!(first.message().message_id.as_deref(), Some(now.as_str()));
    first.complete().await.unwrap();
    let second = next(&receiver).await;
    assert_eq!(second.message().message_id.as_deref(), Some(later.as_str()));
    // The emulator runs on this machine, so both read one clock; 1 s for rounding.
    assert!(
        SystemTime::now() + Duration::from_secs(1) >= at,
        "a scheduled message is not delivered before its time"
    );
    second.complete().await.unwrap();

    let missing = publisher
        .send("ext.no-such-queue", message("x"), None)
        .await;
    assert!(
        matches!(missing, Err(SendFailure::Permanent(_))),
        "{missing:?}"
    );
    let error = client
        .sender("ext.no-such-queue")
        .send(message("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(error.error, SendErrorKind::NotFound(_)),
        "{error:?}"
    );
    let error = client
        .receiver("ext.no-such-queue", 0)
        .receive()
        .await
        .unwrap_err();
    assert!(matches!(error, ReceiveError::Permanent(_)), "{error:?}");
}

async fn dead_letter_carries_reason_and_description(connection: &str) {
    const QUEUE: &str = "ext.deadletter";
    const DLQ: &str = "ext.deadletter/$DeadLetterQueue";
    let client = client_for(connection);
    let receiver = drain(&client, QUEUE).await;
    let dead_letters = drain(&client, DLQ).await;
    let id = unique("m");
    client.sender(QUEUE).send(message(&id)).await.unwrap();
    let delivery = next(&receiver).await;
    delivery
        .dead_letter("InvalidPayload", "invalid JSON at line 1 column 2")
        .await
        .unwrap();
    let peeked = client.peek(DLQ, 0, 10).await.unwrap();
    assert_eq!(peeked.len(), 1, "{peeked:?}");
    assert_eq!(peeked[0].dead_letter_reason(), Some("InvalidPayload"));
    let dead = next(&dead_letters).await;
    let props = &dead.message().application_properties;
    assert_eq!(dead.message().message_id.as_deref(), Some(id.as_str()));
    assert_eq!(
        props.get("DeadLetterReason"),
        Some(&PropertyValue::String("InvalidPayload".into()))
    );
    assert_eq!(
        props.get("DeadLetterErrorDescription"),
        Some(&PropertyValue::String(
            "invalid JSON at line 1 column 2".into()
        ))
    );
    dead.complete().await.unwrap();
}

async fn renewing_extends_the_lock_and_a_settled_lock_is_gone(connection: &str) {
    const QUEUE: &str = "ext.renew";
    let client = client_for(connection);
    let receiver = drain(&client, QUEUE).await;
    client
        .sender(QUEUE)
        .send(message(&unique("m")))
        .await
        .unwrap();
    let delivery = next(&receiver).await;
    let before = delivery.locked_until();
    let renewed = delivery.renew_lock().await.unwrap();
    assert!(renewed >= before, "{renewed:?} < {before:?}");
    assert_eq!(delivery.locked_until(), renewed);
    delivery.complete().await.unwrap();
    assert!(
        delivery.renew_lock().await.is_err(),
        "no lock to renew after completion"
    );
}

async fn peek_pages_in_order_without_locking(connection: &str) {
    const QUEUE: &str = "ext.peek";
    let client = client_for(connection);
    let receiver = drain(&client, QUEUE).await;
    let ids: Vec<String> = (0..3).map(|i| unique(&format!("p{i}"))).collect();
    let sender = client.sender(QUEUE);
    for id in &ids {
        sender.send(message(id)).await.unwrap();
    }
    let peeked = client.peek(QUEUE, 0, 10).await.unwrap();
    let seen: Vec<_> = peeked
        .iter()
        .map(|p| p.message.message_id.clone().unwrap_or_default())
        .collect();
    assert_eq!(seen, ids);
    assert!(peeked.iter().all(|p| p.delivery_count == 0));
    let rest = client
        .peek(QUEUE, peeked[0].sequence_number + 1, 10)
        .await
        .unwrap();
    assert_eq!(rest.len(), 2, "paging from a sequence number");
    // Peeking locked nothing: every message is delivered, for the first time.
    for id in &ids {
        let delivery = next(&receiver).await;
        assert_eq!(delivery.message().message_id.as_ref(), Some(id));
        assert_eq!(delivery.delivery_count(), 0);
        delivery.complete().await.unwrap();
    }
}

/// `sb-inbox run` on SQLite consuming the external queue: 10 orders, 5 sent twice, a poison
/// message; each order reserved once, the poison dead-lettered, the queue drained, exit 0 on
/// SIGTERM.
async fn the_worker_process_applies_each_order_once_and_exits_0(connection: &str) {
    const QUEUE: &str = "ext.worker";
    const DLQ: &str = "ext.worker/$DeadLetterQueue";
    let client = client_for(connection);
    // Closed, so that it holds no credit the worker's deliveries could go to.
    drain(&client, QUEUE).await.close().await;
    let dead_letters = drain(&client, DLQ).await;
    let run = unique("w");
    let (dir, db, mut child) = sqlite_worker(
        &run,
        connection,
        &[
            ("SB_INBOX_ENTITY", QUEUE),
            ("SB_INBOX_LOCK_MARGIN_SECS", "5"),
        ],
    )
    .await;
    let stderr = child.stderr.take().unwrap();
    let addr = tokio::task::spawn_blocking(move || health_address(stderr))
        .await
        .unwrap();
    ready(addr).await;

    let sender = client.sender(QUEUE);
    for i in 0..10 {
        let order = order(&format!("{run}-m{i}"), &format!("{run}-o{i}"));
        if i % 2 == 0 {
            sender.send(order.clone()).await.unwrap();
        }
        sender.send(order).await.unwrap();
    }
    let poison = format!("{run}-poison");
    sender
        .send(Message::new(&poison, "orders.order-placed.v1", "{nope"))
        .await
        .unwrap();

    let dead = next(&dead_letters).await;
    assert_eq!(dead.message().message_id.as_deref(), Some(poison.as_str()));
    dead.complete().await.unwrap();
    let store = sb_inbox::SqliteStore::open(&db).unwrap();
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let reserved = store.inventory_counts().await.unwrap().reservations;
            if reserved >= 10 && client.peek(QUEUE, 0, 10).await.unwrap().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("every order reserved and the queue drained");

    sigterm_exits_0(child).await;
    assert_eq!(
        inventory_totals(&store).await,
        (10, 10, 20),
        "each order once, duplicates recognised"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip() {
    if let Some(connection) = external() {
        round_trip_keeps_every_field(&connection).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon() {
    if let Some(connection) = external() {
        abandon_redelivers_with_the_properties_and_a_higher_count(&connection).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule() {
    if let Some(connection) = external() {
        scheduled_messages_wait_and_unknown_queues_are_permanent(&connection).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter() {
    if let Some(connection) = external() {
        dead_letter_carries_reason_and_description(&connection).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew() {
    if let Some(connection) = external() {
        renewing_extends_the_lock_and_a_settled_lock_is_gone(&connection).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek() {
    if let Some(connection) = external() {
        peek_pages_in_order_without_locking(&connection).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    if let Some(connection) = external() {
        the_worker_process_applies_each_order_once_and_exits_0(&connection).await;
    }
}

/// The cases above, run here against `sb-emulator` loaded from the Config.json the workflow
/// gives Microsoft's emulator: the entities exist there and the cases hold on a broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_passes_against_sb_emulator_with_the_shipped_config() {
    // This binary is a target of sb-inbox-cli: the repository is two levels up.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(CONFIG);
    let config = sb_emulator::Config::from_path(&path).expect("the shipped Config.json loads");
    let broker = sb_emulator::Broker::new(config).unwrap();
    let emulator = sb_emulator::Emulator::start(broker, sb_emulator::EmulatorOptions::default())
        .await
        .unwrap();
    let connection = emulator.connection_string();
    round_trip_keeps_every_field(&connection).await;
    abandon_redelivers_with_the_properties_and_a_higher_count(&connection).await;
    scheduled_messages_wait_and_unknown_queues_are_permanent(&connection).await;
    dead_letter_carries_reason_and_description(&connection).await;
    renewing_extends_the_lock_and_a_settled_lock_is_gone(&connection).await;
    peek_pages_in_order_without_locking(&connection).await;
    the_worker_process_applies_each_order_once_and_exits_0(&connection).await;
}
