//! The service binary stopped by SIGTERM in the middle of a backlog, as Kubernetes or Azure
//! Container Apps stop a replica: it drains and exits, leaving nothing locked.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions, QueueConfig};
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};
use sb_inbox::{Message, PgStore};
use tokio_util::sync::CancellationToken;

/// Orders sent before the service starts: enough that the signal lands with most of them
/// still waiting (the test checks that it did).
const BACKLOG: usize = 1000;

/// Kills the child (SIGKILL) if the test ends before it exited by itself.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill(); // best effort: a failing test must not leave it behind
            let _ = self.0.wait();
        }
    }
}

/// SIGTERM while the service works through a backlog: the process exits 0 after the drain;
/// no waiting message has been delivered before (none was left locked, to come back by lock
/// expiry), nothing is locked, every completed
/// message's row is committed and every committed row's message completed, and a second run
/// processes exactly the rest, with no duplicate (a duplicate would be a commit whose
/// settlement the first run lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_backlog_drains_and_leaves_nothing_to_lock_expiry() {
    let url = common::fresh_schema("downstream_sigterm").await;
    let config = Config::new("sbemulatorns").with_queue(QueueConfig::new("orders"));
    let emulator = Emulator::start(Broker::new(config).unwrap(), EmulatorOptions::default())
        .await
        .unwrap();
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    let client = ServiceBusClient::from_connection_string(&cs);
    let sender = client.sender("orders");
    for i in 0..BACKLOG {
        let body = format!(r#"{{"orderId":"o-{i}","totalCents":100}}"#);
        sender
            .send(Message::new(
                format!("m-{i}"),
                "orders.order-placed.v1",
                body,
            ))
            .await
            .unwrap();
    }

    let dir = std::env::temp_dir().join(format!("sb-inbox-sigterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("orders-worker.json");
    let config = serde_json::json!({
        "consumer": "downstream.orders",
        "store": url,
        "servicebus": { "entity": "orders" },
        "runtime": { "concurrency": 4 },
    });
    std::fs::write(&path, config.to_string()).unwrap();
    let log = dir.join("stderr.log");
    let child = Command::new(env!("CARGO_BIN_EXE_sb-inbox-downstream"))
        .arg(&path)
        .env("ORDERS_SERVICEBUS_CONNECTION", emulator.connection_string())
        .env("RUST_LOG", "info")
        // Misspelt: warned about at start, naming the setting meant, and otherwise ignored.
        .env("ORDERS_CONCURENCY", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut service = Running(child);

    let entity = emulator.broker().entity("orders").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while entity.counts().completed < 20 {
        assert!(Instant::now() < deadline, "the service completes nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let term = Command::new("kill")
        .args(["-TERM", &service.0.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = loop {
        if let Some(status) = service.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the service does not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let counts = entity.counts();
    let waiting = client
        .peek("orders", 0, u32::try_from(BACKLOG).unwrap())
        .await
        .unwrap();
    let redelivered: Vec<u32> = waiting
        .iter()
        .map(|m| m.delivery_count)
        .filter(|&count| count > 0)
        .collect();
    // A delivery still locked when the process went comes back with its delivery count
    // raised: by lock expiry on Service Bus, at once here (the emulator unlocks a dropped
    // connection's deliveries the way lock expiry would, only sooner). The drain leaves none.
    assert!(
        redelivered.is_empty(),
        "deliveries left to lock expiry ({status}): {redelivered:?} {counts:?}\n{stderr}"
    );
    assert_eq!(waiting.len(), counts.active, "{counts:?}");
    assert_eq!(
        counts.locked, 0,
        "locked at exit, left to lock expiry ({status}): {counts:?}\n{stderr}"
    );
    assert!(status.success(), "{status}: {counts:?} {stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert!(
        stderr.contains("variable=ORDERS_CONCURENCY")
            && stderr.contains("nearest=ORDERS_CONCURRENCY"),
        "{stderr}"
    );
    assert_eq!(counts.dead_lettered_total, 0, "{counts:?}");
    let completed = usize::try_from(counts.completed).unwrap();
    assert!(
        counts.active > 0,
        "the backlog was gone before the signal; the test proves nothing: {counts:?}"
    );
    assert_eq!(completed + counts.active, BACKLOG, "{counts:?}");
    let store = PgStore::connect(&url, 1).await.unwrap();
    let rows = |store: PgStore| async move {
        let rows = store
            .query("SELECT count(*) FROM downstream_orders", &[])
            .await
            .unwrap();
        usize::try_from(rows[0].get::<_, i64>(0)).unwrap()
    };
    assert_eq!(rows(store.clone()).await, completed, "{counts:?}");

    // The rest, in process: each exactly once, nothing already applied.
    let env = {
        let cs = emulator.connection_string();
        move |name: &str| (name == "ORDERS_SERVICEBUS_CONNECTION").then(|| cs.clone())
    };
    let shutdown = CancellationToken::new();
    let config = sb_inbox_downstream::load(&path, &env).unwrap();
    let rest = tokio::spawn(sb_inbox_downstream::serve(config, shutdown.clone()));
    while usize::try_from(entity.counts().completed).unwrap() < BACKLOG {
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "{:?}",
            entity.counts()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let stats = rest.await.unwrap().unwrap().total();
    assert_eq!(
        (stats.processed, stats.duplicate),
        (u64::try_from(BACKLOG - completed).unwrap(), 0),
        "{stats:?}"
    );
    assert_eq!(rows(store).await, BACKLOG);
    std::fs::remove_dir_all(&dir).ok();
}
