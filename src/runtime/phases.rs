//! Where a delivery's time goes in the receive pipeline, for finding what bounds throughput when
//! the broker is far away (issue 27): the receive loop waiting on the broker or on a free slot,
//! a delivery queued behind busy handlers, its transaction, its settlement's round trip, and how
//! many deliveries were held and handled at once.
//!
//! Sums and counts only (a few atomic additions per delivery); [`Phases::report`] logs what
//! changed since the last report under the `sb_inbox::pipeline` target at debug level, so a run
//! with `RUST_LOG=sb_inbox::pipeline=debug` shows the occupancy trace and others pay nothing
//! for the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// One phase of a delivery's way through the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The receive loop waiting for a slot in what the runtime holds (it holds all it may).
    HeldWait,
    /// The receive loop waiting for the receiver (nothing on the link yet).
    ReceiveWait,
    /// Received, its lock kept, waiting for a handler slot.
    Queued,
    /// Handler slot taken until the transaction ended (committed or rolled back).
    Transaction,
    /// The settlement's broker round trip, after the slot was freed.
    Settlement,
}

#[cfg(test)]
const PHASES: [Phase; 5] = [
    Phase::HeldWait,
    Phase::ReceiveWait,
    Phase::Queued,
    Phase::Transaction,
    Phase::Settlement,
];

/// Per-phase sums for one runtime.
#[derive(Debug, Default)]
pub(crate) struct Phases {
    micros: [AtomicU64; 5],
    counts: [AtomicU64; 5],
    /// Sum of deliveries held (received, not yet settled) at each receipt, and of handlers
    /// busy at each receipt: divided by the receipts, the mean occupancy.
    held_sum: AtomicU64,
    busy_sum: AtomicU64,
    receipts: AtomicU64,
    /// Handler slots (batches when batching) whose transaction has not ended yet. Not the slot
    /// watch's count, which also covers the settlement (one that never returns is stuck): the
    /// trace would then show the settlement's round trip as busy handlers (issue 42).
    busy: AtomicUsize,
    last: std::sync::Mutex<Snapshot>,
}

/// A handler slot in use until its transaction ended; dropping it frees it in the trace.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Phases>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Snapshot {
    micros: [u64; 5],
    counts: [u64; 5],
    held_sum: u64,
    busy_sum: u64,
    receipts: u64,
}

fn index(phase: Phase) -> usize {
    match phase {
        Phase::HeldWait => 0,
        Phase::ReceiveWait => 1,
        Phase::Queued => 2,
        Phase::Transaction => 3,
        Phase::Settlement => 4,
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl Phases {
    /// Counts `took` towards `phase`.
    pub(crate) fn record(&self, phase: Phase, took: Duration) {
        let i = index(phase);
        self.micros[i].fetch_add(micros(took), Ordering::Relaxed);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A handler slot taken until the returned guard is dropped, when its transaction ended.
    pub(crate) fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// A delivery was received while `held` deliveries were held; counts the handler slots
    /// busy (see [`Phases::busy`]) at the same time.
    pub(crate) fn received(&self, held: usize) {
        let busy = self.busy.load(Ordering::Relaxed);
        let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        self.held_sum.fetch_add(wide(held), Ordering::Relaxed);
        self.busy_sum.fetch_add(wide(busy), Ordering::Relaxed);
        self.receipts.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Snapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            micros: self.micros.each_ref().map(load),
            counts: self.counts.each_ref().map(load),
            held_sum: load(&self.held_sum),
            busy_sum: load(&self.busy_sum),
            receipts: load(&self.receipts),
        }
    }

    /// Logs the mean of each phase and the mean occupancy since the last report, at debug
    /// level under `sb_inbox::pipeline` (nothing is computed when that is off).
    pub(crate) fn report(&self) {
        if !tracing::enabled!(target: "sb_inbox::pipeline", tracing::Level::DEBUG) {
            return;
        }
        let now = self.snapshot();
        let before = std::mem::replace(
            &mut *self
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            now,
        );
        let mean = |phase: Phase| {
            let i = index(phase);
            let n = now.counts[i].saturating_sub(before.counts[i]);
            let us = now.micros[i].saturating_sub(before.micros[i]);
            if n == 0 {
                0.0
            } else {
                us as f64 / n as f64 / 1000.0
            }
        };
        let count = |phase: Phase| {
            let i = index(phase);
            now.counts[i].saturating_sub(before.counts[i])
        };
        let receipts = now.receipts.saturating_sub(before.receipts).max(1) as f64;
        let held = now.held_sum.saturating_sub(before.held_sum) as f64 / receipts;
        let busy = now.busy_sum.saturating_sub(before.busy_sum) as f64 / receipts;
        tracing::debug!(
            target: "sb_inbox::pipeline",
            received = now.receipts.saturating_sub(before.receipts),
            held_wait_ms = mean(Phase::HeldWait),
            receive_wait_ms = mean(Phase::ReceiveWait),
            queued_ms = mean(Phase::Queued),
            transaction_ms = mean(Phase::Transaction),
            settlement_ms = mean(Phase::Settlement),
            // How many each mean is over: a batch's transaction counts once, its members'
            // queues and settlements once each.
            queued = count(Phase::Queued),
            transactions = count(Phase::Transaction),
            settlements = count(Phase::Settlement),
            mean_held = held,
            mean_busy = busy,
            "Pipeline phases since the last report."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phase_sums_into_its_own_slot() {
        let phases = Phases::default();
        for (n, phase) in PHASES.into_iter().enumerate() {
            phases.record(phase, Duration::from_millis(n as u64 + 1));
        }
        let snap = phases.snapshot();
        assert_eq!(snap.micros, [1000, 2000, 3000, 4000, 5000]);
        assert_eq!(snap.counts, [1; 5]);
        phases.received(10);
        phases.received(20);
        let snap = phases.snapshot();
        assert_eq!((snap.held_sum, snap.receipts), (30, 2));
    }

    /// Busy counts a handler slot from its guard to the guard's drop (the transaction's end),
    /// not beyond: a receipt after the drop no longer sees it (issue 42).
    #[test]
    fn busy_ends_when_its_guard_is_dropped() {
        let phases = Arc::new(Phases::default());
        let first = phases.busy();
        let second = phases.busy();
        phases.received(0);
        drop(first);
        phases.received(0);
        drop(second);
        phases.received(0);
        assert_eq!(phases.snapshot().busy_sum, 2 + 1);
    }
}
