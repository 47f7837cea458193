//! The official Python SDK (`azure-servicebus`) as an independent client of the emulator.

use crate::support::emulator::emulator;

/// Whether the Python SDK is there; when not, fails under CI or says `skipped`.
pub(crate) fn sdk_installed() -> bool {
    sb_testkit::require(
        sb_testkit::PYTHON_SDK,
        sb_testkit::python_imports("azure.servicebus"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_sends_receives_and_settles() {
    if !sdk_installed() {
        return;
    }
    let emulator = emulator("PT30S").await;
    let stdout = run_smoke(&[emulator.connection_string()]).await;
    assert!(stdout.contains("python sdk: ok"), "{stdout}");
    assert_orders_settled(&emulator);
}

/// Runs `sdk/python_smoke.py ARGS`, asserts it succeeded, returns its stdout.
async fn run_smoke(args: &[String]) -> String {
    run_script("python_smoke.py", args).await
}

/// Runs `sdk/SCRIPT ARGS`, asserts it succeeded, returns its stdout.
async fn run_script(script: &str, args: &[String]) -> String {
    let script = format!(
        "{}/../../tests/servicebus/sdk/{script}",
        env!("CARGO_MANIFEST_DIR")
    );
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(script)
        .args(args)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// Nothing left active, locked or dead-lettered on `orders`.
fn assert_orders_settled(emulator: &sb_emulator::Emulator) {
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!(
        (counts.active, counts.locked, counts.dead_lettered),
        (0, 0, 0)
    );
}

/// Starts an emulator with `sdk/conformance.json`'s entities and runs `sdk/python_conformance.py`
/// against it: the `cases` named, or all; asserts it succeeded and returns its stdout.
async fn run_conformance(cases: &[&str]) -> (sb_emulator::Emulator, String) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/servicebus/sdk");
    let config = std::fs::read_to_string(format!("{dir}/conformance.json")).unwrap();
    let broker =
        sb_emulator::Broker::new(sb_emulator::Config::from_json(&config).unwrap()).unwrap();
    let emulator = sb_emulator::Emulator::start(broker, Default::default())
        .await
        .unwrap();
    let orders = seed_99_orders();
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(format!("{dir}/python_conformance.py"))
        .arg(emulator.connection_string())
        .args(cases)
        .env("SEED_99_ORDERS", &orders)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (emulator, stdout)
}

/// 2000 orders as `sb-inbox send --generate 2000 --seed 99` makes them (message id and JSON
/// body), for the SDK's batch case.
fn seed_99_orders() -> std::path::PathBuf {
    let orders: Vec<serde_json::Value> = sb_inbox_cli::ops::send::generate(2000, 99)
        .iter()
        .map(|order| {
            let message = order.to_message().unwrap();
            serde_json::json!({
                "messageId": order.message_id,
                "body": String::from_utf8(message.body.to_vec()).unwrap(),
            })
        })
        .collect();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("seed-99-orders-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&path, serde_json::to_vec(&orders).unwrap()).unwrap();
    path
}

/// Issue 29: the SDK's `ServiceBusMessageBatch` of seed-99 orders, filled until the next order
/// would pass `max_size_in_bytes` (the advertised 262 144), is accepted whole: the emulator
/// measures a batch by its messages, as the SDK does (the envelope properties it copies from
/// the first order are not counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_full_batch_of_seed_99_orders_is_accepted() {
    if !sdk_installed() {
        return;
    }
    let (emulator, stdout) = run_conformance(&["full_batch_of_orders_is_accepted"]).await;
    let line = stdout.lines().find(|l| l.starts_with("batch: ")).unwrap();
    let added: usize = line["batch: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(added > 1000, "{line}");
    assert!(line.ends_with("of 262144 bytes"), "{line}");
    let counts = emulator.broker().entity("c-batch").unwrap().counts();
    assert_eq!((counts.active, counts.dead_lettered), (0, 0));
    emulator.shutdown().await;
}

/// Issue 29: the dead-letter queue of a session queue is read with the SDK's plain receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_reads_session_queue_dead_letters_with_plain_receiver() {
    if !sdk_installed() {
        return;
    }
    let (emulator, stdout) =
        run_conformance(&["session_queue_dead_letters_read_with_plain_receiver"]).await;
    assert!(stdout.ends_with("python conformance: ok\n"), "{stdout}");
    let counts = emulator.broker().entity("c-s-dlq").unwrap().counts();
    assert_eq!((counts.active, counts.dead_lettered), (0, 0));
    emulator.shutdown().await;
}

/// Issue 4's conformance suite: every case in `sdk/python_conformance.py` against one emulator
/// with the entities the cases need (`sdk/conformance.json`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_conformance() {
    if !sdk_installed() {
        return;
    }
    let (emulator, stdout) = run_conformance(&[]).await;
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.ends_with(")") && l.contains(": ok ("))
            .count(),
        25,
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some("python conformance: ok"),
        "{stdout}"
    );
    for name in [
        "c-settle",
        "c-lock",
        "c-renew",
        "c-autorenew",
        "c-maxdc",
        "c-prefetch",
        "c-fields",
        "c-s-fifo",
        "c-s-state",
        "c-s-excl",
        "c-s-abandon",
        "c-s-expiry",
        "c-s-plain",
        "c-batch",
        "c-s-dlq",
        "t-sess/Subscriptions/s-sess",
    ] {
        let counts = emulator.broker().entity(name).unwrap().counts();
        assert_eq!(
            (
                counts.active,
                counts.locked,
                counts.deferred,
                counts.dead_lettered
            ),
            (0, 0, 0, 0),
            "{name}"
        );
    }
    emulator.shutdown().await;
}

