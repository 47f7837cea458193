//! sb-servicebus on its own (issue 32): a service that wants only a Service Bus client sends,
//! receives, renews, completes, abandons, releases and dead-letters with this crate alone,
//! against the in-process emulator; and the crate's dependency graph carries nothing of the
//! inbox and no database driver.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions, EntityProperties, QueueConfig};
use sb_servicebus::{
    ConnectionString, PropertyValue, ServiceBusClient, ServiceBusDelivery, ServiceBusMessage,
    ServiceBusReceiver,
};

#[path = "standalone/admin_bounds.rs"]
mod admin_bounds;
#[path = "standalone/gaps.rs"]
mod gaps;

/// How long a receive waits before the test calls the message lost.
const WAIT: Duration = Duration::from_secs(10);

async fn emulator() -> (Emulator, ServiceBusClient) {
    let properties = EntityProperties {
        lock_duration: Duration::from_secs(30),
        max_delivery_count: 5,
        ..EntityProperties::default()
    };
    let config = Config::new("sbemulatorns")
        .with_queue(QueueConfig::new("orders").with_properties(properties));
    let emulator = Emulator::start(
        Broker::new(config).expect("the configuration validates"),
        EmulatorOptions::default(),
    )
    .await
    .expect("the emulator starts");
    let cs: ConnectionString = emulator
        .connection_string()
        .parse()
        .expect("the emulator's connection string parses");
    (emulator, ServiceBusClient::from_connection_string(&cs))
}

async fn next(receiver: &ServiceBusReceiver) -> ServiceBusDelivery {
    tokio::time::timeout(WAIT, receiver.receive_message())
        .await
        .expect("a delivery within the wait")
        .expect("the receive succeeds")
        .expect("a delivery")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_receives_renews_and_settles_every_way_without_the_inbox() {
    let (_emulator, client) = emulator().await;
    let sender = client.sender("orders");
    let receiver = client.receiver("orders", 0);
    let sent = ServiceBusMessage::new(r#"{"orderId":"o-1"}"#)
        .with_message_id("m-1")
        .with_subject("orders.order-placed.v1")
        .with_content_type("application/json")
        .with_correlation_id("c-1")
        .with_property("tenant", "contoso")
        .with_property("lines", 2_i64);
    sender.send(sent.clone()).await.expect("the broker accepts");

    // Received with what the producer set and what the broker added.
    let first = next(&receiver).await;
    let message = first.message();
    assert_eq!(message.to_message(), sent);
    assert_eq!(message.delivery_count, 0);
    assert!(
        message.sequence_number.is_some_and(|n| n > 0),
        "{message:?}"
    );
    assert!(message.enqueued_time.is_some(), "{message:?}");
    assert_eq!(message.lock_token, Some(first.lock_token()));
    assert!(!first.lock_token().is_nil());
    let locked_until = first.locked_until();
    assert!(locked_until > SystemTime::now() - Duration::from_secs(60));

    // Renewed: the broker's new expiry, kept by the delivery.
    let renewed = first.renew_lock().await.expect("the lock renews");
    assert!(renewed >= locked_until, "{renewed:?} < {locked_until:?}");
    assert_eq!(first.locked_until(), renewed);

    // Abandoned with a property: delivered again, counted, the property merged.
    let mut merged = BTreeMap::new();
    merged.insert("attempt".to_owned(), PropertyValue::Long(1));
    first.abandon(merged).await.expect("the abandon is applied");
    let second = next(&receiver).await;
    assert_eq!(second.message().message_id.as_deref(), Some("m-1"));
    assert_eq!(second.delivery_count(), 1);
    assert_eq!(
        second.message().application_properties.get("attempt"),
        Some(&PropertyValue::Long(1))
    );

    // Released: delivered again, not counted.
    second.release().await.expect("the release is applied");
    let third = next(&receiver).await;
    assert_eq!(third.message().message_id.as_deref(), Some("m-1"));
    assert_eq!(third.delivery_count(), 1, "a release counts no delivery");

    // Dead-lettered with a reason and a description, which the dead-letter queue shows.
    third
        .dead_letter("Poison", "cannot handle it")
        .await
        .expect("the dead-lettering is applied");
    let dead = client
        .peek("orders/$DeadLetterQueue", 0, 10)
        .await
        .expect("the dead-letter queue peeks");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message.message_id.as_deref(), Some("m-1"));
    assert_eq!(dead[0].dead_letter_reason(), Some("Poison"));
    assert_eq!(dead[0].dead_letter_description(), Some("cannot handle it"));

    // Completed: gone from the queue.
    sender
        .send(ServiceBusMessage::new("second").with_message_id("m-2"))
        .await
        .expect("the broker accepts");
    let other = next(&receiver).await;
    assert_eq!(other.message().message_id.as_deref(), Some("m-2"));
    other.complete().await.expect("the completion is applied");
    let left = client.peek("orders", 0, 10).await.expect("the queue peeks");
    assert!(left.is_empty(), "{left:?}");
    receiver.close().await;
}

/// A settlement the broker refuses keeps its answer: completing a delivery whose lock the
/// broker no longer knows (it was settled through another delivery of the same message) is
/// the lock lost, not a generic failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_deliverys_second_settlement_is_the_lock_lost() {
    let (_emulator, client) = emulator().await;
    client
        .sender("orders")
        .send(ServiceBusMessage::new("x").with_message_id("m-1"))
        .await
        .expect("the broker accepts");
    let receiver = client.receiver("orders", 0);
    let delivery = next(&receiver).await;
    delivery
        .complete()
        .await
        .expect("the completion is applied");
    let again = delivery.complete().await;
    assert!(matches!(again, Err(ref e) if e.is_lock_lost()), "{again:?}");
}

/// `cargo tree` of this crate's normal dependencies: nothing of the inbox, no database driver.
#[test]
fn the_client_pulls_in_no_inbox_and_no_database_driver() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    for features in [&[][..], &["--all-features"][..]] {
        let output = std::process::Command::new(&cargo)
            .args(["tree", "-e", "normal", "--prefix", "none", "--offline"])
            .args(features)
            .arg("--manifest-path")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .output()
            .expect("cargo tree runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let tree = String::from_utf8_lossy(&output.stdout);
        let crates: Vec<&str> = tree
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        assert!(crates.contains(&"sb-amqp"), "{tree}");
        for unwanted in [
            "sb-inbox",
            "sb-inbox-cli",
            "sb-emulator",
            "tokio-postgres",
            "rusqlite",
            "tiberius",
            "bb8",
            "clap",
            "opentelemetry_sdk",
        ] {
            assert!(
                !crates.contains(&unwanted),
                "sb-servicebus {features:?} pulls in {unwanted}:\n{tree}"
            );
        }
    }
}
