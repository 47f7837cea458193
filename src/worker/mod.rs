//! Hosting: the worker process around the runtime, for the service's own handlers.
//!
//! # Layout
//! - [`Worker`]: hosts one or more consumers (each a [`ConsumerConfig`] and a handler) over one
//!   Service Bus client and one store, with the outbox relay, retention (refused in
//!   [`Worker::run`] unless it covers the [`ReplayHorizon`]), health endpoints (readiness
//!   composed on a [`Readiness`]), telemetry and drain shared.
//! - [`Worker::from_config`] → [`ConfiguredWorker`]: the same from a [`WorkerConfig`], with the
//!   broker client built from it, health served from the start, and the store ([`OpenStore`])
//!   opened with backoff and its schema checked while `/readyz` says why not yet.
//! - [`WorkerConfig`]: a JSON file (`worker.toml` with the `toml` feature) with environment
//!   overrides (`SB_INBOX_*`, or another prefix), validated as a whole so one run reports every
//!   mistake.
//! - [`Readiness`]: named conditions and probes; [`Readiness::respond`] answers `/livez` and
//!   `/readyz` ([`HealthResponse`]) on the service's own router, the built-in server on a port.
//! - [`ReplayHorizon`]: how long after processing a message can come back, and the check that
//!   dedupe retention covers it.
//! - [`Worker::run_until_shutdown`], [`ConfiguredWorker::run_until_shutdown`] and
//!   [`shutdown_signal`]: the drain on SIGTERM and SIGINT.
//! - [`WorkerError`], [`HostingError`]: why the worker stopped or refused to start.
//!
//! The reference worker (`sb-inbox run`: the inventory consumer on a [`ConfiguredWorker`]) is
//! built on these in the application crate, `sb-inbox-cli`.

mod config;
mod configured;
mod consumer;
pub mod entity_check;
mod error;
mod health;
mod horizon;
mod host;
mod open;
mod signal;

pub use config::{
    BrokerAddress, ConfigError, ConfigErrors, DEFAULT_ENV_PREFIX, DeclaredEntity, ENV_VARS, KEYS,
    Key, MOVED, Moved, UnknownVariable, WorkerConfig,
};
pub use configured::ConfiguredWorker;
pub use consumer::ConsumerConfig;
pub use entity_check::{EntityCheckError, EntitySource, StartCheck};
pub use error::{HostingError, WorkerError};
pub use health::{
    Condition, HealthResponse, PROBE_TIMEOUT, Ping, Readiness, STORE_EVIDENCE, store_ready,
};
pub use horizon::{DEFAULT_RESUBMIT_WINDOW, ReplayHorizon, RetentionTooShort};
pub use host::BACKGROUND_STOP;
pub use host::{Worker, WorkerStats};
pub use open::OpenStore;
pub use signal::shutdown_signal;
