//! The templates, the docs and the image agree: every environment variable the worker reads is in
//! docs/deploy.md's table and (where the deployment sets it) in the container app, and the image
//! exposes the default health port.

use std::path::Path;

use crate::bicep;

/// Not always set in Azure: the emulator's connection string (never), the OTLP endpoint (only
/// without the managed agent, which injects its own), the export interval and log filter
/// (defaults).
const NOT_ALWAYS_SET: [&str; 9] = [
    "SB_INBOX_SERVICEBUS_CONNECTION",
    // Session mode is opt-in and needs an entity with RequiresSession, which the templates do
    // not create yet.
    "SB_INBOX_SESSIONS",
    "SB_INBOX_MAX_SESSIONS",
    "SB_INBOX_SESSION_IDLE_SECS",
    // Defaults to AMQP over TCP; set it by hand where 5671 is blocked.
    "SB_INBOX_SERVICEBUS_TRANSPORT",
    // The SDKs' busy pause is the right default against the service; tests shorten it.
    "SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "RUST_LOG",
];

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The worker's own `SB_INBOX_*` overrides, the Azure identity's client id and the
/// OpenTelemetry variables (`sb_inbox::telemetry::OTEL_ENV_VARS`).
fn names() -> impl Iterator<Item = &'static str> {
    sb_inbox::worker::ENV_VARS
        .iter()
        .map(|(name, _, _)| *name)
        .chain(["AZURE_CLIENT_ID"])
        .chain(
            sb_inbox::telemetry::OTEL_ENV_VARS
                .iter()
                .map(|(name, _)| *name),
        )
}

#[test]
fn every_variable_is_in_the_docs_table() {
    let docs = read("docs/deploy.md");
    for name in names() {
        assert!(
            docs.contains(&format!("| `{name}` |")),
            "docs/deploy.md: no table row for {name}"
        );
    }
}

#[test]
fn the_container_app_sets_the_variables() {
    let app = read("infra/modules/containerapp.bicep");
    for name in names() {
        if NOT_ALWAYS_SET.contains(&name) {
            continue;
        }
        assert!(
            app.contains(&format!("name: '{name}'")),
            "containerapp.bicep does not set {name}"
        );
    }
    assert!(
        !app.contains("name: 'SB_INBOX_SERVICEBUS_CONNECTION'"),
        "the deployment authenticates with Entra, never a connection string"
    );
    // And sets nothing the docs do not describe.
    for line in app.lines().filter(|l| l.contains("name: 'SB_INBOX_")) {
        assert!(
            names().any(|n| line.contains(&format!("name: '{n}'"))),
            "undocumented variable: {line}"
        );
    }
}

#[test]
fn image_exposes_the_default_health_port() {
    let main = bicep::parse(&read("infra/main.bicep")).unwrap();
    let port = main
        .param("healthPort")
        .and_then(|p| p.int_default)
        .unwrap();
    let dockerfile = read("Dockerfile");
    assert!(
        dockerfile.contains(&format!("EXPOSE {port}")),
        "Dockerfile: EXPOSE {port}"
    );
    assert!(dockerfile.contains(&format!("SB_INBOX_HEALTH_PORT={port}")));
}
