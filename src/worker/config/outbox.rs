//! `[outbox]`: how the relay drains the outbox.

use std::time::Duration;

use serde::Deserialize;

use super::keys::{OUTBOX_BATCH, OUTBOX_LEASE_SECS, OUTBOX_ORDERED, OUTBOX_POLL_MS};
use super::reader::{Reader, to_usize};
use crate::relay::RelayConfig;

/// The `[outbox]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OutboxFile {
    // The reference consumer's old key: still parsed, so that a file carrying it is refused
    // with where it went, not with serde's bare "unknown field".
    destination: Option<serde::de::IgnoredAny>,
    batch_size: Option<u64>,
    poll_interval_ms: Option<u64>,
    lease_secs: Option<u64>,
    ordered: Option<bool>,
}

/// Refuses `outbox.destination`: it named where the reference consumer's events go, which is
/// no setting of the library (each [`crate::OutboxMessage`] names its own destination).
pub(super) fn refuse_destination(r: &mut Reader<'_>, file: &OutboxFile) {
    if file.destination.is_some() {
        // Verbatim: the variable named is the `sb-inbox` binary's own, whatever prefix the
        // caller reads the library's keys under.
        r.fail_verbatim(
            "outbox.destination".to_owned(),
            "is no longer read: it was the reference consumer's setting and moved to the \
             `sb-inbox` binary (`sb-inbox run` reads SB_INBOX_OUTBOX_DESTINATION); a service \
             sets each outbox row's destination in its handler (`OutboxMessage::destination`)",
        );
    }
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
