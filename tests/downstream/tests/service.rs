//! The downstream service against PostgreSQL and the emulator, and what sb-inbox pulls into
//! its build.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions, QueueConfig};
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};
use sb_inbox::{Message, PgStore};
use tokio_util::sync::CancellationToken;

async fn emulator() -> (Emulator, ServiceBusClient) {
    let config = Config::new("sbemulatorns").with_queue(QueueConfig::new("orders"));
    let emulator = Emulator::start(Broker::new(config).unwrap(), EmulatorOptions::default())
        .await
        .unwrap();
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    (emulator, ServiceBusClient::from_connection_string(&cs))
}

/// Hosted from its JSON configuration file, the service applies each order once: a
/// redelivered copy is an inbox duplicate, a republished order (new message id) a business-key
/// duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_hosts_its_handler_from_a_config_file_and_applies_each_order_once() {
    let url = common::fresh_schema("downstream").await;
    let (emulator, client) = emulator().await;
    let dir = std::env::temp_dir().join(format!("sb-inbox-downstream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("orders-worker.json");
    let config = serde_json::json!({
        "consumer": "downstream.orders",
        "store": url,
        "servicebus": { "entity": "orders" },
        "runtime": { "concurrency": 2 },
    });
    std::fs::write(&path, config.to_string()).unwrap();
    // The connection string comes from the environment, under the service's own prefix.
    let cs = emulator.connection_string();
    let env = move |name: &str| (name == "ORDERS_SERVICEBUS_CONNECTION").then(|| cs.clone());

    let sender = client.sender("orders");
    let order = |id: &str, order: &str| {
        Message::new(
            id,
            "orders.order-placed.v1",
            format!(r#"{{"orderId":"{order}","totalCents":1250}}"#),
        )
    };
    for message in [
        order("m-1", "o-1"),
        order("m-1", "o-1"), // a redelivered copy
        order("m-2", "o-2"),
        order("m-3", "o-1"), // o-1 republished under a new id
    ] {
        sender.send(message).await.unwrap();
    }

    let shutdown = CancellationToken::new();
    let config = sb_inbox_downstream::load(&path, &env).unwrap();
    let service = tokio::spawn(sb_inbox_downstream::serve(config, shutdown.clone()));
    let entity = emulator.broker().entity("orders").unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let counts = entity.counts();
            if counts.locked == 0 && counts.completed >= 4 {
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the four messages are completed");
    assert_eq!(settled.dead_lettered_total, 0);
    shutdown.cancel();
    let stats = service.await.unwrap().unwrap().total();
    assert_eq!((stats.processed, stats.duplicate), (2, 2), "{stats:?}");

    let store = PgStore::connect(&url, 1).await.unwrap();
    let rows = store
        .query(
            "SELECT order_id FROM downstream_orders ORDER BY order_id",
            &[],
        )
        .await
        .unwrap();
    let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(ids, ["o-1", "o-2"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// What `sb-inbox = { default-features = false, features = ["postgres"] }` compiles into the
/// service: no CLI, no TOML, no gRPC exporter, no Entra ID, no emulator.
#[test]
fn the_library_pulls_no_application_dependencies_into_the_service() {
    let tree = common::cargo_tree(&[]);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"sb-inbox"), "{tree}");
    for forbidden in ["clap", "toml", "tonic", "azure_identity", "sb-emulator"] {
        assert!(
            !crates.contains(&forbidden),
            "{forbidden} is in the service's normal dependencies:\n{tree}"
        );
    }
}
