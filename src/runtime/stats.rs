//! In-process counters of a runtime's outcomes, readable without telemetry.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Outcome, Report};

/// Counters a running [`super::Runtime`] keeps.
#[derive(Debug, Default)]
pub struct Stats {
    processed: AtomicU64,
    duplicate: AtomicU64,
    stale: AtomicU64,
    transient: AtomicU64,
    permanent: AtomicU64,
    lock_lost: AtomicU64,
    panicked: AtomicU64,
    ignored: AtomicU64,
    settle_failed: AtomicU64,
    renewals: AtomicU64,
    retried: AtomicU64,
    released: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Processed deliveries.
    pub processed: u64,
    /// Duplicates.
    pub duplicate: u64,
    /// Stale messages.
    pub stale: u64,
    /// Transient failures.
    pub transient: u64,
    /// Permanent failures (dead-lettered).
    pub permanent: u64,
    /// Locks lost before commit.
    pub lock_lost: u64,
    /// Handler panics caught (abandoned, or dead-lettered `HandlerPanicked` when the panic
    /// came from the last allowed delivery: those count as `permanent`).
    pub panicked: u64,
    /// Unknown contracts completed without a transaction
    /// ([`crate::UnknownContracts::Complete`]).
    pub ignored: u64,
    /// Settlements the broker refused or did not answer.
    pub settle_failed: u64,
    /// Lock renewals.
    pub renewals: u64,
    /// Transient failures turned into delayed retries (the copy accepted by the broker); a
    /// subset of `transient`.
    pub retried: u64,
    /// Deliveries received but never started, given back on shutdown (AMQP `released`: not a
    /// delivery attempt). Not part of [`StatsSnapshot::handled`].
    pub released: u64,
}

impl StatsSnapshot {
    /// All deliveries handled.
    pub fn handled(&self) -> u64 {
        self.processed
            + self.duplicate
            + self.stale
            + self.transient
            + self.permanent
            + self.lock_lost
            + self.panicked
            + self.ignored
    }
}

impl std::ops::AddAssign for StatsSnapshot {
    /// Sums the counters of several runtimes (several worker instances).
    fn add_assign(&mut self, other: StatsSnapshot) {
        self.processed += other.processed;
        self.duplicate += other.duplicate;
        self.stale += other.stale;
        self.transient += other.transient;
        self.permanent += other.permanent;
        self.lock_lost += other.lock_lost;
        self.panicked += other.panicked;
        self.ignored += other.ignored;
        self.settle_failed += other.settle_failed;
        self.renewals += other.renewals;
        self.retried += other.retried;
        self.released += other.released;
    }
}

impl Stats {
    pub(crate) fn record_released(&self) {
        self.released.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record(&self, report: &Report) {
        let counter = match report.outcome {
            Outcome::Processed => &self.processed,
            Outcome::Duplicate(_) => &self.duplicate,
            Outcome::Stale => &self.stale,
            Outcome::Transient => &self.transient,
            Outcome::Permanent(_) => &self.permanent,
            Outcome::LockLost => &self.lock_lost,
            Outcome::HandlerPanicked => &self.panicked,
            Outcome::Ignored => &self.ignored,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if matches!(report.settled, Some(Err(_))) {
            self.settle_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.renewals
            .fetch_add(u64::from(report.renewals), Ordering::Relaxed);
        if report.retry.is_some() {
            self.retried.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            processed: self.processed.load(Ordering::Relaxed),
            duplicate: self.duplicate.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            transient: self.transient.load(Ordering::Relaxed),
            permanent: self.permanent.load(Ordering::Relaxed),
            lock_lost: self.lock_lost.load(Ordering::Relaxed),
            panicked: self.panicked.load(Ordering::Relaxed),
            ignored: self.ignored.load(Ordering::Relaxed),
            settle_failed: self.settle_failed.load(Ordering::Relaxed),
            renewals: self.renewals.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
        }
    }
}
