//! Telemetry: OpenTelemetry spans and metrics over OTLP, and log lines.
//!
//! # Layout
//! - [`names`]: every span, attribute and metric name (a leaf any layer may import; the
//!   dashboards are checked against it).
//! - [`propagation`]: the producer's trace context in application properties (`traceparent`,
//!   falling back to `Diagnostic-Id`) and stamping outgoing messages; the W3C format
//!   itself is `sb_servicebus::trace_context` (on the `opentelemetry` API, no SDK needed).
//! - [`cardinality`]: bounded label values for message-supplied labels.
//! - [`hooks`]: observable instruments fed by closures (outbox backlog and age, retention).
//! - `init` and `init_default` (feature `logs`): the binary's set-up: text or JSON logs, and with
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` (feature `otlp`) the OTLP/gRPC span and metric exporters.
//!
//! The runtime and the Service Bus client emit through `tracing` and the vendor-neutral
//! `opentelemetry` API only; without `init` (or without an endpoint) those are no-ops.

pub mod cardinality;
#[cfg(feature = "logs")]
mod export;
pub mod hooks;
pub mod names;
pub mod propagation;

#[cfg(feature = "logs")]
pub use export::{
    LogFormat, LogFormatError, OTEL_ENV_VARS, Telemetry, TelemetryConfig, TelemetryError, init,
    init_default,
};

// Telemetry's word for a settlement error, defined here rather than with the error in `ports`:
// the ports sit below telemetry and import nothing of its names.
impl crate::ports::SettleError {
    /// The bounded `error.type` telemetry reports for this error.
    pub fn error_type(&self) -> &'static str {
        use crate::ports::SettleError;
        match self {
            SettleError::LockLost => names::error::LOCK_LOST,
            SettleError::Transient(_) => names::error::TRANSIENT,
            SettleError::Permanent { .. } => names::error::REFUSED,
        }
    }
}
