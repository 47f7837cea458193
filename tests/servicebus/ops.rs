//! The operator commands (`sb-inbox send`, `sb-inbox dlq`) as processes of the built binary:
//! they connect as the worker does (the CA bundle, `HTTPS_PROXY`, the server-busy wait, under
//! the worker's variable names), and `dlq resubmit --config` keys a MassTransit envelope's copy
//! on the envelope's `messageId`, so the worker completes it as a duplicate.

use std::path::{Path, PathBuf};
use std::process::Output;

use sb_emulator::Emulator;
use sb_inbox::runtime::LOGICAL_ID_PROPERTY;
use sb_inbox::{Delivery as _, Message, PropertyValue, Receiver as _};
use sb_testkit::ConnectProxy;

use crate::envelopes::{Running, inbox_keys, started};
use crate::support::cli::{command, stderr, stdout};
use crate::support::emulator::{client, properties, queue, start};
use crate::support::inventory_totals;
use crate::tls::{tls_dir, tls_emulator};
use crate::worker::queue_drained;

/// Variables a developer's shell may carry that would change what these processes trust, go
/// through or key on; each test sets what it means to.
const AMBIENT: [&str; 10] = [
    "SSL_CERT_FILE",
    "SB_INBOX_SERVICEBUS_CA_FILE",
    "SB_INBOX_SERVICEBUS_NATIVE_ROOTS",
    "SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS",
    "HTTPS_PROXY",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
    "SB_INBOX_ENVELOPE",
    "SB_INBOX_ENVELOPE_TYPES",
];

