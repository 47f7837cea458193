//! `[retention]`: how long inbox rows are kept and how they are deleted, checked against the
//! replay horizon the entity's settings and the retry policy give.

use std::time::Duration;

use super::entity::{EntitySettings, RetentionFile};
use super::keys::{
    DLQ_RESUBMIT_WINDOW_SECS, RETENTION_BATCH, RETENTION_INTERVAL_SECS, RETENTION_SECS,
};
use super::reader::{Reader, to_usize};
use crate::ports::MAX_ROWS_PER_STATEMENT;
use crate::retention::RetentionConfig;
use crate::worker::{DEFAULT_RESUBMIT_WINDOW, ReplayHorizon};

/// What `[retention]` gives: the task's settings when rows are to be deleted, and the replay
/// horizon when the entity's settings are known.
pub(super) struct RetentionSection {
    pub(super) retention: Option<RetentionConfig>,
    pub(super) horizon: Option<ReplayHorizon>,
    /// The DLQ resubmission window (part of the horizon the worker computes at start-up from
    /// the entity it reads).
    pub(super) dlq_window: Duration,
}

impl RetentionSection {
    /// Reads the section; a retention needs the entity's settings and must cover the horizon
    /// they give, lengthened by `retry_span`.
    pub(super) fn read(
        r: &mut Reader<'_>,
        file: &RetentionFile,
        entity: &EntitySettings,
        retry_span: Duration,
    ) -> Self {
        let retention = r.number(RETENTION_SECS, file.retention_secs, 1..=u64::from(u32::MAX));
        let dlq_window = r.number(
            DLQ_RESUBMIT_WINDOW_SECS,
            file.dlq_resubmit_window_secs,
            0..=u64::MAX,
        );
        let max_batch = MAX_ROWS_PER_STATEMENT as u64;
        let batch_size = r.number(RETENTION_BATCH, file.batch_size, 1..=max_batch);
        let interval = r.number(RETENTION_INTERVAL_SECS, file.interval_secs, 1..=86_400);
        let horizon = horizon(entity, retry_span, dlq_window);
        let dlq_resubmit_window = dlq_window.map_or(DEFAULT_RESUBMIT_WINDOW, Duration::from_secs);
        let Some(retention) = retention.map(Duration::from_secs) else {
            let without = format!("{RETENTION_SECS}: nothing is deleted");
            r.refuse_orphans(
                &[
                    (RETENTION_BATCH, batch_size.is_some()),
                    (RETENTION_INTERVAL_SECS, interval.is_some()),
                ],
                &without,
            );
            return RetentionSection {
                retention: None,
                horizon,
                dlq_window: dlq_resubmit_window,
            };
        };
        // Without all of `[entity]` the horizon comes from the entity the worker reads at
        // start-up (`worker::entity_check`), which refuses to start when it cannot know it.
        if let Some(Err(error)) = horizon.map(|horizon| horizon.check(retention)) {
            r.fail(RETENTION_SECS, error.to_string());
        }
        let mut config = RetentionConfig::new(retention);
        config.batch_size = batch_size.map_or(config.batch_size, to_usize);
        config.interval = interval.map_or(config.interval, Duration::from_secs);
        RetentionSection {
            retention: Some(config),
            horizon,
            dlq_window: dlq_resubmit_window,
        }
    }
}

/// The replay horizon, when the entity's TTL, lock duration and max delivery count are known.
fn horizon(
    entity: &EntitySettings,
    retry_span: Duration,
    dlq_window: Option<u64>,
) -> Option<ReplayHorizon> {
    let (Some(ttl), Some(lock), Some(max)) = (
        entity.message_ttl_secs,
        entity.lock_duration_secs,
        entity.max_delivery_count,
    ) else {
        return None;
    };
    Some(ReplayHorizon {
        message_ttl: Duration::from_secs(ttl),
        lock_duration: Duration::from_secs(lock),
        max_delivery_count: u32::try_from(max).unwrap_or(u32::MAX),
        retry_span,
        dlq_resubmit_window: dlq_window.map_or(DEFAULT_RESUBMIT_WINDOW, Duration::from_secs),
    })
}
