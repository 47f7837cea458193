//! The client's gaps against the SDKs found by the third protocol audit
//! (`../shared/reviews/protocol3.md`), each against the in-process emulator: F3 (a broker clock
//! step), F5 (what sets the busy pause), F6 (internal errors after a good attach), F9
//! (`withdraw` with a plain prefetch), F10 (unusable messages are the caller's); and issue 40's
//! minor 3 (one credit for a single receive).

use std::time::Duration;

use sb_emulator::{
    Broker, Clock, Config, Emulator, EmulatorOptions, EntityProperties, QueueConfig,
};
use sb_servicebus::{
    ConnectionString, ServiceBusClient, ServiceBusMessage, ServiceBusReceiver, dead_letter_reason,
};

use super::{WAIT, next};

/// An emulator with one queue `orders` (30 s locks) on a steppable clock, and a client.
async fn emulator() -> (Emulator, ServiceBusClient) {
    let properties = EntityProperties {
        lock_duration: Duration::from_secs(30),
        max_delivery_count: 100,
        ..EntityProperties::default()
    };
    let config = Config::new("sbemulatorns")
        .with_queue(QueueConfig::new("orders").with_properties(properties));
    let broker =
        Broker::with_clock(config, Clock::new().steppable()).expect("the configuration validates");
    let emulator = Emulator::start(broker, EmulatorOptions::default())
        .await
        .expect("the emulator starts");
    let cs: ConnectionString = emulator
        .connection_string()
        .parse()
        .expect("the emulator's connection string parses");
    (emulator, ServiceBusClient::from_connection_string(&cs))
}

/// Polls `check` until it holds (at most [`WAIT`]).
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {WAIT:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send(client: &ServiceBusClient, ids: &[&str]) {
    let sender = client.sender("orders");
    for id in ids {
        sender
            .send(ServiceBusMessage::new("{}").with_message_id(*id))
            .await
            .expect("the broker accepts");
    }
}

/// F3: the broker's clock steps back a minute (the host now reads ahead of it by more than a
/// lock) while a pipelined receiver runs. Today every later delivery is judged run out on
/// arrival and released, forever; it must be handed out after a bounded run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_receiver_keeps_receiving_after_the_brokers_clock_steps_back() {
    let (emulator, client) = emulator().await;
    let receiver = client.receiver("orders", 0).with_capacity(4);
    send(&client, &["m-1", "m-2"]).await;
    for _ in 0..2 {
        next(&receiver).await.complete().await.expect("completes");
    }
    assert!(emulator.step_clock(-60));
    send(&client, &["m-3", "m-4"]).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let delivery = next(&receiver).await;
        ids.push(delivery.message().message_id.clone().unwrap_or_default());
        delivery.complete().await.expect("completes");
    }
    ids.sort();
    assert_eq!(ids, ["m-3", "m-4"]);
    receiver.close().await;
}

/// F5: a settlement answered `rejected{com.microsoft:timeout}` is retried without the
/// client-wide busy pause (.NET sets it for `ServiceBusy` only), so an unrelated send goes at
/// once. The pause is an hour here: had it been set, the settlement would give up (the lock
/// ends first) and the send would wait the hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_timeout_does_not_pause_an_unrelated_send() {
    let (emulator, client) = emulator().await;
    let client = client.with_server_busy_wait(Duration::from_secs(3600));
    send(&client, &["m-1"]).await;
    let receiver = client.receiver("orders", 0);
    let delivery = next(&receiver).await;
    emulator.time_out_settlements(1);
    tokio::time::timeout(WAIT, delivery.complete())
        .await
        .expect("the settlement is retried at once")
        .expect("the retry by lock token completes it");
    tokio::time::timeout(WAIT, send(&client, &["m-2"]))
        .await
        .expect("no busy pause holds the send");
    let orders = emulator.broker().entity("orders").expect("the queue");
    assert_eq!(orders.counts().active, 1, "{:?}", orders.counts());
    receiver.close().await;
}

