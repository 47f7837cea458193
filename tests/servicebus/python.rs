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
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/servicebus/sdk/python_smoke.py"
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

/// Issue 4's conformance suite: every case in `sdk/python_conformance.py` against one emulator
/// with the entities the cases need (`sdk/conformance.json`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_conformance() {
    if !sdk_installed() {
        return;
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/servicebus/sdk");
    let config = std::fs::read_to_string(format!("{dir}/conformance.json")).unwrap();
    let broker =
        sb_emulator::Broker::new(sb_emulator::Config::from_json(&config).unwrap()).unwrap();
    let emulator = sb_emulator::Emulator::start(broker, Default::default())
        .await
        .unwrap();
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(format!("{dir}/python_conformance.py"))
        .arg(emulator.connection_string())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.ends_with(")") && l.contains(": ok ("))
            .count(),
        23,
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
    let options = sb_emulator::EmulatorOptions {
        accept_jwt: true,
        ..Default::default()
    };
    let emulator = sb_emulator::Emulator::start(broker, options).await.unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/servicebus/sdk/python_samples.py"
    );
    let cache = concat!(env!("CARGO_TARGET_TMPDIR"), "/python-sdk-samples");
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(script)
        .arg(cache)
        .arg(emulator.local_addr().port().to_string())
        .arg(SAMPLE_SLOTS.to_string())
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
    // 37 of 7.15.0's 58 samples apply (8 of them with message sessions); the rest need the
    // HTTP management API, a proxy, a service principal, sleep past the timeout, or never exit.
    assert!(passed >= 37, "{stdout}");
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
