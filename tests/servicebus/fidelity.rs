//! Issue 29 (round 2 of the service's failure modes) and issue 27 item 2 (single-flight
//! connection setup): each test injects what the service does through the emulator and
//! checks that the client survives it.

use std::sync::Arc;
use std::time::Duration;

use sb_amqp::{AmqpError, condition};
use sb_emulator::{Emulator, EmulatorOptions, EmulatorStats, Fault};
use sb_inbox::servicebus::{
    ConnectionString, ServiceBusClient, ServiceBusReceiver, TokenFuture, TokenProvider,
};
use sb_inbox::{Delivery, ReceiveError, Receiver, SettleError};

use crate::recovery::complete_next;
use crate::sessions::{send_session_messages, session_emulator};
use crate::support::emulator::{client, emulator, emulator_with, send};
use crate::support::orders::order;

/// Receives until a delivery comes (each failed attempt is what the runtime would retry after
/// its backoff), bounded; returns the delivery and the errors met on the way.
async fn receive_through(
    receiver: &ServiceBusReceiver,
) -> (sb_inbox::servicebus::ServiceBusDelivery, Vec<ReceiveError>) {
    let mut errors = Vec::new();
    let delivery = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match receiver.receive().await {
                Ok(Some(delivery)) => return delivery,
                Ok(None) => {}
                Err(error) => {
                    errors.push(error);
                    assert!(errors.len() < 50, "never recovered: {errors:?}");
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no delivery within 30 s; errors: {errors:?}"));
    (delivery, errors)
}

/// Waits (bounded) until `client` has seen its connection or session go.
async fn until_disconnected(client: &ServiceBusClient) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while client.is_connected() {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the client sees the drop");
}

/// An emulator (queue `orders`, lock 30 s) holding one order, and the client that sent it.
async fn one_order() -> (Emulator, ServiceBusClient) {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    send(&client, "orders", order("m-1", "o-1")).await;
    (emulator, client)
}

fn stats(emulator: &Emulator) -> EmulatorStats {
    emulator.stats()
}

/// Item 1: `$cbs` answering put-token 503 (a gateway upgrade) is transient: the receive is
/// retried and gets the message; today's code made it a permanent `Unauthorized`.
#[tokio::test]
async fn item1_put_token_503_is_transient_and_retried() {
    let (emulator, _) = one_order().await;
    emulator.refuse_put_tokens(2, 503);
    let client = client(&emulator).with_server_busy_wait(Duration::from_millis(50));
    let receiver = client.receiver("orders", 0);
    let (delivery, errors) = receive_through(&receiver).await;
    assert!(!errors.is_empty(), "the 503s were met");
    assert!(
        errors
            .iter()
            .all(|e| matches!(e, ReceiveError::Transient(_))),
        "{errors:?}"
    );
    delivery.complete().await.unwrap();
}

/// Item 2: the service ends the client's AMQP session while the connection lives: the client
/// begins a new session on the same connection (no new connection) and receives again;
/// today's code handed out the dead session forever.
#[tokio::test]
async fn item2_an_ended_session_is_rebuilt_on_the_same_connection() {
    let (emulator, sender) = one_order().await;
    let client = client(&emulator);
    let receiver = client.receiver("orders", 0);
    complete_next(&receiver).await;
    let before = stats(&emulator);
    assert!(emulator.end_sessions().await >= 1);
    send(&sender, "orders", order("m-2", "o-2")).await;
    let (delivery, _) = receive_through(&receiver).await;
    delivery.complete().await.unwrap();
    let after = stats(&emulator);
    assert_eq!(after.connections, before.connections, "no new connection");
    assert!(
        after.sessions >= before.sessions + 2,
        "{before:?} → {after:?}"
    );
    assert!(client.is_connected());
}

/// Item 3: after a busy answer the client waits its busy pause (client-wide) before the next
/// settlement attempt; today's code retried after 100 ms. The emulator records each attempt.
#[tokio::test]
async fn item3_a_busy_settlement_waits_the_busy_pause_before_retrying() {
    let wait = Duration::from_millis(1500);
    let (emulator, _) = one_order().await;
    let client = client(&emulator).with_server_busy_wait(wait);
    let delivery = client
        .receiver("orders", 0)
        .receive()
        .await
        .unwrap()
        .unwrap();
    emulator.throttle(Duration::from_millis(2500));
    delivery.complete().await.unwrap();
    let attempts = emulator.settlement_attempts();
    assert!(attempts.len() >= 2, "{attempts:?}");
    assert!(!attempts.last().unwrap().busy, "{attempts:?}");
    for pair in attempts.windows(2) {
        if pair[0].busy {
            let gap = pair[1].at.duration_since(pair[0].at).unwrap();
            assert!(
                gap >= wait,
                "retried {gap:?} after a busy answer: {attempts:?}"
            );
        }
    }
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.locked), (1, 0));
}

