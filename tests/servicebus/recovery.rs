//! The client survives what Azure Service Bus does to links (issue 13): detaches it retries
//! are re-attached on the same connection, with the worker running on; fatal ones stop it; a
//! link's failure fences only its own deliveries, which still settle by lock token; busy
//! dispositions are retried; oversized sends fail alone.

use std::time::Duration;

use sb_amqp::{AmqpError, condition};
use sb_emulator::{Emulator, EmulatorOptions, Fault, LinkRole};
use sb_inbox::servicebus::{SendErrorKind, ServiceBusClient};
use sb_inbox::worker::WorkerConfig;
use sb_inbox::{Delivery, Message, ReceiveError, Receiver, Sender};
use tokio_util::sync::CancellationToken;

use crate::support::emulator::{client, emulator, emulator_with, send};
use crate::support::orders::order;
use crate::worker::drained;

/// The detach conditions the SDKs recover from by re-attaching the link, plus
/// unauthorized-access (re-attached once after a fresh token).
const RECOVERED: [&str; 8] = [
    condition::DETACH_FORCED,
    condition::SERVER_BUSY,
    condition::TIMEOUT,
    condition::INTERNAL_ERROR,
    "amqp:unknown-error",
    "com.microsoft:operation-cancelled",
    condition::LINK_STOLEN,
    condition::UNAUTHORIZED_ACCESS,
];

/// The conditions no retry clears.
const FATAL: [&str; 4] = [
    condition::NOT_FOUND,
    condition::NOT_ALLOWED,
    "com.microsoft:entity-disabled",
    condition::MESSAGE_SIZE_EXCEEDED,
];

/// The ids of the live links on `entity` in `role`.
fn link_ids(emulator: &Emulator, entity: &str, role: LinkRole) -> Vec<u64> {
    emulator
        .links()
        .into_iter()
        .filter(|l| l.entity.eq_ignore_ascii_case(entity) && l.role == role)
        .map(|l| l.id)
        .collect()
}

/// Waits (bounded) until a receiver link on `orders` other than `old` is live; returns it.
async fn receiver_link_other_than(emulator: &Emulator, old: &[u64]) -> u64 {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(id) = link_ids(emulator, "orders", LinkRole::Receiver)
                .into_iter()
                .find(|id| !old.contains(id))
            {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a receive link is attached")
}

/// Receives the next delivery and completes it.
pub(crate) async fn complete_next(receiver: &sb_inbox::servicebus::ServiceBusReceiver) {
    let delivery = receiver.receive().await.unwrap().unwrap();
    delivery.complete().await.unwrap();
}

fn detach_error(condition: &str) -> AmqpError {
    AmqpError::new(condition, Some(format!("forced by the test: {condition}")))
}

fn worker_env(emulator: &Emulator) -> impl Fn(&str) -> Option<String> + use<> {
    let connection = emulator.connection_string();
    move |name: &str| match name {
        "SB_INBOX_CONSUMER" => Some(sb_inbox_cli::inventory::CONSUMER.to_owned()),
        "SB_INBOX_STORE" => Some("sqlite::memory:".to_owned()),
        "SB_INBOX_SERVICEBUS_CONNECTION" => Some(connection.clone()),
        "SB_INBOX_ENTITY" => Some("orders".to_owned()),
        _ => None,
    }
}

/// Must show 1: for each condition, the worker's receive link is detached with it; the worker
/// keeps running, a new link is attached, and the next order is processed and completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_re_attaches_after_every_transient_detach_and_keeps_processing() {
    let emulator = emulator("PT30S").await;
    let config = WorkerConfig::load(None, &worker_env(&emulator)).unwrap();
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { sb_inbox_cli::run::run(&config, None, shutdown).await }
    });
    let sender = client(&emulator).sender("orders");
    sender.send(order("m-0", "o-0")).await.unwrap();
    drained(&emulator, 1).await;
    let mut live = receiver_link_other_than(&emulator, &[]).await;
    for (i, condition) in RECOVERED.iter().enumerate() {
        assert!(
            emulator.force_detach_link(live, detach_error(condition)),
            "{condition}: the link was live"
        );
        let n = i + 1;
        sender
            .send(order(&format!("m-{n}"), &format!("o-{n}")))
            .await
            .unwrap();
        drained(&emulator, n as u64 + 1).await;
        assert!(!worker.is_finished(), "{condition}: the worker still runs");
        live = receiver_link_other_than(&emulator, &[live]).await;
    }
    shutdown.cancel();
    let stats = worker.await.unwrap().unwrap();
    assert_eq!(stats.processed, RECOVERED.len() as u64 + 1);
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!(
        (counts.completed, counts.dead_lettered_total),
        (RECOVERED.len() as u64 + 1, 0)
    );
}

