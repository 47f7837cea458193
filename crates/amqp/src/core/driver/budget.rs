//! The connection-wide bound on bytes held in unfinished (multi-frame) deliveries.
//!
//! Each link's `max-message-size` bounds one delivery; a peer that opens many links (or many
//! sessions) and leaves a large delivery unfinished on each could still make us hold their sum.
//! Every unfinished delivery therefore holds a [`Reservation`] against one [`Budget`] per
//! connection, and gives it back when it is dropped, whichever path drops it (completed,
//! aborted, refused, link detached, session ended, connection gone): the count cannot drift.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes all unfinished deliveries of one connection may hold together.
#[derive(Debug, Clone)]
pub(super) struct Budget {
    limit: u64,
    used: Arc<AtomicU64>,
}

impl Budget {
    /// A budget of `limit` bytes (`0`: no connection-wide bound).
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            used: Arc::default(),
        }
    }

    /// The bound, for error descriptions.
    pub(super) fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held right now (tests).
    #[cfg(test)]
    pub(super) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation for one delivery.
    pub(super) fn reserve(&self) -> Reservation {
        Reservation {
            budget: self.clone(),
            held: 0,
        }
    }
}

/// What one unfinished delivery holds of its connection's [`Budget`].
#[derive(Debug)]
pub(super) struct Reservation {
    budget: Budget,
    held: u64,
}

impl Reservation {
    /// Takes `n` more bytes; false (and nothing taken) when the connection's bound would pass.
    pub(super) fn try_grow(&mut self, n: u64) -> bool {
        let used = &self.budget.used;
        // One driver task per connection updates the count, so load + store cannot race; the
        // atomic only lets reservations give bytes back from wherever they are dropped.
        let now = used.load(Ordering::Relaxed);
        let after = now.saturating_add(n);
        if self.budget.limit > 0 && after > self.budget.limit {
            return false;
        }
        used.store(after, Ordering::Relaxed);
        self.held = self.held.saturating_add(n);
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let _ = self
            .budget
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(self.held))
            }); // the closure always returns Some: cannot fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_bound_and_give_bytes_back_on_drop() {
        let budget = Budget::new(100);
        let mut a = budget.reserve();
        let mut b = budget.reserve();
        assert!(a.try_grow(60));
        assert!(!b.try_grow(41), "60 + 41 passes the bound of 100");
        assert_eq!(budget.used(), 60, "a refused grow takes nothing");
        assert!(b.try_grow(40));
        drop(a);
        assert_eq!(budget.used(), 40);
        assert!(b.try_grow(60));
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_zero_limit_bounds_nothing() {
        let budget = Budget::new(0);
        let mut a = budget.reserve();
        assert!(a.try_grow(u64::MAX / 2));
        assert!(a.try_grow(u64::MAX / 2));
    }
}