/// Item 7: `$management` answers 401 (the token was revoked): the client puts a fresh token
/// and asks again; today's code returned the refusal.
#[tokio::test]
async fn item7_a_401_from_management_puts_a_fresh_token() {
    let (emulator, client) = one_order().await;
    assert_eq!(client.peek("orders", 0, 10).await.unwrap().len(), 1);
    let host = emulator.local_addr();
    let revoked = emulator.revoke_token(&format!("sb://{host}/orders"))
        + emulator.revoke_token(&format!("sb://{host}/orders/$management"));
    assert!(revoked >= 2, "{revoked}");
    let peeked = client.peek("orders", 0, 10).await.unwrap();
    assert_eq!(peeked.len(), 1);
}

/// Item 9: every attach on the client's connection fails with `amqp:internal-error`: after
/// a few in a row the client moves to a new connection and receives; today's code stayed.
#[tokio::test]
async fn item9_repeated_internal_errors_move_to_a_new_connection() {
    let (emulator, client) = one_order().await;
    let receiver = client.receiver("orders", 0);
    complete_next(&receiver).await;
    assert_eq!(emulator.stick_internal_error(), 1);
    let before = stats(&emulator);
    emulator.force_detach_entity(
        "orders",
        AmqpError::new(condition::INTERNAL_ERROR, Some("stuck".into())),
    );
    send(
        &crate::support::emulator::client(&emulator),
        "orders",
        order("m-2", "o-2"),
    )
    .await;
    let (delivery, errors) = receive_through(&receiver).await;
    delivery.complete().await.unwrap();
    assert!(errors.len() >= 2, "{errors:?}");
    // The sender's client and ours: one new connection each.
    assert_eq!(stats(&emulator).connections, before.connections + 2);
}

/// A token provider whose identity endpoint never answers.
#[derive(Debug)]
struct Hung;

impl TokenProvider for Hung {
    fn token<'a>(&'a self, _audience: &'a str) -> TokenFuture<'a> {
        Box::pin(std::future::pending())
    }
}

/// Item 10: getting a token is bounded by the client's timeout: a hung identity endpoint
/// fails the receive (transient) instead of hanging it, as today's code did.
#[tokio::test]
async fn item10_a_hung_token_provider_fails_the_receive_in_time() {
    let emulator = emulator("PT30S").await;
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    let client = ServiceBusClient::new(cs.amqp_url(), cs.host(), Arc::new(Hung))
        .with_timeout(Duration::from_millis(300));
    let received = tokio::time::timeout(
        Duration::from_secs(20),
        client.receiver("orders", 0).receive(),
    )
    .await
    .expect("the receive is bounded");
    let Err(ReceiveError::Transient(why)) = received else {
        panic!("{received:?}")
    };
    assert!(why.to_string().contains("no token"), "{why}");
}

