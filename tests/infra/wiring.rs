//! The templates, the docs and the image agree: every environment variable the worker reads is in
//! docs/deploy.md's table and (where the deployment sets it) in the container app, and the image
//! exposes the default health port.

use crate::{bicep, read};

/// Not always set in Azure: the emulator's connection string (never), the OTLP endpoint (only
/// without the managed agent, which injects its own), the metrics exporter (only to turn it
/// off), the export interval and log filter (defaults).
const NOT_ALWAYS_SET: [&str; 25] = [
    "SB_INBOX_SERVICEBUS_CONNECTION",
    // The envelope: the subject-versioned default unless the producers are MassTransit,
    // NServiceBus, CloudEvents or raw; set by hand (docs/envelopes.md, "Envelopes").
    "SB_INBOX_ENVELOPE",
    "SB_INBOX_ENVELOPE_TYPES",
    "SB_INBOX_ENVELOPE_CONTRACT",
    "SB_INBOX_ENVELOPE_CONTRACT_FROM",
    "SB_INBOX_ENVELOPE_VERSION_FROM",
    "SB_INBOX_ENVELOPE_ID_FROM",
    // Trust roots beside Mozilla's: only behind an inspecting proxy.
    "SB_INBOX_SERVICEBUS_CA_FILE",
    "SB_INBOX_SERVICEBUS_NATIVE_ROOTS",
    // The kill switch, the transient hold and the panic bound are on with their defaults; set
    // them by hand to tune.
    "SB_INBOX_MAX_PANICS",
    "SB_INBOX_TRANSIENT_HOLD_MAX_MS",
    "SB_INBOX_CIRCUIT_ENABLED",
    "SB_INBOX_CIRCUIT_CONSECUTIVE_FAILURES",
    "SB_INBOX_CIRCUIT_FAILURE_RATE_PERCENT",
    "SB_INBOX_CIRCUIT_WINDOW_SECS",
    "SB_INBOX_CIRCUIT_PROBE_MIN_MS",
    "SB_INBOX_CIRCUIT_PROBE_MAX_SECS",
    // Dead-lettering unknown contracts is the default; `complete` only for a subscription that
    // carries other teams' events.
    "SB_INBOX_UNKNOWN_CONTRACTS",
    // Defaults to AMQP over TCP; set it by hand where 5671 is blocked.
    "SB_INBOX_SERVICEBUS_TRANSPORT",
    // The SDKs' busy pause is the right default against the service; tests shorten it.
    "SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS",
    // The relay keeps order per session always; per destination only when asked
    // (docs/how-it-works.md, "Outbox relay and retention").
    "SB_INBOX_OUTBOX_ORDERED",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    // Only with the managed agent and no metrics destination (none).
    "OTEL_METRICS_EXPORTER",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "RUST_LOG",
];

/// The worker's own `SB_INBOX_*` overrides, the reference consumer's (the `sb-inbox` binary's,
/// not the library's), the Azure identity's client id and the OpenTelemetry variables
/// (`sb_inbox::telemetry::OTEL_ENV_VARS`).
fn names() -> impl Iterator<Item = &'static str> {
    sb_inbox::worker::ENV_VARS
        .iter()
        .map(|(name, _, _)| *name)
        .chain([sb_inbox_cli::run::OUTBOX_DESTINATION_VAR])
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

/// The managed agent without `agentMetricsOtlpEndpoint` has no metrics destination and refuses
/// the worker's metric exports every minute: the deployment turns the metric exporter off then,
/// as the worker reads its environment, and leaves it on wherever metrics have a destination.
#[test]
fn metrics_are_exported_only_where_they_have_a_destination() {
    use std::collections::BTreeMap;

    use crate::eval::Value;
    let telemetry = |overrides: &[(&str, &str)]| {
        let overrides: BTreeMap<String, Value> = overrides
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::Str((*v).to_owned())))
            .collect();
        let env = crate::deployment::worker_env(&overrides);
        sb_inbox::telemetry::TelemetryConfig::from_env(&|name: &str| env.get(name).cloned())
            .unwrap()
    };
    // The default: the collector app takes traces and metrics (M4).
    let default = telemetry(&[]);
    assert!(default.export_metrics, "the collector app takes metrics");
    assert_eq!(
        default.endpoint.as_deref(),
        Some("http://sbinbox-dev-otel:80")
    );
    let agent_only = {
        let overrides = BTreeMap::from([("metricsCollector".to_owned(), Value::Bool(false))]);
        let env = crate::deployment::worker_env(&overrides);
        sb_inbox::telemetry::TelemetryConfig::from_env(&|name: &str| env.get(name).cloned())
            .unwrap()
    };
    assert!(
        !agent_only.export_metrics,
        "managed agent, no metrics destination: metrics must not be exported"
    );
    assert!(
        telemetry(&[("agentMetricsOtlpEndpoint", "https://collector.example:4317")]).export_metrics
    );
    let direct = telemetry(&[("otlpEndpoint", "http://collector:4317")]);
    assert!(direct.export_metrics);
    assert_eq!(direct.endpoint.as_deref(), Some("http://collector:4317"));
}
