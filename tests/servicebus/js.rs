//! The official JavaScript SDK (`@azure/service-bus`, pinned in `sdk/js/package.json`) as an
//! independent client of the emulator. `.ci/run` installs it with `npm ci`.

use std::path::Path;

use crate::emulator;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_sends_receives_settles_and_renews() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/servicebus/sdk/js");
    let installed = Path::new(dir)
        .join("node_modules/@azure/service-bus")
        .is_dir();
    if !sb_testkit::require(sb_testkit::JS_SDK, installed) {
        return;
    }
    let emulator = emulator("PT30S").await;
    let output = tokio::process::Command::new("node")
        .arg(format!("{dir}/smoke.mjs"))
        .arg(emulator.connection_string())
        .current_dir(dir)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(stdout.lines().last(), Some("js sdk: ok"), "{stdout}");
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!(
        (counts.active, counts.locked, counts.dead_lettered),
        (0, 0, 0)
    );
    emulator.shutdown().await;
}