/// Detaches that no retry clears end the receive with a fatal error.
#[tokio::test]
async fn fatal_detach_conditions_stop_the_receiver() {
    let emulator = emulator("PT30S").await;
    let mut seen = Vec::new();
    for condition in FATAL {
        let receiver = client(&emulator).receiver("orders", 0);
        let pending = tokio::spawn(async move { receiver.receive().await.map(|_| ()) });
        let link = receiver_link_other_than(&emulator, &seen).await;
        seen.push(link);
        assert!(emulator.force_detach_link(link, detach_error(condition)));
        match pending.await.unwrap() {
            Err(ReceiveError::Permanent(text)) => {
                assert!(text.to_string().contains(condition), "{text}")
            }
            other => panic!("{condition}: {other:?}"),
        }
    }
}

/// Readiness: a receiver reports detached between the service's detach and its re-attach.
#[tokio::test]
async fn the_receiver_reports_detached_until_it_re_attaches() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    send(&client, "orders", order("m-1", "o-1")).await;
    let receiver = client.receiver("orders", 0);
    assert!(
        !receiver.is_attached(),
        "not attached before the first receive"
    );
    complete_next(&receiver).await;
    assert!(receiver.is_attached());
    let pending = tokio::spawn({
        let receiver = receiver.clone();
        async move { receiver.receive().await.map(|_| ()) }
    });
    let link = receiver_link_other_than(&emulator, &[]).await;
    emulator.force_detach_link(link, detach_error(condition::DETACH_FORCED));
    assert!(matches!(
        pending.await.unwrap(),
        Err(ReceiveError::Transient(_))
    ));
    assert!(!receiver.is_attached(), "not ready while re-attaching");
    assert!(client.is_connected(), "the connection stays");
    send(&client, "orders", order("m-2", "o-2")).await;
    complete_next(&receiver).await;
    assert!(receiver.is_attached());
}

/// The review's sequence: a receiver and a publisher on one client; only the publisher's link
/// is force-detached (as the service does to an idle sender); a delivery received before
/// still completes at the broker, and the publisher sends again.
#[tokio::test]
async fn a_detached_publisher_does_not_fence_the_receivers_deliveries() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    let publisher = sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone());
    publisher
        .send("orders", order("m-1", "o-1"), None)
        .await
        .unwrap();
    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    let senders = link_ids(&emulator, "orders", LinkRole::Sender);
    assert_eq!(senders.len(), 1);
    assert!(emulator.force_detach_link(senders[0], detach_error(condition::DETACH_FORCED)));
    publisher
        .send("orders", order("m-2", "o-2"), None)
        .await
        .unwrap();
    delivery.complete().await.unwrap();
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.active), (1, 1));
    let receivers = link_ids(&emulator, "orders", LinkRole::Receiver);
    assert_eq!(receivers.len(), 1, "the receive link was never touched");
    let second = receiver.receive().await.unwrap().unwrap();
    assert_eq!(second.message().message_id.as_deref(), Some("m-2"));
    second.complete().await.unwrap();
}

/// Waits (bounded) until the client has seen the service's detach of `receiver`'s link.
async fn seen_detached(receiver: &sb_inbox::servicebus::ServiceBusReceiver) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while receiver.is_attached() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the client sees the detach");
}

/// A delivery whose own link was detached settles by its lock token on `$management`: the
/// lock, not the link, decides. The receiver, not receiving when its link went (F8), replaces
/// it before its next receive, which delivers on the first try.
#[tokio::test]
async fn a_delivery_of_a_detached_link_still_completes_by_lock_token() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    let sender = client.sender("orders");
    sender.send(order("m-1", "o-1")).await.unwrap();
    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    let link = receiver_link_other_than(&emulator, &[]).await;
    assert!(emulator.force_detach_link(link, detach_error(condition::DETACH_FORCED)));
    seen_detached(&receiver).await;
    delivery.renew_lock().await.unwrap();
    delivery.complete().await.unwrap();
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.locked), (1, 0));
    sender.send(order("m-2", "o-2")).await.unwrap();
    let next = receiver.receive().await.unwrap().unwrap();
    assert_eq!(next.message().message_id.as_deref(), Some("m-2"));
    next.complete().await.unwrap();
    assert!(receiver.is_attached());
}

/// F8: a receiver whose link the service detached as idle while it was not receiving (its
/// caller busy) receives again on the first try: the detached link is replaced before the
/// receive, with no failed attempt and no backoff first.
#[tokio::test]
async fn a_receiver_whose_link_was_idle_detached_receives_again_on_the_first_try() {
    let emulator = emulator_with(
        "PT30S",
        EmulatorOptions::default().with_link_idle_timeout(Duration::from_secs(1)),
    )
    .await;
    let client = client(&emulator);
    send(&client, "orders", order("m-1", "o-1")).await;
    let receiver = client.receiver("orders", 0);
    complete_next(&receiver).await;
    let before = link_ids(&emulator, "orders", LinkRole::Receiver);
    assert_eq!(before.len(), 1);
    // Nothing on the link for the idle timeout: the emulator force-detaches it.
    seen_detached(&receiver).await;
    send(&client, "orders", order("m-2", "o-2")).await;
    let next = receiver.receive().await.unwrap().unwrap();
    assert_eq!(next.message().message_id.as_deref(), Some("m-2"));
    next.complete().await.unwrap();
    let after = link_ids(&emulator, "orders", LinkRole::Receiver);
    assert!(
        after.len() == 1 && after != before,
        "a new link replaced the idle one: {before:?} → {after:?}"
    );
}

