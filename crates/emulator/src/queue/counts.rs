//! Message counts of a queue or subscription: [`EntityCounts`], by state and in total.

use super::store::Store;

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

impl EntityCounts {
    /// The running `totals` with the current state of `main`'s messages and the size of `dlq`.
    pub(super) fn of(totals: EntityCounts, main: &Store, dlq: &Store) -> EntityCounts {
        let mut c = totals;
        for s in main.messages.values() {
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
        c.dead_lettered = dlq.messages.len();
        c
    }

    /// The dead-letter subqueue `dlq` alone (as if it were an entity), `dead_lettered_total`
    /// messages having been moved to it.
    pub(super) fn of_dlq(dead_lettered_total: u64, dlq: &Store) -> EntityCounts {
        let mut c = EntityCounts {
            sent: dead_lettered_total,
            ..EntityCounts::default()
        };
        for s in dlq.messages.values() {
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
