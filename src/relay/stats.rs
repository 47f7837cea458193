//! [`RelayStats`]: the relay's counters and last backlog sample, readable at any time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::ports::{BacklogSample, OutboxBacklog};

/// Counters a running [`super::Relay`] keeps, readable at any time without touching the store
/// (an observable gauge's callback can read them).
#[derive(Debug, Default)]
pub struct RelayStats {
    claimed: AtomicU64,
    published: AtomicU64,
    republished: AtomicU64,
    marked: AtomicU64,
    failed: AtomicU64,
    lease_lost: AtomicU64,
    backlog_sampled: AtomicBool,
    backlog_pending: AtomicU64,
    backlog_oldest_age_ms: AtomicU64,
}

/// A snapshot of [`RelayStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStatsSnapshot {
    /// Rows claimed (a row claimed again after a lease ran out, or after the running relay
    /// handed back a batch it had claimed ahead, counts again).
    pub claimed: u64,
    /// Messages the broker accepted.
    pub published: u64,
    /// Of those, rows an earlier claim may have published already (a relay stopped between
    /// publish and mark, a lease ran out, a send's outcome was unknown): possible duplicates
    /// downstream, which the consumers' inboxes drop.
    pub republished: u64,
    /// Rows marked dispatched.
    pub marked: u64,
    /// Sends that failed (the rows wait for a backoff and are tried again).
    pub failed: u64,
    /// Published rows that could not be marked because another relay had taken them over after
    /// the lease ran out: that relay publishes them again.
    pub lease_lost: u64,
    /// The last backlog sample, if one was taken.
    pub backlog: Option<BacklogSample>,
}

impl RelayStats {
    pub(crate) fn add_claimed(&self, n: usize) {
        self.claimed.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_published(&self, retry: bool) {
        self.published.fetch_add(1, Ordering::Relaxed);
        if retry {
            self.republished.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_marked(&self, marked: u64, sent: usize) {
        self.marked.fetch_add(marked, Ordering::Relaxed);
        self.lease_lost
            .fetch_add((sent as u64).saturating_sub(marked), Ordering::Relaxed);
    }

    pub(crate) fn add_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_backlog(&self, backlog: &OutboxBacklog, now: SystemTime) {
        let sample = backlog.sample(now);
        let age = u64::try_from(sample.oldest_age.as_millis()).unwrap_or(u64::MAX);
        self.backlog_pending
            .store(sample.pending, Ordering::Relaxed);
        self.backlog_oldest_age_ms.store(age, Ordering::Relaxed);
        self.backlog_sampled.store(true, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> RelayStatsSnapshot {
        let backlog = self
            .backlog_sampled
            .load(Ordering::Relaxed)
            .then(|| BacklogSample {
                pending: self.backlog_pending.load(Ordering::Relaxed),
                oldest_age: Duration::from_millis(
                    self.backlog_oldest_age_ms.load(Ordering::Relaxed),
                ),
            });
        RelayStatsSnapshot {
            claimed: self.claimed.load(Ordering::Relaxed),
            published: self.published.load(Ordering::Relaxed),
            republished: self.republished.load(Ordering::Relaxed),
            marked: self.marked.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            lease_lost: self.lease_lost.load(Ordering::Relaxed),
            backlog,
        }
    }
}

impl std::ops::AddAssign for RelayStatsSnapshot {
    /// Sums the counters of several relays; keeps the larger backlog sample (they sample the
    /// same table).
    fn add_assign(&mut self, other: RelayStatsSnapshot) {
        self.claimed += other.claimed;
        self.published += other.published;
        self.republished += other.republished;
        self.marked += other.marked;
        self.failed += other.failed;
        self.lease_lost += other.lease_lost;
        self.backlog = self.backlog.max(other.backlog);
    }
}
