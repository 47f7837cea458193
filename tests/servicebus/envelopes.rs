//! Foreign envelopes end to end: fixtures built from MassTransit's, NServiceBus's and
//! CloudEvents' documented wire formats (see `sdk/python_envelopes.py` for each source), sent
//! through the emulator with the official Python SDK, consumed by `sb-inbox run` configured for
//! that envelope; each order takes effect once, duplicates (the same envelope id under another
//! broker id) are recognised, and one order sent by two frameworks under their own ids dedupes
//! by its business key (`order:<id>`, claimed by the reference consumer).

use std::time::Duration;

use sb_inbox::envelope::cloudevent_id;
use sb_inbox::{Delivery as _, Message, PropertyValue, Receiver as _};
use sb_inbox_cli::inventory::InventoryStore;

use crate::python::sdk_installed;
use crate::support::cli;
use crate::support::emulator::{client, emulator, properties, queue, start};
use crate::support::{inventory_totals, pg_store, pg_url, schema_for, with_search_path};
use crate::worker::{health_address, queue_drained, ready, sigterm_exits_0, sqlite_worker};

/// Whether the official CloudEvents SDK is there; when not, fails under CI or says `skipped`.
fn cloudevents_installed() -> bool {
    sb_testkit::require(
        sb_testkit::PYTHON_CLOUDEVENTS,
        sb_testkit::python_imports("cloudevents.core.bindings.amqp"),
    )
}

/// Runs `sdk/python_envelopes.py CONNECTION QUEUE SCENARIO [ORDER]`; asserts it sent `sent`.
async fn send(connection: &str, queue: &str, scenario: &str, order: Option<&str>, sent: usize) {
    let script = format!(
        "{}/../../tests/servicebus/sdk/python_envelopes.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(script)
        .args([connection, queue, scenario])
        .args(order)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.trim(), format!("sent {sent}"));
}

/// A worker process, killed if the test ends before stopping it (a failed assertion), so that
/// no process outlives its test.
pub(crate) struct Running(Option<std::process::Child>);