/// Item 12: a session message whose disposition the service answers busy is settled by lock
/// token (with its session id) after the pause, and the link lives on; today's code
/// reported the lock lost and marked the link gone.
#[tokio::test]
async fn item12_a_busy_session_disposition_is_retried_not_lock_lost() {
    let emulator = session_emulator(
        "PT30S",
        EmulatorOptions::default()
            .with_fault(Fault::BusySettle, 1.0)
            .with_fault_seed(3),
    )
    .await;
    send_session_messages(&emulator, &[("a", "s-1"), ("b", "s-1")]).await;
    let client = client(&emulator).with_server_busy_wait(Duration::from_millis(100));
    let session = client
        .accept_next_session("sq", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let first = session
        .receive(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let settled: Result<(), sb_servicebus::SettlementError> = first.complete().await;
    settled.unwrap();
    assert!(session.is_attached(), "the session link lives on");
    let second = session
        .receive(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    second.complete().await.unwrap();
    let counts = emulator.broker().entity("sq").unwrap().counts();
    assert_eq!((counts.completed, counts.active, counts.locked), (2, 0, 0));
}

/// Item 14: the service detaches an expired token's links with `amqp:link:detach-forced`
/// ("Code: RenewToken"): the client puts a fresh token before re-attaching, so one failed
/// receive is all; today's code re-attached with the stale token first and was refused.
#[tokio::test]
async fn item14_a_renew_token_detach_puts_a_fresh_token_before_re_attaching() {
    let options = EmulatorOptions::default().with_max_token_lifetime(Duration::from_secs(1));
    let emulator = emulator_with("PT30S", options).await;
    let client = client(&emulator);
    let receiver = client.receiver("orders", 0);
    // The link attaches, then its token (honoured 1 s) expires with no message in between.
    let waiting = tokio::time::timeout(Duration::from_secs(20), receiver.receive())
        .await
        .expect("the detach comes");
    let Err(ReceiveError::Transient(why)) = waiting else {
        panic!("{waiting:?}")
    };
    assert!(why.to_string().contains("RenewToken"), "{why}");
    assert!(why.to_string().contains(condition::DETACH_FORCED), "{why}");
    send(
        &crate::support::emulator::client(&emulator),
        "orders",
        order("m-1", "o-1"),
    )
    .await;
    let received = receiver.receive().await;
    let Ok(Some(delivery)) = received else {
        panic!("the re-attach after a fresh token works at once: {received:?}")
    };
    delivery.complete().await.unwrap();
}

/// Issue 27 item 2: 16 concurrent operations after a dropped connection open exactly one new
/// connection, one `$management` pair and one `$cbs` pair.
#[tokio::test]
async fn single_flight_16_operations_after_a_drop_open_one_connection_and_one_pair() {
    let (emulator, client) = one_order().await;
    client.peek("orders", 0, 1).await.unwrap();
    emulator.drop_all_connections();
    until_disconnected(&client).await;
    let before = stats(&emulator);
    let mut peeks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let client = client.clone();
        peeks.spawn(async move { client.peek("orders", 0, 1).await });
    }
    while let Some(peek) = peeks.join_next().await {
        assert_eq!(peek.unwrap().unwrap().len(), 1);
    }
    let after = stats(&emulator);
    assert_eq!(
        after.connections - before.connections,
        1,
        "{before:?} → {after:?}"
    );
    assert_eq!(
        after.management_links - before.management_links,
        1,
        "{before:?} → {after:?}"
    );
    assert_eq!(
        after.cbs_links - before.cbs_links,
        1,
        "{before:?} → {after:?}"
    );
    assert_eq!(
        after.sessions - before.sessions,
        1,
        "{before:?} → {after:?}"
    );
}

/// Issue 29's fleet behaviour: 32 deliveries in flight when the connection drops; settling
/// them all at once opens one new connection.
#[tokio::test]
async fn fleet_32_deliveries_settled_after_a_drop_open_one_connection() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    for n in 0..32 {
        send(
            &client,
            "orders",
            order(&format!("m-{n}"), &format!("o-{n}")),
        )
        .await;
    }
    let receiver = client.receiver("orders", 0);
    let mut held = Vec::new();
    for _ in 0..32 {
        held.push(receiver.receive().await.unwrap().unwrap());
    }
    emulator.drop_all_connections();
    until_disconnected(&client).await;
    let before = stats(&emulator);
    let mut settling = tokio::task::JoinSet::new();
    for delivery in held {
        settling.spawn(async move { delivery.complete().await });
    }
    while let Some(result) = settling.join_next().await {
        let result = result.unwrap();
        // The service drops locks with the connection (issue 29 item 11): lock lost is its
        // answer there; anything else must have completed.
        assert!(
            matches!(result, Ok(()) | Err(SettleError::LockLost)),
            "{result:?}"
        );
    }
    let after = stats(&emulator);
    assert_eq!(
        after.connections - before.connections,
        1,
        "{before:?} → {after:?}"
    );
}

/// The process test: `sb-inbox run` against an emulator that ends the worker's AMQP session,
/// then answers put-token 503 twice, then throttles the namespace for 10 s. The worker stays
/// up, waits at least 4 s after each busy answer before settling again (the emulator records
/// every settlement attempt), and reserves every order once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_worker_survives_an_ended_session_busy_cbs_and_throttling() {
    let test = "fidelity_process";
    let emulator = emulator("PT30S").await;
    let store = crate::support::pg_store(test, 2).await;
    let url = crate::support::with_search_path(
        &crate::support::pg_url(),
        &crate::support::schema_for(test),
    );
    let mut worker = crate::verification::WorkerProcess::spawn_with(&emulator, &url, 4, &[]);
    let client = client(&emulator);
    let sender = client.sender("orders");
    for n in 0..20 {
        crate::survival::send(&sender, order(&format!("m-{n}"), &format!("o-{n}"))).await;
    }
    crate::survival::until(
        "20 orders are reserved",
        Duration::from_secs(60),
        || async { crate::survival::reservations(&store).await == 20 },
    )
    .await;
    let orders = emulator.broker().entity("orders").unwrap();
    crate::survival::until("20 orders are settled", Duration::from_secs(60), || async {
        orders.counts().completed == 20
    })
    .await;
    // The next 20 wait in the queue while the faults are set up, so that only the worker
    // meets them.
    orders.pause_delivery().unwrap();
    for n in 20..40 {
        crate::survival::send(&sender, order(&format!("m-{n}"), &format!("o-{n}"))).await;
    }
    let from = emulator.settlement_attempts().len();
    emulator.refuse_put_tokens(2, 503);
    emulator.throttle_from_next_settlement(Duration::from_secs(10));
    assert!(emulator.end_sessions().await >= 1);
    orders.resume_delivery().unwrap();
    crate::survival::until(
        "40 orders are reserved",
        Duration::from_secs(120),
        || async { crate::survival::reservations(&store).await == 40 },
    )
    .await;
    crate::survival::until(
        "every settlement is done",
        Duration::from_secs(60),
        || async { orders.counts().completed >= 40 },
    )
    .await;
    assert!(worker.is_running(), "{}", worker.log());
    let attempts = emulator.settlement_attempts()[from..].to_vec();
    let busy: Vec<_> = attempts.iter().filter(|a| a.busy).collect();
    assert!(!busy.is_empty(), "the throttling was met: {attempts:?}");
    // Attempts already in flight when the first busy answer came land within a moment of
    // it; after that, nothing until the busy pause is over.
    for answer in &busy {
        for next in &attempts {
            if let Ok(gap) = next.at.duration_since(answer.at) {
                assert!(
                    gap < Duration::from_millis(500) || gap >= Duration::from_secs(4),
                    "a settlement {gap:?} after a busy answer: {attempts:?}"
                );
            }
        }
    }
    let log = worker.log();
    // Each fault was met: the session rebuilt on the same connection, the 503s retried.
    assert!(log.contains("Began a new session"), "{log}");
    assert!(log.contains("put-token 503"), "{log}");
    let stats = worker.terminate().await;
    assert_eq!(stats.get("processed"), 40, "{log}");
    let counts = sb_inbox_cli::inventory::InventoryStore::inventory_counts(&store)
        .await
        .unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (40, 40));
    assert!(
        client
            .peek("orders/$DeadLetterQueue", 0, 10)
            .await
            .unwrap()
            .is_empty(),
        "nothing dead-lettered"
    );
}
