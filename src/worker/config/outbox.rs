//! `[outbox]`: where the consumer's events go and how the relay drains the outbox to them.

use std::time::Duration;

use serde::Deserialize;

use super::keys::{
    OUTBOX_BATCH, OUTBOX_DESTINATION, OUTBOX_LEASE_SECS, OUTBOX_ORDERED, OUTBOX_POLL_MS,
};
use super::reader::{Reader, to_usize};
use crate::relay::RelayConfig;

/// The `[outbox]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OutboxFile {
    destination: Option<String>,
    batch_size: Option<u64>,
    poll_interval_ms: Option<u64>,
    lease_secs: Option<u64>,
    ordered: Option<bool>,
}

/// `outbox.destination`: none means the consumer writes no events.
pub(super) fn destination(r: &mut Reader<'_>, file: &OutboxFile) -> Option<String> {
    r.text(OUTBOX_DESTINATION, file.destination.clone())
}

/// The relay's settings, each with [`RelayConfig::default`]'s value when not given.
pub(super) fn relay(r: &mut Reader<'_>, file: &OutboxFile) -> RelayConfig {
    let defaults = RelayConfig::default();
    RelayConfig {
        batch_size: r
            .number(OUTBOX_BATCH, file.batch_size, 1..=1000)
            .map_or(defaults.batch_size, to_usize),
        poll_interval: r
            .number(OUTBOX_POLL_MS, file.poll_interval_ms, 10..=60_000)
            .map_or(defaults.poll_interval, Duration::from_millis),
        lease: r
            .number(OUTBOX_LEASE_SECS, file.lease_secs, 5..=3600)
            .map_or(defaults.lease, Duration::from_secs),
        ordered: r
            .flag(OUTBOX_ORDERED, file.ordered)
            .unwrap_or(defaults.ordered),
        ..defaults
    }
}
