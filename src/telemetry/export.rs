//! Process-wide set-up: logs to stderr (text or JSON) and, when an OTLP endpoint is configured,
//! spans and metrics over OTLP/gRPC (feature `otlp`; a build without it refuses an endpoint).

use std::time::Duration;

#[cfg(feature = "otlp")]
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
#[cfg(feature = "otlp")]
use opentelemetry_otlp::WithExportConfig as _;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::Resource;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::metrics::PeriodicReader;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The environment variables telemetry reads, with their meaning (for `--help` and the docs).
pub const OTEL_ENV_VARS: &[(&str, &str)] = &[
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTLP/gRPC endpoint (http://HOST:4317); unset = no export, logs only",
    ),
    (
        "OTEL_SERVICE_NAME",
        "service.name of spans and metrics (default sb-inbox)",
    ),
    (
        "OTEL_RESOURCE_ATTRIBUTES",
        "more resource attributes: key=value,key=value",
    ),
    (
        "OTEL_METRICS_EXPORTER",
        "otlp (default) or none: no metric export while spans still go to the endpoint",
    ),
    (
        "OTEL_METRIC_EXPORT_INTERVAL",
        "milliseconds between metric exports (default 60000)",
    ),
    (
        "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
        "cumulative (default; Prometheus) or delta (Azure Monitor)",
    ),
    (
        "RUST_LOG",
        "log filter, e.g. info or sb_inbox=debug (default info)",
    ),
];

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// An unknown `--log-format`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format {0:?}: expected text or json")]
pub struct LogFormatError(String);

impl std::str::FromStr for LogFormat {
    type Err = LogFormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(LogFormatError(other.to_owned())),
        }
    }
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The OTLP exporter rejected its configuration (e.g. an invalid or `https` endpoint).
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// `OTEL_RESOURCE_ATTRIBUTES` is not `key=value,…`.
    #[error("OTEL_RESOURCE_ATTRIBUTES: {0}")]
    ResourceAttributes(String),
    /// A global subscriber was installed already.
    #[error("a tracing subscriber is installed already")]
    AlreadyInstalled,
}

/// What [`init`] sets up.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// Log line format.
    pub log_format: LogFormat,
    /// The `RUST_LOG`-style filter of log lines.
    pub log_filter: String,
    /// The OTLP/gRPC endpoint; `None` = no exporter.
    pub endpoint: Option<String>,
    /// `service.name`.
    pub service_name: String,
    /// More resource attributes.
    pub resource_attributes: Vec<(String, String)>,
    /// Time between metric exports.
    pub metric_interval: Duration,
    /// Metrics go to the endpoint too; false with `OTEL_METRICS_EXPORTER=none`, for a
    /// collector that takes spans but has no metrics destination (the Container Apps agent
    /// without one) and would refuse every export.
    pub export_metrics: bool,
}

impl TelemetryConfig {
    /// Text logs at `info`, no exporter, service name `sb-inbox`, metrics every 60 s.
    pub fn new() -> Self {
        TelemetryConfig {
            log_format: LogFormat::Text,
            log_filter: "info".to_owned(),
            endpoint: None,
            service_name: "sb-inbox".to_owned(),
            resource_attributes: Vec::new(),
            metric_interval: Duration::from_secs(60),
            export_metrics: true,
        }
    }

    /// Reads the standard variables through `env` (the process environment in the binary).
    ///
    /// # Errors
    /// [`TelemetryError::ResourceAttributes`] for a malformed `OTEL_RESOURCE_ATTRIBUTES`;
    /// [`TelemetryError::Exporter`] for a bad `OTEL_METRIC_EXPORT_INTERVAL` or an
    /// `OTEL_METRICS_EXPORTER` other than `otlp` or `none`.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, TelemetryError> {
        let present = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let mut config = TelemetryConfig::new();
        config.endpoint = present("OTEL_EXPORTER_OTLP_ENDPOINT");
        if let Some(name) = present("OTEL_SERVICE_NAME") {
            config.service_name = name;
        }
        if let Some(attributes) = present("OTEL_RESOURCE_ATTRIBUTES") {
            config.resource_attributes = parse_resource_attributes(&attributes)?;
        }
        if let Some(filter) = present("RUST_LOG") {
            config.log_filter = filter;
        }
        if let Some(ms) = present("OTEL_METRIC_EXPORT_INTERVAL") {
            let ms: u64 = ms.trim().parse().map_err(|_| {
                TelemetryError::Exporter(format!(
                    "OTEL_METRIC_EXPORT_INTERVAL {ms:?} is not a number of milliseconds"
                ))
            })?;
            config.metric_interval = Duration::from_millis(ms.max(1));
        }
        // The SDK environment variable specification's exporter selection; only the values this
        // binary can honour are accepted, anything else is refused rather than ignored.
        // https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/#exporter-selection
        if let Some(exporter) = present("OTEL_METRICS_EXPORTER") {
            config.export_metrics = match exporter.trim() {
                "otlp" => true,
                "none" => false,
                other => {
                    return Err(TelemetryError::Exporter(format!(
                        "OTEL_METRICS_EXPORTER {other:?}: expected otlp or none"
                    )));
                }
            };
        }
        Ok(config)
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig::new()
    }
}

