//! The worker: configuration (file + environment) and the replay-horizon guard.
//!
//! # Layout
//! - [`WorkerConfig`]: `worker.toml` with `SB_INBOX_*` environment overrides, validated as a
//!   whole so one run reports every mistake.
//! - [`ReplayHorizon`]: how long after processing a message can come back, and the check that
//!   dedupe retention covers it.
//! - [`Worker`]: hosts one or more consumers (each a [`ConsumerConfig`] and a handler) over one
//!   Service Bus client and one store, with the outbox relay, retention, health endpoints
//!   (readiness composed on a [`Readiness`]), telemetry and drain shared.
//! - [`run`]: the reference worker (`sb-inbox run`): it opens the store with retries ([`open`]),
//!   reporting [`Readiness`] on `/readyz` meanwhile, then hosts the inventory consumer in a
//!   [`Worker`] as `worker.toml` says.

mod config;
mod configured;
mod error;
mod health;
mod horizon;
mod host;
mod open;
#[cfg(feature = "app")]
mod run;

pub use config::{
    BrokerAddress, ConfigError, ConfigErrors, DEFAULT_ENV_PREFIX, ENV_VARS, KEYS, Key, MOVED,
    Moved, WorkerConfig,
};
pub use configured::ConfiguredWorker;
pub use error::{HostingError, WorkerError};
pub use health::{
    Condition, HealthResponse, PROBE_TIMEOUT, Ping, Readiness, STORE_EVIDENCE, store_ready,
};
pub use horizon::{DEFAULT_RESUBMIT_WINDOW, ReplayHorizon, RetentionTooShort};
pub use host::BACKGROUND_STOP;
pub use host::{ConsumerConfig, Worker, WorkerStats};
pub use open::OpenStore;
#[cfg(feature = "app")]
pub use run::{run, run_with};