impl Running {
    /// SIGTERM; asserts it exits 0.
    pub(crate) async fn stop(mut self) {
        if let Some(child) = self.0.take() {
            sigterm_exits_0(child).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            // Best effort on a failing test's way out: the process may already be gone.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `sb-inbox run` (the reference consumer, SQLite) on the emulator's `orders` with
/// `extra` settings, waits until it is ready; the store's file and the process.
async fn worker(
    tag: &str,
    emulator: &sb_emulator::Emulator,
    extra: &[(&str, &str)],
) -> (std::path::PathBuf, Running) {
    let (_dir, db, child) = sqlite_worker(tag, &emulator.connection_string(), extra).await;
    (db, started(child).await)
}

/// `child` once its `/readyz` answers.
pub(crate) async fn started(mut child: std::process::Child) -> Running {
    let stderr = child.stderr.take().unwrap();
    let running = Running(Some(child));
    let addr = tokio::task::spawn_blocking(move || health_address(stderr))
        .await
        .unwrap();
    ready(addr).await;
    running
}

/// The inbox keys in the SQLite store at `db`, sorted: the logical ids the worker recorded.
pub(crate) fn inbox_keys(db: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut statement = conn
        .prepare("SELECT message_id FROM sb_inbox ORDER BY message_id")
        .unwrap();
    statement
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The dead letters on `orders`, as (broker message id, reason).
async fn dead_letters(emulator: &sb_emulator::Emulator, expected: usize) -> Vec<(String, String)> {
    let receiver = client(emulator).receiver("orders/$DeadLetterQueue", 0);
    let mut found = Vec::new();
    while found.len() < expected {
        let dead = tokio::time::timeout(Duration::from_secs(10), receiver.receive())
            .await
            .expect("a dead letter arrives")
            .unwrap()
            .unwrap();
        let message: &Message = dead.message();
        let reason = match message.application_properties.get("DeadLetterReason") {
            Some(PropertyValue::String(reason)) => reason.clone(),
            other => panic!("no reason: {other:?}"),
        };
        found.push((message.message_id.clone().unwrap_or_default(), reason));
        dead.complete().await.unwrap();
    }
    found
}

/// MassTransit's JSON envelope and its raw JSON, configured in `worker.toml`: three orders,
/// each once although two were delivered twice under new broker ids; an unmapped message type
/// is dead-lettered `UnsupportedContract`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masstransit_messages_take_effect_once_each() {
    if !sdk_installed() {
        return;
    }
    let emulator = emulator("PT30S").await;
    let dir = std::env::temp_dir().join(format!("sb-inbox-envelopes-mt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        "[envelope]\nkind = \"masstransit\"\n[envelope.types]\n\"urn:message:Shop.Contracts:OrderPlaced\" = \"orders.order-placed.v1\"\n\"urn:message:Shop.Contracts:OrderCancelled\" = \"orders.order-cancelled.v1\"\n",
    )
    .unwrap();
    let (_dir, db, child) = crate::worker::sqlite_worker_with_args(
        "envelopes-mt",
        &emulator.connection_string(),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let child = started(child).await;
    send(
        &emulator.connection_string(),
        "orders",
        "masstransit",
        None,
        6,
    )
    .await;
    queue_drained(&emulator, "orders", 6).await;
    assert_eq!(
        dead_letters(&emulator, 1).await,
        [("b-6".to_owned(), "UnsupportedContract".to_owned())]
    );
    child.stop().await;
    let store = sb_inbox::SqliteStore::open(&db).unwrap();
    // (reservations, inbox rows, reserved units): three orders of two units, once each, keyed
    // on MassTransit's messageId / MessageId, not the broker ids (b-1…b-5).
    assert_eq!(inventory_totals(&store).await, (3, 3, 6));
    assert_eq!(inbox_keys(&db), ["mt-1", "mt-2", "mt-3"]);
}

/// NServiceBus native messages key on `NServiceBus.MessageId`, not the broker's: a copy under a
/// new broker id is a duplicate, another message under an earlier broker id is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nservicebus_messages_key_on_their_own_message_id() {
    if !sdk_installed() {
        return;
    }
    let emulator = emulator("PT30S").await;
    let (db, child) = worker(
        "envelopes-nsb",
        &emulator,
        &[
            ("SB_INBOX_ENVELOPE", "nservicebus"),
            (
                "SB_INBOX_ENVELOPE_TYPES",
                "Shop.Contracts.OrderPlaced=orders.order-placed;Shop.Contracts.OrderCancelled=orders.order-cancelled",
            ),
        ],
    )
    .await;
    send(
        &emulator.connection_string(),
        "orders",
        "nservicebus",
        None,
        4,
    )
    .await;
    queue_drained(&emulator, "orders", 4).await;
    child.stop().await;
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.dead_lettered_total), (4, 0));
    let store = sb_inbox::SqliteStore::open(&db).unwrap();
    assert_eq!(inventory_totals(&store).await, (3, 3, 6));
    // nsb-3 came under nsb-1's broker id (b-1) and is its own message.
    assert_eq!(inbox_keys(&db), ["nsb-1", "nsb-2", "nsb-3"]);
}

/// CloudEvents made by the official CloudEvents SDK, structured and binary: the same event
/// (source + id) in both modes takes effect once; the same id from another source is another
/// event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_from_the_official_sdk_take_effect_once_each() {
    if !sdk_installed() || !cloudevents_installed() {
        return;
    }
    let emulator = emulator("PT30S").await;
    let (db, child) = worker(
        "envelopes-ce",
        &emulator,
        &[
            ("SB_INBOX_ENVELOPE", "cloudevents"),
            (
                "SB_INBOX_ENVELOPE_TYPES",
                "com.example.shop.order.placed=orders.order-placed.v1;com.example.shop.order.cancelled=orders.order-cancelled.v1",
            ),
        ],
    )
    .await;
    send(
        &emulator.connection_string(),
        "orders",
        "cloudevents",
        None,
        4,
    )
    .await;
    queue_drained(&emulator, "orders", 4).await;
    child.stop().await;
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.dead_lettered_total), (4, 0));
    let store = sb_inbox::SqliteStore::open(&db).unwrap();
    assert_eq!(inventory_totals(&store).await, (3, 3, 6));
    let mut expected = vec![
        cloudevent_id("/shop/checkout", "e-1"),
        cloudevent_id("/shop/checkout", "e-2"),
        cloudevent_id("/shop/returns", "e-1"),
    ];
    expected.sort();
    assert_eq!(inbox_keys(&db), expected);
}

/// Issue 40, M4 (must show): two distinct binary CloudEvents (`cloudEvents_id` e-1 and e-2) that
/// both carry a plain `id` application property give two reservations. Before, the plain `id`
/// overrode the attribute: both were keyed on it, and the second was completed as a duplicate
/// with its effect lost (`processed: 1, duplicate: 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_cloudevents_with_a_plain_id_property_are_two_events() {
    if !sdk_installed() || !cloudevents_installed() {
        return;
    }
    let emulator = emulator("PT30S").await;
    let (db, child) = worker(
        "envelopes-ce-plain-id",
        &emulator,
        &[
            ("SB_INBOX_ENVELOPE", "cloudevents"),
            (
                "SB_INBOX_ENVELOPE_TYPES",
                "com.example.shop.order.placed=orders.order-placed.v1;com.example.shop.order.cancelled=orders.order-cancelled.v1",
            ),
        ],
    )
    .await;
    send(
        &emulator.connection_string(),
        "orders",
        "cloudevents-plain-id",
        None,
        2,
    )
    .await;
    queue_drained(&emulator, "orders", 2).await;
    child.stop().await;
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.dead_lettered_total), (2, 0));
    let store = sb_inbox::SqliteStore::open(&db).unwrap();
    assert_eq!(
        inventory_totals(&store).await,
        (2, 2, 4),
        "two reservations"
    );
    let mut expected = vec![
        cloudevent_id("/shop/checkout", "e-1"),
        cloudevent_id("/shop/checkout", "e-2"),
    ];
    expected.sort();
    assert_eq!(inbox_keys(&db), expected);
}

