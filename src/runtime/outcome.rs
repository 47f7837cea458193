//! [`Outcome`]: what happened to one delivery, and the [`Settlement`] each outcome asks for.

use std::fmt;

use super::DeadLetterReason;
use super::retry::ScheduledRetry;
use crate::ports::{DuplicateScope, SettleError};

/// What happened to one delivery. Each outcome has exactly one settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler committed: complete.
    Processed,
    /// A dedupe constraint recognised the message: roll back, complete.
    Duplicate(DuplicateScope),
    /// The aggregate already holds a newer version: the inbox row is committed, complete.
    Stale,
    /// A failure that may pass: roll back, abandon, or with
    /// [`crate::RuntimeConfig::delayed_retry`] schedule a copy for later and complete.
    Transient,
    /// A failure that cannot pass: roll back, dead-letter with this reason.
    Permanent(DeadLetterReason),
    /// The lock was lost before commit: roll back, no settlement is possible.
    LockLost,
    /// The handler panicked: roll back, abandon (after a short backoff); from
    /// [`crate::RuntimeConfig::max_panics`] deliveries on it is dead-lettered
    /// [`DeadLetterReason::HandlerPanicked`] instead.
    HandlerPanicked,
    /// The contract name is one no handler accepts and the consumer completes those
    /// ([`crate::UnknownContracts::Complete`]): completed, no transaction, nothing recorded.
    Ignored,
}

/// The broker action an [`Outcome`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Remove the message.
    Complete,
    /// Make it available again (or, under delayed retries, schedule a copy and complete).
    Abandon,
    /// Move it to the dead-letter subqueue.
    DeadLetter,
    /// Nothing: the broker redelivers once the lock runs out.
    None,
}

impl Outcome {
    /// The settlement this outcome requires.
    pub fn settlement(self) -> Settlement {
        match self {
            Outcome::Processed | Outcome::Duplicate(_) | Outcome::Stale | Outcome::Ignored => {
                Settlement::Complete
            }
            Outcome::Transient | Outcome::HandlerPanicked => Settlement::Abandon,
            Outcome::Permanent(_) => Settlement::DeadLetter,
            Outcome::LockLost => Settlement::None,
        }
    }

    /// A short stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Duplicate(_) => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Transient => "transient",
            Outcome::Permanent(_) => "permanent",
            Outcome::LockLost => "lock_lost",
            Outcome::HandlerPanicked => "handler_panicked",
            Outcome::Ignored => "ignored",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlement_table_matches_architecture() {
        use Outcome::*;
        let table = [
            (Processed, Settlement::Complete),
            (Duplicate(DuplicateScope::Inbox), Settlement::Complete),
            (Duplicate(DuplicateScope::BusinessKey), Settlement::Complete),
            (Stale, Settlement::Complete),
            (Transient, Settlement::Abandon),
            (
                Permanent(DeadLetterReason::InvalidPayload),
                Settlement::DeadLetter,
            ),
            (LockLost, Settlement::None),
            (HandlerPanicked, Settlement::Abandon),
            (Ignored, Settlement::Complete),
        ];
        for (outcome, settlement) in table {
            assert_eq!(outcome.settlement(), settlement, "{outcome}");
        }
    }
}

/// What the runtime did with one delivery.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Report {
    /// The outcome.
    pub outcome: Outcome,
    /// The settlement's result: `None` when the outcome asks for none.
    pub settled: Option<Result<(), SettleError>>,
    /// Lock renewals while the delivery was handled.
    pub renewals: u32,
    /// The delayed retry scheduled for a transient failure (the broker accepted the copy and
    /// `settled` is the original's completion); `None` otherwise, also when scheduling failed
    /// and the original was abandoned instead.
    pub retry: Option<ScheduledRetry>,
}
