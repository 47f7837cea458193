//! The official Python SDK (`azure-servicebus`) as an independent client of the emulator.

use std::process::Stdio;

use crate::emulator;

pub(crate) fn sdk_installed() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import azure.servicebus"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_sends_receives_and_settles() {
    if !sdk_installed() {
        println!("skipped: azure-servicebus is not installed (.ci/run installs it)");
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
    let output = tokio::process::Command::new("python3")
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
        println!("skipped: azure-servicebus is not installed (.ci/run installs it)");
        return;
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/servicebus/sdk");
    let config = std::fs::read_to_string(format!("{dir}/conformance.json")).unwrap();
    let broker =
        sb_emulator::Broker::new(sb_emulator::Config::from_json(&config).unwrap()).unwrap();
    let emulator = sb_emulator::Emulator::start(broker, Default::default())
        .await
        .unwrap();
    let output = tokio::process::Command::new("python3")
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
        15,
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
        "c-maxdc",
        "c-prefetch",
        "c-fields",
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

fn websocket_client_installed() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import websocket"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Issue 13, must show 4: the official Python SDK over `TransportType.AmqpOverWebsocket` against
/// the emulator's WebSocket listener. The connection string names only the WebSocket port, so
/// nothing can reach the plain AMQP listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_websockets() {
    if !sdk_installed() || !websocket_client_installed() {
        assert!(
            std::env::var("CI").is_err(),
            "azure-servicebus and websocket-client are required under CI"
        );
        println!(
            "skipped: azure-servicebus or websocket-client is not installed (.ci/run installs them)"
        );
        return;
    }
    let emulator = crate::emulator_with(
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