/// F6: every receive link attaches fine and is detached with `amqp:internal-error` 200 ms
/// later. A successful attach is no healthy answer: after 3 such failures the client moves to
/// a new connection (today the attach resets the count and it never does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_detached_with_internal_errors_after_attach_move_to_a_new_connection() {
    let (emulator, client) = emulator().await;
    let receiver = client.receiver("orders", 0);
    receiver.attach_now().await.expect("attaches");
    assert_eq!(emulator.stats().connections, 1);
    emulator.detach_new_receive_links(Some(Duration::from_millis(200)));
    // The link attached before the fault is replaced by one that has it.
    emulator.force_detach_entity(
        "orders",
        sb_amqp::AmqpError::new(sb_amqp::condition::INTERNAL_ERROR, None),
    );
    let mut failures = 0;
    while emulator.stats().connections < 2 {
        let received = tokio::time::timeout(WAIT, receiver.receive_message())
            .await
            .expect("the detach reaches the receive");
        assert!(received.is_err(), "{received:?}");
        failures += 1;
        assert!(
            failures <= 5,
            "still on the first connection after {failures} failures"
        );
    }
    emulator.detach_new_receive_links(None);
    send(&client, &["m-1"]).await;
    // Links attached while the fault was on may still be detached once more.
    let delivery = loop {
        if let Ok(Some(delivery)) = tokio::time::timeout(WAIT, receiver.receive_message())
            .await
            .expect("a receive within the wait")
        {
            break delivery;
        }
    };
    assert_eq!(delivery.message().message_id.as_deref(), Some("m-1"));
    delivery.complete().await.expect("completes");
    receiver.close().await;
}

/// F9: `receiver(entity, 5)` grants 5 at attach; `withdraw` must drain it and release what
/// arrived and was not handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdraw_drains_a_plain_receivers_prefetch() {
    let (emulator, client) = emulator().await;
    send(&client, &["m-1", "m-2", "m-3", "m-4", "m-5"]).await;
    let receiver: ServiceBusReceiver = client.receiver("orders", 5);
    let orders = emulator.broker().entity("orders").expect("the queue");
    let held = next(&receiver).await;
    until("all five are on the link", || orders.counts().locked == 5).await;
    receiver.withdraw().await;
    until("four are available again", || orders.counts().active == 4).await;
    let link = emulator
        .links()
        .into_iter()
        .find(|l| l.entity == "orders")
        .expect("the receive link");
    assert_eq!(link.credit, 0, "{link:?}");
    held.complete().await.expect("completes");
    // Resumed: the next receive grants the prefetch again.
    let again = next(&receiver).await;
    again.complete().await.expect("completes");
    receiver.close().await;
}

/// Issue 40, minor 3: `receive_one` on a pipelined receiver (capacity 8) grants one credit:
/// the broker locks the one message handed out and no other; `receive_message` then tops the
/// link up to its capacity and the rest are locked on it. (A kill switch's trial asks for one
/// delivery; before, the whole window was locked and then released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_one_grants_a_single_credit_on_a_pipelined_link() {
    let (emulator, client) = emulator().await;
    send(&client, &["m-1", "m-2", "m-3", "m-4", "m-5"]).await;
    let receiver: ServiceBusReceiver = client.receiver("orders", 0).with_capacity(8);
    let orders = emulator.broker().entity("orders").expect("the queue");
    let first = tokio::time::timeout(WAIT, receiver.receive_one())
        .await
        .expect("a delivery within the wait")
        .expect("the receive succeeds")
        .expect("a delivery");
    assert_eq!(first.message().message_id.as_deref(), Some("m-1"));
    let link = emulator
        .links()
        .into_iter()
        .find(|l| l.entity == "orders")
        .expect("the receive link");
    assert_eq!(link.peak_credit, 1, "{link:?}");
    assert_eq!(orders.counts().locked, 1, "{:?}", orders.counts());
    first.complete().await.expect("completes");
    let second = next(&receiver).await;
    assert_eq!(second.message().message_id.as_deref(), Some("m-2"));
    until("the rest are locked on the link", || {
        orders.counts().locked == 4
    })
    .await;
    second.complete().await.expect("completes");
    receiver.close().await;
}

