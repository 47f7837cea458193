//! The official JavaScript SDK (`@azure/service-bus`, pinned in `sdk/js/package.json`) as an
//! independent client of the emulator. `.ci/run` installs it with `npm ci`.

use std::path::Path;

use crate::support::emulator::emulator;

// This binary is a target of sb-inbox-cli (crates/cli): the repository is two levels up.
pub(crate) const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/servicebus/sdk/js");

/// Whether `npm ci` installed the SDK; says `skipped` (fails under CI=true) when not.
pub(crate) fn sdk_installed() -> bool {
    let installed = Path::new(DIR)
        .join("node_modules/@azure/service-bus")
        .is_dir();
    sb_testkit::require(sb_testkit::JS_SDK, installed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_sends_receives_settles_and_renews() {
    if !sdk_installed() {
        return;
    }
    let emulator = emulator("PT30S").await;
    let stdout = node("smoke.mjs", &emulator).await;
    assert_eq!(stdout.lines().last(), Some("js sdk: ok"), "{stdout}");
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!(
        (counts.active, counts.locked, counts.dead_lettered),
        (0, 0, 0)
    );
    emulator.shutdown().await;
}

/// Issue 21: the flows of the SDK's own v7 samples, each from a fresh client (`sdk/js/management.mjs`):
/// peek and schedule + cancel whose first link is `<queue>/$management` (the SDK's token is for
/// that node alone), the rule manager's add/list/remove over AMQP, deferral, dead-letter and
/// resubmit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_management_flows_from_fresh_clients() {
    if !sdk_installed() {
        return;
    }
    let config = sb_emulator::Config::new("sbemulatorns")
        .with_queue(sb_emulator::QueueConfig::new("mgmt-q"))
        .with_topic(
            sb_emulator::TopicConfig::new("mgmt-t")
                .with_subscription(sb_emulator::SubscriptionConfig::new("mgmt-s")),
        );
    let broker = sb_emulator::Broker::new(config).unwrap();
    let emulator = sb_emulator::Emulator::start(broker, Default::default())
        .await
        .unwrap();
    let stdout = node("management.mjs", &emulator).await;
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with(": ok")).count(),
        7,
        "{stdout}"
    );
    assert_eq!(stdout.lines().last(), Some("js management: ok"), "{stdout}");
    let rules = emulator
        .broker()
        .entity("mgmt-t/Subscriptions/mgmt-s")
        .unwrap()
        .rules()
        .unwrap();
    assert_eq!(
        rules
            .iter()
            .map(|(r, _)| r.name.as_str())
            .collect::<Vec<_>>(),
        ["$Default"]
    );
    let counts = emulator.broker().entity("mgmt-q").unwrap().counts();
    assert_eq!(
        (
            counts.active,
            counts.locked,
            counts.deferred,
            counts.scheduled,
            counts.dead_lettered
        ),
        (0, 0, 0, 0, 0)
    );
    emulator.shutdown().await;
}

/// Issue 33, must show 1: the SDK's `ServiceBusAdministrationClient` against the emulator's
/// HTTPS management API on its TLS listener, trusting the generated CA through
/// `NODE_EXTRA_CA_CERTS` (`sdk/js/admin.mjs`): the flows of the v7 samples
/// administrationClient, listingEntities, ruleManager and
/// topicSubscriptionWithRuleOperationsSample. Entities created over HTTPS are used over AMQP at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_administration_client_over_https() {
    if !sdk_installed() {
        return;
    }
    let dir = crate::tls::tls_dir("js-admin");
    let emulator = crate::tls::tls_emulator(dir.clone()).await;
    let ca = emulator.tls_ca_file().expect("a generated CA").to_owned();
    let stdout = node_with(
        "admin.mjs",
        &[
            emulator.tls_connection_string().unwrap(),
            emulator.connection_string(),
        ],
        &[("NODE_EXTRA_CA_CERTS", ca.display().to_string())],
    )
    .await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "administrationClient: ok",
            "listingEntities: ok",
            "ruleManager: ok",
            "topicSubscriptionWithRuleOperations: ok",
            "js admin: ok"
        ]
    );
    // Everything the flows created they deleted again: only the configured queue is left.
    let left: Vec<String> = emulator
        .broker()
        .entity_paths()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(left, ["q"]);
    emulator.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The 7.10 beta of the SDK (`sdk/js-beta`, installed by `.ci/setup`).
const BETA_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/servicebus/sdk/js-beta"
);

/// Issue 33, must show 2: the SDK 7.10 beta's `deleteMessages` (at most `maxMessageCount`,
/// oldest first, only before `beforeEnqueueTime`) and `purgeMessages` (batches of 500 until
/// fewer come back) over `com.microsoft:batch-delete-messages` (`sdk/js-beta/delete.mjs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_beta_deletes_and_purges_messages() {
    let installed = Path::new(BETA_DIR)
        .join("node_modules/@azure/service-bus")
        .is_dir();
    if !sb_testkit::require(sb_testkit::JS_SDK, installed) {
        return;
    }
    let emulator = emulator("PT30S").await;
    let output = tokio::process::Command::new("node")
        .arg(format!("{BETA_DIR}/delete.mjs"))
        .arg(emulator.connection_string())
        .arg("orders")
        .current_dir(BETA_DIR)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "deleteMessages maxMessageCount: ok",
            "deleteMessages beforeEnqueueTime: ok",
            "purgeMessages: ok",
            "js batch delete: ok"
        ]
    );
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!(
        (counts.active, counts.sent, counts.completed),
        (0, 607, 607)
    );
    emulator.shutdown().await;
}

/// Runs `sdk/js/<script>` against `emulator`; asserts it exited 0 and returns its stdout.
async fn node(script: &str, emulator: &sb_emulator::Emulator) -> String {
    node_with(script, &[emulator.connection_string()], &[]).await
}

/// Runs `sdk/js/<script> ARGS` with `env` added; asserts it exited 0 and returns its stdout.
async fn node_with(script: &str, args: &[String], env: &[(&str, String)]) -> String {
    let output = tokio::process::Command::new("node")
        .arg(format!("{DIR}/{script}"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(DIR)
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
    stdout
}

/// Issue 17: the SDK's session receivers (`sdk/js/sessions.mjs`): `acceptNextSession` round
/// trip over two sessions in order, `acceptSession` with state and a renewed lock, a second
/// `acceptSession` refused while the session is locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_session_receivers() {
    if !sdk_installed() {
        return;
    }
    let config = sb_emulator::Config::new("sbemulatorns").with_queue(
        sb_emulator::QueueConfig::new("sessions").with_properties(sb_emulator::EntityProperties {
            requires_session: true,
            ..Default::default()
        }),
    );
    let broker = sb_emulator::Broker::new(config).unwrap();
    let emulator = sb_emulator::Emulator::start(broker, Default::default())
        .await
        .unwrap();
    let stdout = node("sessions.mjs", &emulator).await;
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with(": ok")).count(),
        4,
        "{stdout}"
    );
    assert_eq!(stdout.lines().last(), Some("js sessions: ok"), "{stdout}");
    let counts = emulator.broker().entity("sessions").unwrap().counts();
    assert_eq!((counts.active, counts.locked), (0, 0));
    emulator.shutdown().await;
}