/// `sb-inbox ARGS` over `connection` with `env` set and the ambient settings removed.
async fn run(connection: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = command(Some(connection), args);
    for name in AMBIENT {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    tokio::process::Command::from(command)
        .output()
        .await
        .expect("the binary runs")
}

/// A file of this test's own.
fn file(test: &str, name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sb-inbox-ops-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `send` and `dlq peek|resubmit` against the emulator's TLS listener (its certificate signed by
/// a CA it generates): with the CA in `SB_INBOX_SERVICEBUS_CA_FILE` (the worker's
/// `servicebus.ca_file`), `--ca-file` or `SSL_CERT_FILE` they succeed; without it they fail
/// naming the unknown issuer; a bad bundle, busy wait or native-roots flag is refused naming
/// its setting, and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_dlq_trust_the_ca_bundle_the_worker_is_given() {
    let dir = tls_dir("ops-cli");
    let emulator = tls_emulator(dir.clone()).await;
    let ca = emulator.tls_ca_file().unwrap();
    let ca = ca.to_str().unwrap();
    let tls = emulator.tls_connection_string().unwrap();
    let orders = file(
        "tls",
        "orders.json",
        r#"[{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 1}]}]"#,
    );
    let send = ["send", "--entity", "q", "--file", orders.to_str().unwrap()];
    let sent = || emulator.broker().entity("q").unwrap().counts().sent;

    let refused = run(&tls, &send, &[]).await;
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("UnknownIssuer"),
        "{}",
        stderr(&refused)
    );
    for (env, expected) in [
        (
            ("SB_INBOX_SERVICEBUS_CA_FILE", "/no/such/ca.pem"),
            "invalid --ca-file (SB_INBOX_SERVICEBUS_CA_FILE, else SSL_CERT_FILE)",
        ),
        (
            ("SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS", "600001"),
            "invalid value '600001' for '--server-busy-wait-ms",
        ),
        (
            ("SB_INBOX_SERVICEBUS_NATIVE_ROOTS", "maybe"),
            "invalid value 'maybe' for '--native-roots",
        ),
    ] {
        let output = run(&tls, &send, &[env]).await;
        assert_ne!(output.status.code(), Some(0), "{env:?}");
        assert!(
            stderr(&output).contains(expected),
            "{env:?}: expected {expected:?} in {}",
            stderr(&output)
        );
    }
    assert_eq!(sent(), 0, "nothing went through");

    let output = run(
        &tls,
        &send,
        &[
            ("SB_INBOX_SERVICEBUS_CA_FILE", ca),
            ("SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS", "2000"),
        ],
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(sent(), 1);

    // The order is dead-lettered (over the plain listener), then looked at and put back over
    // TLS.
    let receiver = client(&emulator).receiver("q", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    delivery
        .dead_letter("Poison", "for the test")
        .await
        .unwrap();
    receiver.close().await;
    let peek = ["dlq", "peek", "--entity", "q"];
    let refused = run(&tls, &peek, &[]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("UnknownIssuer"),
        "{}",
        stderr(&refused)
    );
    // `--ca-file`, and `SSL_CERT_FILE` when no bundle is named, as the worker reads them.
    for (args, env) in [
        ([&peek[..], &["--ca-file", ca]].concat(), None),
        (peek.to_vec(), Some(("SSL_CERT_FILE", ca))),
    ] {
        let output = run(&tls, &args, env.as_slice()).await;
        assert!(output.status.success(), "{env:?}: {}", stderr(&output));
        assert!(
            stdout(&output).ends_with("1 dead letter(s) in q/$DeadLetterQueue\n"),
            "{}",
            stdout(&output)
        );
    }
    let resubmit = ["dlq", "resubmit", "--entity", "q", "--wait-secs", "1"];
    let output = run(&tls, &resubmit, &[("SB_INBOX_SERVICEBUS_CA_FILE", ca)]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output)
            .ends_with("1 dead letter(s) resubmitted from q/$DeadLetterQueue to q, 0 left\n"),
        "{}",
        stdout(&output)
    );
    assert_eq!(sent(), 2, "the copy went back to q");
    let _ = std::fs::remove_dir_all(dir);
}

/// `send` over `wss` goes through the HTTP `CONNECT` proxy `HTTPS_PROXY` names, as the worker's
/// does (`ProxyConfig::from_env_vars`); a malformed proxy is refused before connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_goes_through_the_https_proxy_the_worker_uses() {
    let dir = tls_dir("ops-cli-proxy");
    let emulator = tls_emulator(dir.clone()).await;
    let ca = emulator.tls_ca_file().unwrap();
    let ca = ca.to_str().unwrap();
    let wss = emulator.tls_websocket_connection_string().unwrap();
    let orders = file(
        "proxy",
        "orders.json",
        r#"[{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 1}]}]"#,
    );
    let send = ["send", "--entity", "q", "--file", orders.to_str().unwrap()];
    let proxy = ConnectProxy::start().await.unwrap();
    let url = proxy.url();
    let trust = ("SB_INBOX_SERVICEBUS_CA_FILE", ca);

    let bad = run(&wss, &send, &[trust, ("HTTPS_PROXY", "ftp://x")]).await;
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("HTTPS_PROXY"), "{}", stderr(&bad));
    assert_eq!(emulator.broker().entity("q").unwrap().counts().sent, 0);
    let output = run(&wss, &send, &[trust, ("HTTPS_PROXY", &url)]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(proxy.tunnels(), 1, "the connection was tunnelled");
    assert_eq!(emulator.broker().entity("q").unwrap().counts().sent, 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// MassTransit's JSON envelope (application/vnd.masstransit+json, the fields
/// <https://masstransit.io/documentation/configuration/serialization> shows) of order `o-1`
/// with MassTransit's `messageId` `mt-1`, under broker message id `broker_id`.
fn masstransit_order(broker_id: &str) -> Message {
    let envelope = serde_json::json!({
        "messageId": "mt-1",
        "conversationId": "conv-mt-1",
        "sourceAddress": "sb://shop.servicebus.windows.net/checkout",
        "destinationAddress": "sb://shop.servicebus.windows.net/Shop.Contracts/OrderPlaced",
        "messageType": ["urn:message:Shop.Contracts:OrderPlaced"],
        "message": {"orderId": "o-1", "lines": [{"sku": "A", "quantity": 2}]},
        "sentTime": "2026-12-04T20:00:00.0000000Z",
        "headers": {},
    });
    let mut message = Message::new(broker_id, "", serde_json::to_vec(&envelope).unwrap());
    // MassTransit sets no subject; its content type names the envelope.
    message.subject = None;
    message.content_type = Some("application/vnd.masstransit+json".to_owned());
    message
}

/// Sends `message` to `parked` (a queue no worker reads) and dead-letters it there.
async fn dead_letter_on_parked(emulator: &Emulator, message: Message) {
    let client = client(emulator);
    client.sender("parked").send(message).await.unwrap();
    let receiver = client.receiver("parked", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    delivery
        .dead_letter("Parked", "held back by the test")
        .await
        .unwrap();
    receiver.close().await;
}

/// `sb-inbox run` (the reference consumer, MassTransit's envelope) on `orders`, storing in the
/// SQLite file `db`.
async fn masstransit_worker(emulator: &Emulator, db: &Path, config: &Path) -> Running {
    let child = crate::support::cli::worker(
        &format!("sqlite://{}", db.display()),
        &emulator.connection_string(),
    )
    .args(["--config", config.to_str().unwrap()])
    .env("SB_INBOX_HEALTH_PORT", "0")
    .env_remove("SB_INBOX_ENVELOPE")
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    started(child).await
}

/// The copies on `orders`, as (broker message id, `sb-inbox-logical-id`).
async fn copies_on_orders(emulator: &Emulator) -> Vec<(String, String)> {
    client(emulator)
        .peek("orders", 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|peeked| {
            let message = Message::from(&peeked.message);
            let logical = match message.application_properties.get(LOGICAL_ID_PROPERTY) {
                Some(PropertyValue::String(id)) => id.clone(),
                other => panic!("no logical id: {other:?}"),
            };
            (message.message_id.unwrap_or_default(), logical)
        })
        .collect()
}

/// A MassTransit order processed by `sb-inbox run` (`kind = "masstransit"`), then a copy of
/// the same envelope under a new broker id dead-lettered and resubmitted with `dlq resubmit
/// --config worker.toml`: the copy carries `sb-inbox-logical-id` = the envelope's `messageId`,
/// and the worker completes it as a duplicate (one reservation, one inbox row). Without
/// `--config` (and no `SB_INBOX_ENVELOPE`) the copy is keyed on its broker id, as docs/manual.md says:
/// the inbox does not recognise it, and only the reference consumer's business key keeps the
/// order from taking effect twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_resubmit_with_the_envelope_config_keeps_the_masstransit_message_id() {
    let emulator = start(
        vec![
            queue("orders", properties("PT30S", 5)),
            queue("parked", properties("PT30S", 5)),
        ],
        Default::default(),
    )
    .await;
    let cs = emulator.connection_string();
    let config = file(
        "mt-resubmit",
        "worker.toml",
        "[envelope]\nkind = \"masstransit\"\n[envelope.types]\n\"urn:message:Shop.Contracts:OrderPlaced\" = \"orders.order-placed.v1\"\n\"urn:message:Shop.Contracts:OrderCancelled\" = \"orders.order-cancelled.v1\"\n",
    );
    let (_dir, db) = crate::support::sqlite_file_store("ops-mt-resubmit").await;

    let worker = masstransit_worker(&emulator, &db, &config).await;
    client(&emulator)
        .sender("orders")
        .send(masstransit_order("b-1"))
        .await
        .unwrap();
    queue_drained(&emulator, "orders", 1).await;
    worker.stop().await;
    assert_eq!(inbox_keys(&db), ["mt-1"]);

    dead_letter_on_parked(&emulator, masstransit_order("b-2")).await;
    let resubmit = ["dlq", "resubmit", "--entity", "parked", "--to", "orders"];
    let resubmit = [&resubmit[..], &["--wait-secs", "1"]].concat();
    let with_config = [&resubmit[..], &["--config", config.to_str().unwrap()]].concat();
    let output = run(&cs, &with_config, &[]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output)
            .contains(r#"resubmitted message_id="b-2" as "mt-1/resubmit-1" logical_id="mt-1""#),
        "{}",
        stdout(&output)
    );
    // Without the envelope the command cannot see MassTransit's id: the copy keys on b-3.
    dead_letter_on_parked(&emulator, masstransit_order("b-3")).await;
    let output = run(&cs, &resubmit, &[]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        copies_on_orders(&emulator).await,
        [
            ("mt-1/resubmit-1".to_owned(), "mt-1".to_owned()),
            ("b-3/resubmit-1".to_owned(), "b-3".to_owned()),
        ]
    );

    let worker = masstransit_worker(&emulator, &db, &config).await;
    queue_drained(&emulator, "orders", 3).await;
    worker.stop().await;
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.completed, counts.dead_lettered_total), (3, 0));
    let store = sb_inbox::SqliteStore::open(&db).unwrap();
    // (reservations, inbox rows, units): one. The --config copy was an inbox duplicate of
    // mt-1; the copy keyed on b-3 got past the inbox key and was stopped only by the reference
    // consumer's business key (`order:o-1`), whose claim rolled its transaction back.
    assert_eq!(inventory_totals(&store).await, (1, 1, 2));
    assert_eq!(inbox_keys(&db), ["mt-1"]);
}
