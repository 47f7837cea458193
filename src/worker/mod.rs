//! The worker: configuration (file + environment) and the replay-horizon guard.
//!
//! # Layout
//! - [`WorkerConfig`]: `worker.toml` with `SB_INBOX_*` environment overrides, validated as a
//!   whole so one run reports every mistake.
//! - [`ReplayHorizon`]: how long after processing a message can come back, and the check that
//!   dedupe retention covers it.
//! - [`run`]: the reference inventory consumer on Service Bus and the configured store; it
//!   opens the store with retries ([`open`]) and reports [`Readiness`] on `/readyz`.

mod config;
mod health;
mod horizon;
mod open;
mod run;

pub use config::{BrokerAddress, ConfigError, ConfigErrors, ENV_VARS, Retention, WorkerConfig};
pub use health::{Condition, PROBE_TIMEOUT, Ping, Readiness};
pub use horizon::{ReplayHorizon, RetentionTooShort};
pub use run::{BACKGROUND_STOP, WorkerError, run, run_with};