/// `key=value,key=value` with percent-encoded values, as the OpenTelemetry specification writes
/// `OTEL_RESOURCE_ATTRIBUTES`.
fn parse_resource_attributes(text: &str) -> Result<Vec<(String, String)>, TelemetryError> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                TelemetryError::ResourceAttributes(format!("{pair:?} is not key=value"))
            })?;
            let key = key.trim();
            if key.is_empty() {
                return Err(TelemetryError::ResourceAttributes(format!(
                    "{pair:?} has an empty key"
                )));
            }
            let value = percent_encoding::percent_decode_str(value.trim())
                .decode_utf8()
                .map_err(|e| TelemetryError::ResourceAttributes(format!("{pair:?}: {e}")))?;
            Ok((key.to_owned(), value.into_owned()))
        })
        .collect()
}

/// Keeps the exporters alive; flush before exit with [`Telemetry::shutdown`].
#[derive(Debug)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// True when spans and metrics are exported.
    pub fn exporting(&self) -> bool {
        self.tracer.is_some()
    }

    /// Exports every finished span and the current metric values now. Blocks the calling
    /// thread until the collector answered (call it from `spawn_blocking` on a runtime).
    ///
    /// # Errors
    /// [`TelemetryError::Exporter`] when an export failed.
    pub fn flush(&self) -> Result<(), TelemetryError> {
        if let Some(tracer) = &self.tracer {
            tracer
                .force_flush()
                .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        }
        if let Some(meter) = &self.meter {
            meter
                .force_flush()
                .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        }
        Ok(())
    }

    /// Flushes and stops the exporters. Blocks like [`Telemetry::flush`].
    pub fn shutdown(self) {
        if let Some(tracer) = &self.tracer
            && let Err(error) = tracer.shutdown()
        {
            tracing::warn!(%error, "Span exporter shutdown failed.");
        }
        if let Some(meter) = &self.meter
            && let Err(error) = meter.shutdown()
        {
            tracing::warn!(%error, "Metric exporter shutdown failed.");
        }
    }
}

/// The targets whose spans are exported: ours and the Service Bus client's (its receive,
/// settle and send spans), not the AMQP engine's or the emulator's.
fn exported_targets() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_target("sb_inbox", tracing::Level::INFO)
        .with_target("sb_servicebus", tracing::Level::INFO)
}

