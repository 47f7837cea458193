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
//! - [`until_open`] / [`check_schema`]: opening a store with retries while [`Readiness`]
//!   reports why on `/readyz`, and the schema check; [`serve_while`] serves the probes.
//!
//! The reference worker (`sb-inbox run`, the inventory consumer hosted as `worker.toml` says)
//! is built on these in the application crate, `sb-inbox-cli`.

mod config;
mod error;
mod health;
mod horizon;
mod host;
mod open;

pub use config::{
    BrokerAddress, ConfigError, ConfigErrors, ENV_VARS, KEYS, Key, MOVED, Moved, WorkerConfig,
};
pub use error::WorkerError;
pub use health::serve_while;
pub use health::{Condition, PROBE_TIMEOUT, Ping, Readiness, STORE_EVIDENCE, store_ready};
pub use horizon::{DEFAULT_RESUBMIT_WINDOW, ReplayHorizon, RetentionTooShort};
pub use host::BACKGROUND_STOP;
pub use host::{ConsumerConfig, Worker, WorkerStats};
pub use open::{Applied, check_schema, until_open};
