//! `[entity]`: what the worker must know of the Service Bus entity it consumes (its message
//! TTL, lock duration and max delivery count), as configured on the broker. They bound the
//! replay horizon and the lock margin. The worker reads the entity at start-up and refuses a
//! copy that disagrees (`worker::entity_check`); these are used as written only where the
//! management API cannot be reached.
//!
//! They sat under `[retention]` before; that place is still read, with a warning naming the new
//! key ([`super::keys::MOVED`]).

use std::time::Duration;

use serde::Deserialize;

use super::keys::{
    LOCK_DURATION_SECS, MAX_DELIVERY_COUNT, MESSAGE_TTL_SECS, OLD_LOCK_DURATION_SECS,
    OLD_MAX_DELIVERY_COUNT, OLD_MESSAGE_TTL_SECS,
};
use super::reader::Reader;
use super::retention::RetentionFile;

/// The `[entity]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EntityFile {
    message_ttl_secs: Option<u64>,
    lock_duration_secs: Option<u64>,
    max_delivery_count: Option<u64>,
}

/// The entity's settings, each `None` when not given (or refused).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct EntitySettings {
    /// `DefaultMessageTimeToLive`, in seconds.
    pub(super) message_ttl_secs: Option<u64>,
    /// `LockDuration`, in seconds.
    pub(super) lock_duration_secs: Option<u64>,
    /// `MaxDeliveryCount`.
    pub(super) max_delivery_count: Option<u64>,
}

impl EntitySettings {
    /// Reads `[entity]`, or each key's old place under `[retention]`.
    pub(super) fn read(r: &mut Reader<'_>, file: &EntityFile, old: &RetentionFile) -> Self {
        let message_ttl = r.moved(
            OLD_MESSAGE_TTL_SECS,
            file.message_ttl_secs,
            old.message_ttl_secs,
        );
        let lock_duration = r.moved(
            OLD_LOCK_DURATION_SECS,
            file.lock_duration_secs,
            old.lock_duration_secs,
        );
        let max_delivery = r.moved(
            OLD_MAX_DELIVERY_COUNT,
            file.max_delivery_count,
            old.max_delivery_count,
        );
        EntitySettings {
            message_ttl_secs: r.number(MESSAGE_TTL_SECS, message_ttl, 1..=u64::MAX),
            lock_duration_secs: r.number(LOCK_DURATION_SECS, lock_duration, 1..=300),
            max_delivery_count: r.number(MAX_DELIVERY_COUNT, max_delivery, 1..=2000),
        }
    }

    /// The lock duration the runtime checks its margin against.
    pub(super) fn lock_duration(&self) -> Option<Duration> {
        self.lock_duration_secs.map(Duration::from_secs)
    }
}