/// F8 with a pipelined receiver: deliveries already on the link when the service detached it
/// are still handed out, and complete by lock token; the link is then replaced.
#[tokio::test]
async fn deliveries_queued_on_a_detached_link_are_handed_out_and_complete_by_lock_token() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    for i in 1..=3 {
        send(&client, "orders", order(&format!("m-{i}"), "o-1")).await;
    }
    let receiver = client.receiver("orders", 0).with_capacity(4);
    complete_next(&receiver).await;
    // All three were sent on the link before the detach.
    tokio::time::timeout(Duration::from_secs(30), async {
        while emulator.broker().entity("orders").unwrap().counts().locked < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the rest are on the link");
    let link = receiver_link_other_than(&emulator, &[]).await;
    assert!(emulator.force_detach_link(link, detach_error(condition::DETACH_FORCED)));
    seen_detached(&receiver).await;
    for expected in ["m-2", "m-3"] {
        let delivery = receiver.receive().await.unwrap().unwrap();
        assert_eq!(delivery.message().message_id.as_deref(), Some(expected));
        delivery.complete().await.unwrap();
    }
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.locked, counts.active), (3, 0, 0));
    send(&client, "orders", order("m-4", "o-1")).await;
    complete_next(&receiver).await;
    assert!(receiver.is_attached());
}

/// `rejected{com.microsoft:server-busy}` on every disposition: the settlement is retried (by
/// lock token) and completes.
#[tokio::test]
async fn busy_dispositions_are_retried_until_they_complete() {
    let options = EmulatorOptions::default().with_fault(Fault::BusySettle, 1.0);
    let emulator = emulator_with("PT30S", options).await;
    // A short busy pause: this test is about the retry, not its length (see `fidelity`).
    let client = client(&emulator).with_server_busy_wait(Duration::from_millis(100));
    send(&client, "orders", order("m-1", "o-1")).await;
    let delivery = client
        .receiver("orders", 0)
        .receive()
        .await
        .unwrap()
        .unwrap();
    delivery.complete().await.unwrap();
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.locked, counts.active), (1, 0, 0));
}

/// With tokens honoured for one second, the service detaches the links as unauthorized over
/// and over; the worker puts fresh tokens, re-attaches and processes what comes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tokens_are_replaced_and_the_links_re_attached() {
    let options = EmulatorOptions::default().with_max_token_lifetime(Duration::from_secs(1));
    let emulator = emulator_with("PT30S", options).await;
    let config = WorkerConfig::load(None, &worker_env(&emulator)).unwrap();
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { sb_inbox_cli::run::run(&config, None, shutdown).await }
    });
    let publisher = sb_inbox::servicebus::ServiceBusSenderPort::new(client(&emulator).clone());
    let mut first = receiver_link_other_than(&emulator, &[]).await;
    for n in 0..3u64 {
        // Each round waits for the token to run out and the link to be replaced.
        first = receiver_link_other_than(&emulator, &[first]).await;
        publisher
            .send("orders", order(&format!("m-{n}"), &format!("o-{n}")), None)
            .await
            .unwrap();
        drained(&emulator, n + 1).await;
        assert!(!worker.is_finished());
    }
    shutdown.cancel();
    let stats = worker.await.unwrap().unwrap();
    assert_eq!(stats.processed, 3);
}

/// A message over the link's `max-message-size` fails as `SizeExceeded` and leaves the link:
/// the next send goes over the same one.
#[tokio::test]
async fn an_oversized_send_fails_alone() {
    let emulator = emulator("PT30S").await;
    let client: ServiceBusClient = client(&emulator);
    let sender = client.sender("orders");
    sender.send(order("m-1", "o-1")).await.unwrap();
    let before = link_ids(&emulator, "orders", LinkRole::Sender);
    let huge = Message::new("big", "orders.order-placed.v1", "x".repeat(2 * 1024 * 1024));
    let error = sender.send(huge).await.unwrap_err();
    assert!(
        matches!(error.error, SendErrorKind::SizeExceeded(_)),
        "{error}"
    );
    assert!(!error.error.is_transient());
    sender.send(order("m-2", "o-2")).await.unwrap();
    assert_eq!(link_ids(&emulator, "orders", LinkRole::Sender), before);
    assert!(client.is_connected());
}

/// A peer that accepts TCP and never answers: the handshake gives up after the client's
/// timeout with a transient connection error instead of hanging.
#[tokio::test]
async fn a_silent_peer_times_out_the_handshake() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let cs = format!(
        "Endpoint=sb://{addr};SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"
    );
    let client = ServiceBusClient::from_connection_string(&cs.parse().unwrap())
        .with_timeout(Duration::from_millis(300));
    let error = client
        .sender("orders")
        .send(order("m-1", "o-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(error.error, SendErrorKind::Connection(ref text) if text.contains("connect")),
        "{error}"
    );
}
