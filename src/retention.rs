//! Dedupe retention: deletes inbox rows (and dispatched outbox rows) older than the configured
//! retention, in small batches beside the consumers.
//!
//! Each batch is one short statement of the store's own ([`RetentionStore`]): at most
//! [`MAX_ROWS_PER_STATEMENT`] rows, rows locked by others skipped, so consumers never wait long
//! and SQL Server never escalates to a table lock. A sweep deletes batch after batch until one comes
//! back short, then the task sleeps for the interval. The retention must cover the replay
//! horizon; the worker checks that before it starts ([`crate::worker::ReplayHorizon`]).
//! Aggregate versions and business keys are never deleted (see [`RetentionStore`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ports::{MAX_ROWS_PER_STATEMENT, RetentionStore, StoreError};
use crate::runtime::Clock;

/// How a [`RetentionTask`] runs: [`RetentionConfig::new`] and the `with_*` methods;
/// deserialisable with the `serde` feature (`retention` required, the rest defaulted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(from = "RetentionFields")
)]
pub struct RetentionConfig {
    /// Rows processed (or dispatched) longer ago than this are deleted.
    pub retention: Duration,
    /// Rows per delete statement (clamped to 1..=[`MAX_ROWS_PER_STATEMENT`]).
    pub batch_size: usize,
    /// Time between sweeps.
    pub interval: Duration,
    /// Pause between two batches of one sweep, leaving the database to the consumers.
    pub pause: Duration,
}

impl RetentionConfig {
    /// Batches of 1000, a sweep every 5 minutes, no pause between batches.
    pub fn new(retention: Duration) -> Self {
        RetentionConfig {
            retention,
            batch_size: 1000,
            interval: Duration::from_secs(300),
            pause: Duration::ZERO,
        }
    }

    /// Rows per delete statement.
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Time between sweeps.
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Pause between two batches of one sweep.
    #[must_use]
    pub fn with_pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    fn batch(&self) -> usize {
        self.batch_size.clamp(1, MAX_ROWS_PER_STATEMENT)
    }
}

/// Counters of a [`RetentionTask`], readable at any time.
#[derive(Debug, Default)]
pub struct RetentionStats {
    inbox_deleted: AtomicU64,
    outbox_deleted: AtomicU64,
    batches: AtomicU64,
    sweeps: AtomicU64,
    failures: AtomicU64,
}

/// A snapshot of [`RetentionStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionStatsSnapshot {
    /// Inbox rows deleted.
    pub inbox_deleted: u64,
    /// Dispatched outbox rows deleted.
    pub outbox_deleted: u64,
    /// Delete statements run.
    pub batches: u64,
    /// Sweeps completed.
    pub sweeps: u64,
    /// Sweeps that stopped on a store error.
    pub failures: u64,
}

impl RetentionStats {
    /// The counters now.
    pub fn snapshot(&self) -> RetentionStatsSnapshot {
        RetentionStatsSnapshot {
            inbox_deleted: self.inbox_deleted.load(Ordering::Relaxed),
            outbox_deleted: self.outbox_deleted.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            sweeps: self.sweeps.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }
}

/// What one sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sweep {
    /// Inbox rows deleted.
    pub inbox_deleted: u64,
    /// Dispatched outbox rows deleted.
    pub outbox_deleted: u64,
    /// Delete statements run.
    pub batches: u64,
}

/// The retention task over one store.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::{Duration, SystemTime};
/// use sb_inbox::retention::{RetentionConfig, RetentionTask};
/// use sb_inbox::{Clock, SqliteStore, Store, StoreTx};
///
/// let store = SqliteStore::open_in_memory()?;
/// store.migrate().await?;
/// let mut tx = store.begin().await?;
/// tx.insert_inbox("inventory", "m-1").await?;
/// tx.commit().await?;
///
/// // Inbox rows age on the database's clock: a worker clock 31 days ahead deletes nothing
/// // inside a 30-day retention.
/// let later = Clock::starting_at(SystemTime::now() + Duration::from_secs(31 * 86_400));
/// let month = RetentionConfig::new(Duration::from_secs(30 * 86_400));
/// let task = RetentionTask::with_clock(store, month, later);
/// assert_eq!(task.sweep(&Default::default()).await?.inbox_deleted, 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RetentionTask<S> {
    store: S,
    config: RetentionConfig,
    clock: Clock,
    stats: Arc<RetentionStats>,
}

