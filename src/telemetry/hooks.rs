//! Metrics whose values another part of the worker owns (the outbox relay, retention): it
//! keeps the numbers, these observable instruments read them at each export.
//!
//! # Examples
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//! use sb_inbox::BacklogSample;
//! use sb_inbox::telemetry::hooks::{observe_outbox, observe_retention};
//!
//! let pending = Arc::new(AtomicU64::new(0));
//! let _outbox = observe_outbox(&["inventory.order-placed.v1"], {
//!     let pending = pending.clone();
//!     move || BacklogSample {
//!         pending: pending.load(Ordering::Relaxed),
//!         oldest_age: Duration::ZERO,
//!     }
//! });
//! let deleted = Arc::new(AtomicU64::new(0));
//! let _retention = observe_retention(&["inventory.order-placed.v1"], {
//!     let deleted = deleted.clone();
//!     move || deleted.load(Ordering::Relaxed)
//! });
//! ```

use opentelemetry::KeyValue;
use opentelemetry::metrics::{ObservableCounter, ObservableGauge};

use super::names::{attr, metric};
use crate::ports::BacklogSample;

/// The outbox gauges; they report while the meter provider lives.
#[derive(Debug)]
pub struct OutboxGauges {
    _backlog: ObservableGauge<u64>,
    _age: ObservableGauge<f64>,
}

/// The retention counter; it reports while the meter provider lives.
#[derive(Debug)]
pub struct RetentionCounter {
    _deleted: ObservableCounter<u64>,
}

/// Registers `sb_inbox.outbox.backlog` and `sb_inbox.outbox.age` for `consumers`, read from
/// `read` at each metric export (keep `read` cheap: it runs on the exporter's thread). A
/// worker's one relay serves all its consumers, so each gets the same reading under its own
/// `sb_inbox.consumer` (filter by consumer, or take the maximum; a sum across consumers counts
/// the same rows once per consumer).
pub fn observe_outbox(
    consumers: &[impl AsRef<str>],
    read: impl Fn() -> BacklogSample + Send + Sync + 'static,
) -> OutboxGauges {
    let meter = opentelemetry::global::meter("sb-inbox");
    let labels = labels(consumers);
    let read = std::sync::Arc::new(read);
    let backlog = meter
        .u64_observable_gauge(metric::OUTBOX_BACKLOG)
        .with_unit("{message}")
        .with_description("Outbox rows not yet relayed.")
        .with_callback({
            let (read, labels) = (read.clone(), labels.clone());
            move |gauge| {
                let pending = read().pending;
                for label in &labels {
                    gauge.observe(pending, label);
                }
            }
        })
        .build();
    let age = meter
        .f64_observable_gauge(metric::OUTBOX_AGE)
        .with_unit("s")
        .with_description("Age of the oldest outbox row not yet relayed.")
        .with_callback(move |gauge| {
            let age = read().oldest_age.as_secs_f64();
            for label in &labels {
                gauge.observe(age, label);
            }
        })
        .build();
    OutboxGauges {
        _backlog: backlog,
        _age: age,
    }
}

/// Registers `sb_inbox.retention.deleted` for `consumers`: `total` returns the running total
/// of inbox rows retention has deleted since start. One retention task serves the whole store,
/// so each consumer gets the same total under its own name (as [`observe_outbox`]).
pub fn observe_retention(
    consumers: &[impl AsRef<str>],
    total: impl Fn() -> u64 + Send + Sync + 'static,
) -> RetentionCounter {
    let labels = labels(consumers);
    let deleted = opentelemetry::global::meter("sb-inbox")
        .u64_observable_counter(metric::RETENTION_DELETED)
        .with_unit("{row}")
        .with_description("Inbox rows deleted by retention.")
        .with_callback(move |counter| {
            let total = total();
            for label in &labels {
                counter.observe(total, label);
            }
        })
        .build();
    RetentionCounter { _deleted: deleted }
}

/// One `sb_inbox.consumer` attribute set per consumer.
fn labels(consumers: &[impl AsRef<str>]) -> Vec<[KeyValue; 1]> {
    consumers
        .iter()
        .map(|c| [KeyValue::new(attr::CONSUMER, c.as_ref().to_owned())])
        .collect()
}
