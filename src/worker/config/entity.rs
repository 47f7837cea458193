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
use crate::worker::ReplayHorizon;

/// The `[retention]` section as written, with the entity keys' old places. Here, not in
/// `retention.rs`: `[entity]` reads its old places from it, and retention reads the entity's
/// settings, so the section sits below both.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetentionFile {
    pub(super) retention_secs: Option<u64>,
    pub(super) dlq_resubmit_window_secs: Option<u64>,
    pub(super) batch_size: Option<u64>,
    pub(super) interval_secs: Option<u64>,
    /// Moved to `entity.message_ttl_secs`.
    pub(super) message_ttl_secs: Option<u64>,
    /// Moved to `entity.lock_duration_secs`.
    pub(super) lock_duration_secs: Option<u64>,
    /// Moved to `entity.max_delivery_count`.
    pub(super) max_delivery_count: Option<u64>,
}

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

/// What the configuration says of the entity (`[entity]`, each `None` when not given) and the
/// parts of the replay horizon that do not come from the entity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeclaredEntity {
    /// `entity.message_ttl_secs`.
    pub message_ttl: Option<Duration>,
    /// `entity.lock_duration_secs`.
    pub lock_duration: Option<Duration>,
    /// `entity.max_delivery_count`.
    pub max_delivery_count: Option<u32>,
    /// Delayed retries: max retries × max delay.
    pub retry_span: Duration,
    /// The DLQ resubmission window.
    pub dlq_resubmit_window: Duration,
}

impl DeclaredEntity {
    /// The horizon `[entity]` alone gives, when it names all three settings.
    pub fn horizon(&self) -> Option<ReplayHorizon> {
        Some(ReplayHorizon {
            message_ttl: self.message_ttl?,
            lock_duration: self.lock_duration?,
            max_delivery_count: self.max_delivery_count?,
            retry_span: self.retry_span,
            dlq_resubmit_window: self.dlq_resubmit_window,
        })
    }
}

impl EntitySettings {
    /// What these settings declare of the entity, with the horizon's parts that do not come
    /// from it, for the start-up check against the entity's real settings.
    pub(super) fn declared(
        &self,
        retry_span: Duration,
        dlq_resubmit_window: Duration,
    ) -> DeclaredEntity {
        DeclaredEntity {
            message_ttl: self.message_ttl_secs.map(Duration::from_secs),
            lock_duration: self.lock_duration(),
            max_delivery_count: self.max_delivery_count.and_then(|n| u32::try_from(n).ok()),
            retry_span,
            dlq_resubmit_window,
        }
    }
}
