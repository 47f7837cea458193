//! Issue 39, F1/F2/F8: a link the service detached (idle for 10 minutes, Azure/azure-sdk-for-java#25787)
//! or a session it ended leaves handles behind; whatever attaches next takes their handle
//! numbers or channel. A message sent through the client's cached sender lands in its own
//! queue, never another's; a settlement through an old delivery never settles another
//! receiver's; and the cached sender is replaced before its next send, not after a failed one.

use std::time::Duration;

use sb_amqp::{AmqpError, condition};
use sb_emulator::{Emulator, EmulatorOptions, EntityProperties, LinkRole};
use sb_inbox::servicebus::{RetryOptions, ServiceBusClient};
use sb_inbox::{Delivery, Receiver};

use crate::support::emulator::{client, properties, queue, start};
use crate::support::orders::order;

/// Queues `qa`, `qb`, `qc` (and `orders`), lock 30 s.
async fn emulator() -> Emulator {
    let queues = ["qa", "qb", "qc", "orders"]
        .into_iter()
        .map(|q| queue(q, properties("PT30S", 5)))
        .chain([queue("outbox", EntityProperties::default())])
        .collect();
    start(queues, EmulatorOptions::default()).await
}

/// A client that tries every operation once: a send that needed a failed attempt first fails.
fn one_try_client(emulator: &Emulator) -> ServiceBusClient {
    client(emulator).with_retry(RetryOptions::default().with_tries(1))
}

fn link_ids(emulator: &Emulator, entity: &str, role: LinkRole) -> Vec<u64> {
    emulator
        .links()
        .into_iter()
        .filter(|l| l.entity.eq_ignore_ascii_case(entity) && l.role == role)
        .map(|l| l.id)
        .collect()
}

