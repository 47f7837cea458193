//! AMQP over WebSockets (issue 13, item 7): our client, `sb-inbox send`, `sb-inbox dlq` and a
//! real `sb-inbox run` process against the emulator's WebSocket listener (plain `ws`; the
//! service is `wss` on 443, which needs Azure). Every connection string names only the
//! WebSocket port, so nothing reaches the plain AMQP listener.

use sb_emulator::{Emulator, EmulatorOptions};
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient, Transport};
use sb_inbox::{Message, Receiver as _};
use sb_inbox_cli::inventory::InventoryStore as _;

use crate::support::cli::run_async;
use crate::support::emulator::send;
use crate::support::orders::order;
use crate::worker::{drained, health_address, ready, sigterm_exits_0, sqlite_worker};

async fn ws_emulator() -> Emulator {
    crate::support::emulator::emulator_with(
        "PT30S",
        EmulatorOptions::default().with_websocket_listen("127.0.0.1:0"),
    )
    .await
}

/// The emulator's connection string moved to the WebSocket port, without `TransportType`.
fn on_ws_port(emulator: &Emulator) -> String {
    emulator.connection_string().replace(
        &emulator.local_addr().to_string(),
        &emulator.websocket_addr().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_sends_receives_and_settles_over_websockets() {
    let emulator = ws_emulator().await;
    let cs: ConnectionString = emulator
        .websocket_connection_string()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(cs.transport(), Transport::AmqpWebSockets);
    let client = ServiceBusClient::from_connection_string(&cs);
    // Larger than one 64 KiB frame, so transfers span frames and WebSocket messages.
    let big = "x".repeat(150_000);
    send(
        &client,
        "orders",
        Message::new("m-1", "orders.order-placed.v1", big.clone()),
    )
    .await;
    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    assert_eq!(sb_inbox::Delivery::message(&delivery).body, big.as_bytes());
    sb_inbox::Delivery::complete(&delivery).await.unwrap();
    receiver.close().await;
    drained(&emulator, 1).await;
    // The plain AMQP connection string does not reach the WebSocket listener.
    let wrong: ConnectionString = on_ws_port(&emulator).parse().unwrap();
    assert!(
        ServiceBusClient::from_connection_string(&wrong)
            .peek("orders", 0, 1)
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_dlq_and_the_worker_process_work_over_websockets() {
    let emulator = ws_emulator().await;
    let ws = emulator.websocket_connection_string().unwrap();
    // send: TransportType=AmqpWebSockets in the connection string.
    let output = run_async(
        Some(&ws),
        &[
            "send",
            "--entity",
            "orders",
            "--generate",
            "20",
            "--seed",
            "5",
        ],
    )
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        emulator.broker().entity("orders").unwrap().counts().active,
        20
    );
    // A poison message the worker dead-letters.
    let cs: ConnectionString = ws.parse().unwrap();
    ServiceBusClient::from_connection_string(&cs)
        .sender("orders")
        .send(Message::new(
            "poison-1",
            "orders.order-placed.v1",
            "not json",
        ))
        .await
        .unwrap();

    // The worker: SB_INBOX_SERVICEBUS_TRANSPORT=websockets over a plain connection string.
    let (dir, db, mut child) = sqlite_worker(
        "ws",
        &on_ws_port(&emulator),
        &[("SB_INBOX_SERVICEBUS_TRANSPORT", "websockets")],
    )
    .await;
    let stderr = child.stderr.take().unwrap();
    let addr = tokio::task::spawn_blocking(move || health_address(stderr))
        .await
        .unwrap();
    ready(addr).await;
    client_send_one_more(&cs).await;
    drained(&emulator, 22).await;
    sigterm_exits_0(child).await;
    let counts = sb_inbox::SqliteStore::open(&db)
        .unwrap()
        .inventory_counts()
        .await
        .unwrap();
    assert_eq!(counts.reservations, 21);
    let _ = std::fs::remove_dir_all(&dir);

    // dlq: --transport websockets over a plain connection string.
    let output = run_async(
        Some(&on_ws_port(&emulator)),
        &[
            "dlq",
            "peek",
            "--entity",
            "orders",
            "--transport",
            "websockets",
        ],
    )
    .await;
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains(r#"message_id="poison-1""#), "{text}");
    assert!(
        text.ends_with("1 dead letter(s) in orders/$DeadLetterQueue\n"),
        "{text}"
    );
}

async fn client_send_one_more(cs: &ConnectionString) {
    ServiceBusClient::from_connection_string(cs)
        .sender("orders")
        .send(order("m-late", "o-late"))
        .await
        .unwrap();
}