/// F10: an undecodable message and one whose string id poses as another AMQP type's reach
/// the caller, marked unusable; nothing is dead-lettered until the caller says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_messages_are_the_callers_to_settle() {
    let (emulator, client) = emulator().await;
    send(&client, &["bad", "amqp:odd", "m-1"]).await;
    let orders = emulator.broker().entity("orders").expect("the queue");
    orders.undecodable_deliveries(1).expect("the fault arms");
    let receiver = client.receiver("orders", 0);

    let undecodable = next(&receiver).await;
    let unusable = undecodable.unusable().expect("marked unusable");
    assert_eq!(unusable.reason, dead_letter_reason::UNDECODABLE_MESSAGE);
    assert!(!undecodable.lock_token().is_nil());
    let odd = next(&receiver).await;
    assert_eq!(odd.message().message_id.as_deref(), Some("amqp:odd"));
    assert_eq!(
        odd.unusable().map(|u| u.reason),
        Some(dead_letter_reason::INVALID_MESSAGE_ID)
    );
    let usable = next(&receiver).await;
    assert!(usable.unusable().is_none());
    assert_eq!(orders.counts().dead_lettered, 0, "{:?}", orders.counts());

    // The caller's choice: dead-letter one, complete the other.
    undecodable
        .dead_letter(unusable.reason, &unusable.description)
        .await
        .expect("dead-letters");
    odd.complete().await.expect("completes");
    usable.complete().await.expect("completes");
    assert_eq!(orders.counts().dead_lettered, 1);
    receiver.close().await;
}

/// V1: a session with m1..m3, m1 abandoned twice: the session's order holds (m1, m1, m1, m2,
/// m3) on the session link alone, without the caller giving back what the link had fetched
/// ahead: the link takes one message at a time, as .NET drains session credit "to ensure FIFO
/// ordering within each session" (`AmqpReceiver.ReceiveMessagesAsyncInternal`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_order_after_abandons() {
    let properties = EntityProperties {
        lock_duration: Duration::from_secs(30),
        max_delivery_count: 10,
        requires_session: true,
        ..EntityProperties::default()
    };
    let config = Config::new("sbemulatorns")
        .with_queue(QueueConfig::new("orders").with_properties(properties));
    let emulator = Emulator::start(
        Broker::new(config).expect("validates"),
        EmulatorOptions::default(),
    )
    .await
    .expect("the emulator starts");
    let cs: ConnectionString = emulator.connection_string().parse().expect("parses");
    let client = ServiceBusClient::from_connection_string(&cs);
    let sender = client.sender("orders");
    for id in ["m1", "m2", "m3"] {
        sender
            .send(
                ServiceBusMessage::new("{}")
                    .with_message_id(id)
                    .with_session_id("s"),
            )
            .await
            .expect("the broker accepts");
    }
    let session = client
        .accept_session("orders", "s")
        .await
        .expect("the session is accepted");
    let mut order = Vec::new();
    for abandon in [true, true, false, false, false] {
        let delivery = session
            .receive(WAIT)
            .await
            .expect("receives")
            .expect("a delivery within the wait");
        order.push(delivery.message().message_id.clone().unwrap_or_default());
        if abandon {
            delivery
                .abandon(Default::default())
                .await
                .expect("abandons");
        } else {
            delivery.complete().await.expect("completes");
        }
    }
    assert_eq!(order, ["m1", "m1", "m1", "m2", "m3"]);
    session.close().await;
}