/// Installs the global tracing subscriber (log lines on stderr, filtered by
/// [`TelemetryConfig::log_filter`]) and, with an endpoint, the OTLP span and metric exporters
/// and the global meter provider. Must run inside a Tokio runtime (the gRPC channel lives
/// there), before any runtime or client is created (instruments bind to the provider present
/// when they are made).
///
/// # Errors
/// [`TelemetryError`] when the exporter cannot be built or a subscriber exists already.
pub fn init(config: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let exporting = match &config.endpoint {
        Some(endpoint)
            if endpoint
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("https:") =>
        {
            return Err(TelemetryError::Exporter(format!(
                "{endpoint}: this build exports OTLP/gRPC over plain HTTP/2 only; point \
                 OTEL_EXPORTER_OTLP_ENDPOINT at http://HOST:4317 (the Container Apps agent or a \
                 collector beside the worker)"
            )));
        }
        Some(endpoint) => Some(providers(config, endpoint)?),
        None => None,
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = match config.log_format {
        // Colour codes only for a person at a terminal: in a file or a log collector they are
        // noise inside every field.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(filter);
    let spans = exporting.as_ref().map(|(tracer, _)| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer.tracer("sb-inbox"))
            .with_filter(exported_targets())
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    let (tracer, meter) = match exporting {
        Some((tracer, meter)) => {
            opentelemetry::global::set_tracer_provider(tracer.clone());
            if let Some(meter) = &meter {
                opentelemetry::global::set_meter_provider(meter.clone());
            }
            (Some(tracer), meter)
        }
        None => (None, None),
    };
    Ok(Telemetry { tracer, meter })
}

/// The common set-up in one call: [`TelemetryConfig::from_env`] on the process environment
/// (`RUST_LOG`, `OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_ENDPOINT`, …: see [`OTEL_ENV_VARS`]),
/// then [`init`]. Text logs at `info` on stderr when none is set. Keep the returned
/// [`Telemetry`] alive while the service runs and call [`Telemetry::shutdown`] before exit.
///
/// # Errors
/// As [`TelemetryConfig::from_env`] and [`init`].
///
/// # Examples
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let telemetry = sb_inbox::telemetry::init_default()?;
/// // … run the worker …
/// tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
/// # Ok(()) }
/// ```
pub fn init_default() -> Result<Telemetry, TelemetryError> {
    init(&TelemetryConfig::from_env(&|name| {
        std::env::var(name).ok()
    })?)
}

/// The span pipeline and, unless metrics are off, the metric pipeline to the OTLP/gRPC
/// collector at `endpoint`.
#[cfg(feature = "otlp")]
fn providers(
    config: &TelemetryConfig,
    endpoint: &str,
) -> Result<(SdkTracerProvider, Option<SdkMeterProvider>), TelemetryError> {
    let resource = Resource::builder_empty()
        .with_attributes(
            config
                .resource_attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .with_service_name(config.service_name.clone())
        .build();
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .with_resource(resource.clone())
        .build();
    if !config.export_metrics {
        return Ok((tracer, None));
    }
    let metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let reader = PeriodicReader::builder(metrics)
        .with_interval(config.metric_interval)
        .build();
    let meter = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build();
    Ok((tracer, Some(meter)))
}

/// Built without `otlp`: an endpoint is a configuration this binary cannot honour, refused at
/// start-up rather than ignored (which would silently lose every span and metric).
#[cfg(not(feature = "otlp"))]
fn providers(
    _config: &TelemetryConfig,
    endpoint: &str,
) -> Result<(SdkTracerProvider, Option<SdkMeterProvider>), TelemetryError> {
    Err(TelemetryError::Exporter(format!(
        "{endpoint}: this build has no OTLP exporter; rebuild with the `otlp` cargo feature or \
         unset OTEL_EXPORTER_OTLP_ENDPOINT"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_standard_variables() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4317".to_owned()),
            "OTEL_SERVICE_NAME" => Some("inventory".to_owned()),
            "OTEL_RESOURCE_ATTRIBUTES" => {
                Some("service.namespace=shop, deployment.environment.name=prod%2Ceu".to_owned())
            }
            "OTEL_METRIC_EXPORT_INTERVAL" => Some("5000".to_owned()),
            _ => None,
        };
        let config = TelemetryConfig::from_env(&env).unwrap();
        assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert_eq!(config.service_name, "inventory");
        assert_eq!(
            config.resource_attributes,
            [
                ("service.namespace".to_owned(), "shop".to_owned()),
                (
                    "deployment.environment.name".to_owned(),
                    "prod,eu".to_owned()
                )
            ]
        );
        assert_eq!(config.metric_interval, Duration::from_secs(5));
    }

    #[test]
    fn no_endpoint_means_no_exporter() {
        let config = TelemetryConfig::from_env(&|name: &str| {
            (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| " ".to_owned())
        })
        .unwrap();
        assert_eq!(config.endpoint, None);
        assert_eq!(config.service_name, "sb-inbox");
    }

    #[test]
    fn metrics_export_can_be_turned_off() {
        let with = |value: &'static str| {
            TelemetryConfig::from_env(&move |name: &str| {
                (name == "OTEL_METRICS_EXPORTER").then(|| value.to_owned())
            })
        };
        assert!(
            TelemetryConfig::from_env(&|_: &str| None)
                .unwrap()
                .export_metrics
        );
        assert!(with("otlp").unwrap().export_metrics);
        assert!(!with("none").unwrap().export_metrics);
        let error = with("prometheus").unwrap_err();
        assert!(
            error.to_string().contains("expected otlp or none"),
            "{error}"
        );
    }

    #[test]
    fn malformed_resource_attributes_are_an_error() {
        let env = |name: &str| (name == "OTEL_RESOURCE_ATTRIBUTES").then(|| "novalue".to_owned());
        let error = TelemetryConfig::from_env(&env).unwrap_err();
        assert!(error.to_string().contains("not key=value"), "{error}");
    }

    #[test]
    fn log_formats_parse() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