/// One order published by a MassTransit service and by an NServiceBus service, each under its
/// own id, to two queues read by two `sb-inbox run` processes of one consumer (one store): the
/// business key `order:<id>` lets it take effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_from_two_frameworks_dedupes_by_business_key() {
    if !sdk_installed() {
        return;
    }
    const TEST: &str = "sb_envelopes_cross";
    let store = pg_store(TEST, 2).await;
    let url = with_search_path(&pg_url(), &schema_for(TEST));
    let emulator = start(
        vec![
            queue("orders-mt", properties("PT30S", 5)),
            queue("orders-nsb", properties("PT30S", 5)),
        ],
        sb_emulator::EmulatorOptions::default(),
    )
    .await;
    let connection = emulator.connection_string();
    let spawn = |entity: &str, envelope: &str, types: &str| {
        cli::worker(&url, &connection)
            .env("SB_INBOX_ENTITY", entity)
            .env("SB_INBOX_HEALTH_PORT", "0")
            .env("SB_INBOX_ENVELOPE", envelope)
            .env("SB_INBOX_ENVELOPE_TYPES", types)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mt = started(spawn(
        "orders-mt",
        "masstransit",
        "urn:message:Shop.Contracts:OrderPlaced=orders.order-placed.v1;urn:message:Shop.Contracts:OrderCancelled=orders.order-cancelled.v1",
    ))
    .await;
    let nsb = started(spawn(
        "orders-nsb",
        "nservicebus",
        "Shop.Contracts.OrderPlaced=orders.order-placed;Shop.Contracts.OrderCancelled=orders.order-cancelled",
    ))
    .await;
    send(&connection, "orders-mt", "masstransit-one", Some("o-77"), 1).await;
    queue_drained(&emulator, "orders-mt", 1).await;
    send(
        &connection,
        "orders-nsb",
        "nservicebus-one",
        Some("o-77"),
        1,
    )
    .await;
    queue_drained(&emulator, "orders-nsb", 1).await;
    mt.stop().await;
    nsb.stop().await;
    for entity in ["orders-mt", "orders-nsb"] {
        let counts = emulator.broker().entity(entity).unwrap().counts();
        assert_eq!(
            (counts.completed, counts.dead_lettered_total),
            (1, 0),
            "{entity}"
        );
    }
    // One reservation of two units; one inbox row: the second delivery rolled back as a
    // business-key duplicate.
    assert_eq!(inventory_totals(&store).await, (1, 1, 2));
    assert_eq!(store.inventory_counts().await.unwrap().line_units, 2);
    // The row is MassTransit's (sent and drained first), keyed on its messageId.
    let keys: Vec<String> = store
        .query("SELECT message_id FROM sb_inbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(keys, ["mt-o-77"]);
}

/// An envelope `sb-inbox run` cannot build stops the start (exit 2) naming the key, before any
/// connection: an unknown kind, and a type map entry without the version MassTransit lacks.
#[test]
fn a_bad_envelope_stops_the_start_naming_the_key() {
    for (kind, types, expected) in [
        (
            "rebus",
            "",
            "envelope.kind (SB_INBOX_ENVELOPE): \"rebus\" is not an envelope kind",
        ),
        (
            "masstransit",
            "urn:message:Shop.Contracts:OrderPlaced=orders.order-placed",
            "envelope.types (SB_INBOX_ENVELOPE_TYPES): type \"urn:message:Shop.Contracts:OrderPlaced\" maps to a contract without a version",
        ),
    ] {
        let output = std::process::Command::new(cli::BINARY)
            .arg("run")
            .env_clear()
            .env("SB_INBOX_CONSUMER", "shop.inventory")
            .env("SB_INBOX_STORE", "sqlite::memory:")
            .env(
                "SB_INBOX_SERVICEBUS_CONNECTION",
                "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=s;UseDevelopmentEmulator=true",
            )
            .env("SB_INBOX_ENTITY", "orders")
            .env("SB_INBOX_ENVELOPE", kind)
            .env("SB_INBOX_ENVELOPE_TYPES", types)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    }
}