/// Entity slots for `sdk/python_samples.py`: one queue, one session queue and one topic
/// (subscription `sample-s`, session subscription `sample-ss`) per sample, so samples run in parallel without reading each other's messages.
const SAMPLE_SLOTS: usize = 64;

/// Issue 21: the official Python SDK's own samples, as shipped in its source distribution on
/// PyPI (downloaded at test time into the target directory, never committed), run unmodified
/// against the emulator. `sdk/python_samples.py` says which ran and why the others cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_samples_run_unmodified() {
    if !sdk_installed() {
        return;
    }
    let slot = |kind: &str, i: usize| format!("sample-{kind}-{i}");
    let mut config = sb_emulator::Config::new("sbemulatorns");
    let sessions = sb_emulator::EntityProperties {
        requires_session: true,
        ..Default::default()
    };
    for i in 0..SAMPLE_SLOTS {
        config = config
            .with_queue(sb_emulator::QueueConfig::new(slot("q", i)))
            .with_queue(
                sb_emulator::QueueConfig::new(slot("sq", i)).with_properties(sessions.clone()),
            )
            .with_topic(
                sb_emulator::TopicConfig::new(slot("t", i))
                    .with_subscription(sb_emulator::SubscriptionConfig::new("sample-s"))
                    .with_subscription(
                        sb_emulator::SubscriptionConfig::new("sample-ss")
                            .with_properties(sessions.clone()),
                    ),
            );
    }
    let broker = sb_emulator::Broker::new(config).unwrap();
    // The samples authenticate with DefaultAzureCredential (an Entra ID token) or SAS.
    // Issue 33: the ServiceBusAdministrationClient samples reach the management API through
    // the script's HTTPS front on 443, which forwards to `--http-listen`.
    let options = sb_emulator::EmulatorOptions {
        accept_jwt: true,
        ..Default::default()
    }
    .with_http_listen("127.0.0.1:0");
    let emulator = sb_emulator::Emulator::start(broker, options).await.unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/servicebus/sdk/python_samples.py"
    );
    let cache = concat!(env!("CARGO_TARGET_TMPDIR"), "/python-sdk-samples");
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(script)
        .arg(cache)
        .arg(emulator.local_addr().port().to_string())
        .arg(SAMPLE_SLOTS.to_string())
        .arg(emulator.http_addr().unwrap().port().to_string())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) {
        eprintln!("{}", stdout.lines().next().unwrap_or_default());
        sb_testkit::missing(sb_testkit::PYTHON_SAMPLES);
        return;
    }
    println!("{stdout}");
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let passed = stdout
        .lines()
        .filter(|l| l.starts_with("sample ") && l.contains(": ok ("))
        .count();
    // 47 of 7.15.0's 58 samples apply (8 of them with message sessions, 10 of them with
    // `ServiceBusAdministrationClient` over the HTTPS management API, issue 33); the rest need
    // a proxy, a service principal, sleep past the timeout, or never exit.
    assert!(passed >= 47, "{stdout}");
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.starts_with(&format!("python samples: {passed} passed, 0 failed"))),
        "{stdout}"
    );
    emulator.shutdown().await;
}

fn websocket_client_installed() -> bool {
    sb_testkit::require(
        sb_testkit::PYTHON_WEBSOCKETS,
        sb_testkit::python_imports("websocket"),
    )
}

/// Issue 13, must show 4: the official Python SDK over `TransportType.AmqpOverWebsocket` against
/// the emulator's WebSocket listener. The connection string names only the WebSocket port, so
/// nothing can reach the plain AMQP listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_websockets() {
    if !sdk_installed() || !websocket_client_installed() {
        return;
    }
    let emulator = crate::support::emulator::emulator_with(
        "PT30S",
        sb_emulator::EmulatorOptions::default().with_websocket_listen("127.0.0.1:0"),
    )
    .await;
    let stdout = run_smoke(&[
        emulator.websocket_connection_string().unwrap(),
        emulator.websocket_addr().unwrap().to_string(),
    ])
    .await;
    assert!(stdout.contains("python sdk: ok (websockets)"), "{stdout}");
    assert_orders_settled(&emulator);
    emulator.shutdown().await;
}

/// Issue 29 item 15: the official Python SDK reaches the emulator's TLS listener with `amqps` and
/// with `TransportType.AmqpOverWebsocket` (`wss`), trusting the generated CA through
/// `connection_verify`, and sends and receives one message over each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_amqps_and_wss_trusting_the_generated_ca() {
    if !sdk_installed() || !websocket_client_installed() {
        return;
    }
    let dir = crate::tls::tls_dir("python");
    let emulator = crate::tls::tls_emulator(dir.clone()).await;
    let ca = emulator
        .tls_ca_file()
        .expect("the emulator generated its CA");
    let args = [
        emulator.tls_connection_string().unwrap(),
        ca.display().to_string(),
        "q".to_owned(),
    ];
    let stdout = run_script("python_tls.py", &args).await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["python sdk tls: ok (amqps)", "python sdk tls: ok (wss)"]
    );
    // Both were completed: nothing left active or locked.
    let counts = emulator.broker().entity("q").unwrap().counts();
    assert_eq!((counts.active, counts.locked), (0, 0));
    let _ = std::fs::remove_dir_all(dir);
}