impl<S: RetentionStore> RetentionTask<S> {
    /// A task on the real clock.
    pub fn new(store: S, config: RetentionConfig) -> Self {
        RetentionTask::with_clock(store, config, Clock::new())
    }

    /// A task on a given clock: the cutoff is its `now` minus the retention.
    pub fn with_clock(store: S, config: RetentionConfig, clock: Clock) -> Self {
        RetentionTask {
            store,
            config,
            clock,
            stats: Arc::new(RetentionStats::default()),
        }
    }

    /// The counters, shared with the running task.
    pub fn stats(&self) -> Arc<RetentionStats> {
        self.stats.clone()
    }

    /// Deletes every inbox row, then every dispatched outbox row, older than the retention, one
    /// batch at a time; stops early when `stop` is cancelled.
    ///
    /// # Errors
    /// The first [`StoreError`]; what was deleted before it stays deleted.
    pub async fn sweep(&self, stop: &CancellationToken) -> Result<Sweep, StoreError> {
        let cutoff = self
            .clock
            .now()
            .checked_sub(self.config.retention)
            .unwrap_or(std::time::UNIX_EPOCH);
        let batch = self.config.batch();
        let mut sweep = Sweep::default();
        for outbox in [false, true] {
            loop {
                if stop.is_cancelled() {
                    return Ok(sweep);
                }
                let deleted = if outbox {
                    // `dispatched_at` is the relay's clock, as `cutoff` is.
                    self.store
                        .delete_dispatched_outbox_batch(cutoff, batch)
                        .await?
                } else {
                    // `processed_at` is the database's clock: the store measures the age there.
                    self.store
                        .delete_inbox_batch(self.config.retention, batch)
                        .await?
                };
                sweep.batches += 1;
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                let (counter, total) = if outbox {
                    (&self.stats.outbox_deleted, &mut sweep.outbox_deleted)
                } else {
                    (&self.stats.inbox_deleted, &mut sweep.inbox_deleted)
                };
                counter.fetch_add(deleted, Ordering::Relaxed);
                *total += deleted;
                if deleted < batch as u64 {
                    break;
                }
                if self.config.pause.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(self.config.pause).await;
                }
            }
        }
        self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
        Ok(sweep)
    }

    /// Sweeps at once and then every interval until `shutdown`. A failed sweep is logged and
    /// tried again at the next interval.
    pub async fn run(&self, shutdown: CancellationToken) {
        tracing::info!(
            retention = ?self.config.retention,
            batch = self.config.batch(),
            interval = ?self.config.interval,
            "Retention started."
        );
        loop {
            match self.sweep(&shutdown).await {
                Ok(sweep) if sweep.inbox_deleted + sweep.outbox_deleted > 0 => {
                    tracing::info!(
                        inbox = sweep.inbox_deleted,
                        outbox = sweep.outbox_deleted,
                        batches = sweep.batches,
                        "Retention deleted expired rows."
                    );
                }
                Ok(_) => {}
                Err(error) => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%error, retry_in = ?self.config.interval, "Retention sweep failed.");
                }
            }
            if shutdown
                .run_until_cancelled(tokio::time::sleep(self.config.interval))
                .await
                .is_none()
            {
                break;
            }
        }
        tracing::info!(stats = ?self.stats.snapshot(), "Retention stopped.");
    }
}

/// [`RetentionConfig`] as written: the retention required, the rest [`RetentionConfig::new`]'s.
#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RetentionFields {
    retention: Duration,
    batch_size: Option<usize>,
    interval: Option<Duration>,
    pause: Option<Duration>,
}

#[cfg(feature = "serde")]
impl From<RetentionFields> for RetentionConfig {
    fn from(fields: RetentionFields) -> Self {
        let defaults = RetentionConfig::new(fields.retention);
        RetentionConfig {
            batch_size: fields.batch_size.unwrap_or(defaults.batch_size),
            interval: fields.interval.unwrap_or(defaults.interval),
            pause: fields.pause.unwrap_or(defaults.pause),
            ..defaults
        }
    }
}
