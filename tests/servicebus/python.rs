//! The official Python SDK (`azure-servicebus`) as an independent client of the emulator.

use crate::emulator;

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
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/servicebus/sdk/python_smoke.py"
    );
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(script)
        .arg(emulator.connection_string())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("python sdk: ok"), "{stdout}");
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
