//! Message counts of a queue or subscription: [`EntityCounts`], by state and in total.

use super::QueueState;

/// Message counts and totals of a queue or subscription (or a topic's totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntityCounts {
    /// Receivable now: not locked, deferred or scheduled.
    pub active: usize,
    /// Locked by a peek-lock receiver (including locked deferred messages).
    pub locked: usize,
    /// Deferred and not locked.
    pub deferred: usize,
    /// Scheduled for later.
    pub scheduled: usize,
    /// In the `$DeadLetterQueue` subqueue (any state).
    pub dead_lettered: usize,
    /// Messages accepted into this entity (after duplicate detection and filtering).
    pub sent: u64,
    /// Sends dropped by duplicate detection.
    pub duplicates: u64,
    /// Messages completed or received in receive-and-delete mode (both subqueues).
    pub completed: u64,
    /// Messages that expired (dropped or dead-lettered).
    pub expired: u64,
    /// Messages moved to the dead-letter subqueue or forwarded from it, ever.
    pub dead_lettered_total: u64,
    /// Messages passed on by `ForwardTo` or `ForwardDeadLetteredMessagesTo`.
    pub forwarded: u64,
}

impl QueueState {
    /// Current counts.
    pub(crate) fn counts(&self) -> EntityCounts {
        let mut c = self.counts;
        for s in self.main.messages.values() {
            if s.lock.is_some() {
                c.locked += 1;
            } else if s.scheduled_at.is_some() {
                c.scheduled += 1;
            } else if s.deferred {
                c.deferred += 1;
            } else {
                c.active += 1;
            }
        }
        c.dead_lettered = self.dlq.messages.len();
        c
    }

    /// Counts of the dead-letter subqueue alone (as if it were an entity).
    pub(crate) fn dlq_counts(&self) -> EntityCounts {
        let mut c = EntityCounts {
            sent: self.counts.dead_lettered_total,
            ..EntityCounts::default()
        };
        for s in self.dlq.messages.values() {
            if s.lock.is_some() {
                c.locked += 1;
            } else if s.deferred {
                c.deferred += 1;
            } else {
                c.active += 1;
            }
        }
        c
    }
}
