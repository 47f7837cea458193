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
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/servicebus/sdk/python_smoke.py"
    );
    let output = tokio::process::Command::new("python3")
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