/// Force-detaches `entity`'s only sender link, as the service does to an idle one, and waits
/// (bounded) until the client answered the detach: the emulator lists a link until then.
async fn idle_detach_sender(emulator: &Emulator, entity: &str) {
    let ids = link_ids(emulator, entity, LinkRole::Sender);
    assert_eq!(ids.len(), 1, "one sender link on {entity}");
    let error = AmqpError::new(
        condition::DETACH_FORCED,
        Some("Idle timeout: 00:10:00 (forced by the test)".to_owned()),
    );
    assert!(emulator.force_detach_link(ids[0], error));
    tokio::time::timeout(Duration::from_secs(30), async {
        while emulator.links().iter().any(|l| l.id == ids[0]) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the client answers the detach");
}

fn active(emulator: &Emulator, entity: &str) -> usize {
    emulator.broker().entity(entity).unwrap().counts().active
}

/// F1 test 2 and F8: `qa`'s idle sender link is detached, `qc`'s sender attaches (on `qa`'s
/// old handle number), then a message goes through `qa`'s cached sender: it lands in `qa`, on
/// the first try (the client allows one), through a new link.
#[tokio::test]
async fn a_cached_sender_after_an_idle_detach_sends_to_its_own_queue_on_the_first_try() {
    let emulator = emulator().await;
    let client = one_try_client(&emulator);
    let (qa, qb) = (client.sender("qa"), client.sender("qb"));
    qa.send(order("a-1", "o-1")).await.unwrap();
    qb.send(order("b-1", "o-2")).await.unwrap();
    idle_detach_sender(&emulator, "qa").await;
    client.sender("qc").send(order("c-1", "o-3")).await.unwrap();
    qa.send(order("a-2", "o-4")).await.unwrap();
    assert_eq!(
        active(&emulator, "qa"),
        2,
        "both of qa's messages are in qa"
    );
    assert_eq!(active(&emulator, "qc"), 1, "qc holds only its own");
    assert_eq!(active(&emulator, "qb"), 1);
    assert_eq!(link_ids(&emulator, "qa", LinkRole::Sender).len(), 1);
}

/// F1 test 3: the link that takes the detached sender's number is the request link of a
/// `$management` pair (a lock renewal attaches it); the next send still lands in its queue.
#[tokio::test]
async fn a_cached_sender_never_sends_on_a_management_link_that_took_its_number() {
    let emulator = emulator().await;
    let client = client(&emulator);
    client
        .sender("orders")
        .send(order("m-1", "o-1"))
        .await
        .unwrap();
    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    let qa = client.sender("qa");
    qa.send(order("a-1", "o-2")).await.unwrap();
    idle_detach_sender(&emulator, "qa").await;
    delivery.renew_lock().await.unwrap();
    qa.send(order("a-2", "o-3")).await.unwrap();
    assert_eq!(
        active(&emulator, "qa"),
        2,
        "both of qa's messages are in qa"
    );
    delivery.complete().await.unwrap();
    let orders = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((orders.completed, orders.active, orders.locked), (1, 0, 0));
}

/// F2: two receivers on one client; the service ends the session while `qa`'s delivery is
/// held; `qb`'s receiver goes on on a new session (same channel, delivery ids from 0 again) and
/// holds several deliveries, one of them with the old delivery's id. Completing the old `qa`
/// delivery never settles any of `qb`'s.
#[tokio::test]
async fn an_old_delivery_never_settles_a_delivery_of_the_session_that_took_its_channel() {
    const HELD: usize = 6;
    let emulator = emulator().await;
    let client = client(&emulator);
    client.sender("qa").send(order("a-1", "o-1")).await.unwrap();
    let qb = client.sender("qb");
    for i in 0..HELD {
        qb.send(order(&format!("b-{i}"), "o-2")).await.unwrap();
    }
    let a = client.receiver("qa", 0);
    let b = client.receiver("qb", 0);
    let held = a.receive().await.unwrap().unwrap();
    assert!(emulator.end_sessions().await > 0);
    let mut theirs = Vec::new();
    while theirs.len() < HELD {
        // The first receive may see the ended session; the next attaches on the new one.
        if let Ok(Some(delivery)) = b.receive().await {
            theirs.push(delivery);
        }
    }
    // Settled by its own lock token, or lost with its link: either way not one of `b`'s.
    let _ = held.complete().await;
    let counts = emulator.broker().entity("qb").unwrap().counts();
    assert_eq!(
        (counts.completed, counts.locked),
        (0, HELD),
        "b's deliveries are untouched"
    );
    for delivery in theirs {
        delivery.complete().await.unwrap();
    }
    let counts = emulator.broker().entity("qb").unwrap().counts();
    assert_eq!((counts.completed, counts.locked), (HELD as u64, 0));
}

/// The issue's reproduction with an `sb-emulator` process that force-detaches links idle for
/// 1 s (the service: 10 minutes, Azure/azure-sdk-for-java#25787): the worker's sender port
/// (what the outbox relay and the delayed-retry sender send through) sends to `qa` and `qb`;
/// `qa` idles while `qb` keeps sending until the emulator detaches `qa`'s link; `qc` attaches
/// (on `qa`'s old handle number), then `qa` gets a plain send and a scheduled one (a delayed
/// retry's copy). Every message lands in its own queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_idle_detach_every_message_of_the_sender_port_lands_in_its_own_queue() {
    use std::time::SystemTime;

    use sb_inbox::Sender as _;
    use sb_inbox::servicebus::ServiceBusSenderPort;

    use crate::survival::{EmulatorProcess, peeked_ids, until};

    let queues = r#"{"Name":"qa","Properties":{}},{"Name":"qb","Properties":{}},
        {"Name":"qc","Properties":{}}"#;
    let Some(emulator) =
        EmulatorProcess::spawn_with_queues("identity_idle", queues, &["--link-idle-timeout", "1"])
    else {
        return;
    };
    let client = emulator.client();
    let port = ServiceBusSenderPort::new(client.clone());
    port.send("qa", order("a-1", "o-1"), None).await.unwrap();
    let mut to_qb = 0;
    until(
        "the emulator detached qa's idle sender link",
        Duration::from_secs(30),
        || {
            to_qb += 1;
            let message = order(&format!("b-{to_qb}"), "o-2");
            let port = &port;
            let log = emulator.log();
            async move {
                port.send("qb", message, None).await.unwrap();
                log.lines()
                    .any(|l| l.contains("Link idle; force detaching.") && l.contains("qa"))
            }
        },
    )
    .await;
    // A round trip on the connection after the detach: the client has read it.
    to_qb += 1;
    port.send("qb", order(&format!("b-{to_qb}"), "o-2"), None)
        .await
        .unwrap();
    port.send("qc", order("c-1", "o-3"), None).await.unwrap();
    port.send("qa", order("a-2", "o-4"), None).await.unwrap();
    let soon = SystemTime::now() + Duration::from_millis(500);
    port.send("qa", order("a-3", "o-5"), Some(soon))
        .await
        .unwrap();
    until(
        "qa holds its three messages",
        Duration::from_secs(30),
        || {
            let client = &client;
            async move { peeked_ids(client, "qa").await.len() >= 3 }
        },
    )
    .await;
    let mut qa = peeked_ids(&client, "qa").await;
    qa.sort();
    assert_eq!(qa, ["a-1", "a-2", "a-3"]);
    assert_eq!(peeked_ids(&client, "qc").await, ["c-1"]);
    let qb = peeked_ids(&client, "qb").await;
    assert_eq!(qb.len(), to_qb);
    assert!(qb.iter().all(|id| id.starts_with("b-")), "{qb:?}");
}

/// The issue's must-show with the outbox relay: an `sb-emulator` process force-detaches links
/// idle for 1 s (the service: 10 minutes); the relay (in-process, the worker's sender port)
/// publishes rows for `qa`, `qb` and `qc` through one client. `qa`'s destination idles while
/// `qb`'s rows keep flowing until the emulator detached `qa`'s sender link; `qc`'s first row
/// attaches a sender (on `qa`'s old handle number); then `qa` gets rows again. Every row is
/// published on its pass (none fails) and arrives at its own destination, none in another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_idle_detach_every_outbox_row_the_relay_publishes_lands_at_its_own_destination() {
    use sb_inbox::relay::{Relay, RelayConfig};
    use sb_inbox::servicebus::ServiceBusSenderPort;
    use sb_inbox::{OutboxMessage, OutboxStore, PgStore, Store, StoreTx, Tx};
    use tokio_util::sync::CancellationToken;

    use crate::support::pg_store;
    use crate::survival::{EmulatorProcess, peeked_ids, until};

    let queues = r#"{"Name":"qa","Properties":{}},{"Name":"qb","Properties":{}},
        {"Name":"qc","Properties":{}}"#;
    let Some(emulator) =
        EmulatorProcess::spawn_with_queues("identity_relay", queues, &["--link-idle-timeout", "1"])
    else {
        return;
    };
    let store: PgStore = pg_store("identity_relay", 2).await;
    let client = emulator.client();
    let relay = Relay::new(
        store.clone(),
        ServiceBusSenderPort::new(client.clone()),
        RelayConfig::default(),
    );
    let stop = CancellationToken::new();
    // Appends one row per (destination, id) in a transaction of its own, then relays until
    // none is pending: every row must be published on the pass that claims it.
    let publish = |rows: Vec<(&'static str, String)>| {
        let (store, relay, stop) = (&store, &relay, &stop);
        async move {
            for (destination, id) in rows {
                let row = OutboxMessage::new(destination, "identity.row.v1", b"{}".to_vec())
                    .with_message_id(id);
                let mut tx = store.begin().await.unwrap();
                tx.append_outbox(&row).await.unwrap();
                tx.commit().await.unwrap();
            }
            while store.outbox_backlog().await.unwrap().pending > 0 {
                let pass = relay.relay_once(stop).await.unwrap();
                assert_eq!(pass.failed, 0, "no send fails: {pass:?}");
            }
        }
    };
    publish(vec![("qa", "a-1".into()), ("qb", "b-1".into())]).await;
    let mut to_qb = 1;
    until(
        "the emulator detached qa's idle sender link",
        Duration::from_secs(30),
        || {
            to_qb += 1;
            let row = ("qb", format!("b-{to_qb}"));
            let (publish, log) = (&publish, emulator.log());
            async move {
                publish(vec![row]).await;
                log.lines()
                    .any(|l| l.contains("Link idle; force detaching.") && l.contains("qa"))
            }
        },
    )
    .await;
    // A round trip on the connection after the detach: the client has read it.
    to_qb += 1;
    publish(vec![("qb", format!("b-{to_qb}"))]).await;
    publish(vec![("qc", "c-1".into())]).await;
    publish(vec![("qa", "a-2".into()), ("qa", "a-3".into())]).await;
    until("qa holds its three rows", Duration::from_secs(30), || {
        let client = &client;
        async move { peeked_ids(client, "qa").await.len() >= 3 }
    })
    .await;
    let mut qa = peeked_ids(&client, "qa").await;
    qa.sort();
    assert_eq!(qa, ["a-1", "a-2", "a-3"]);
    assert_eq!(peeked_ids(&client, "qc").await, ["c-1"]);
    let qb = peeked_ids(&client, "qb").await;
    assert_eq!(qb.len(), to_qb);
    assert!(qb.iter().all(|id| id.starts_with("b-")), "{qb:?}");
}
