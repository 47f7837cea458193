//! Which handler slots are busy, and since when: the readiness signal for slots stuck past the
//! processing bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long past its bound ([`crate::RuntimeConfig::max_processing`], twice that when batching)
/// a slot may stay busy before it counts as stuck: the cancelled delivery's abandon (a broker
/// answers within 30 s, or the client gives up) and the lock keeper's stop, twice over.
pub const STUCK_ALLOWANCE: Duration = Duration::from_secs(60);

/// The busy handler slots of one runtime. A slot is *stuck* when it has been busy longer than
/// its bound (the maximum processing time, twice that when batching) plus [`STUCK_ALLOWANCE`]:
/// cancellation did not free it (a handler blocking its thread, a settlement that never
/// returns), so the worker has less capacity than it claims. The worker's `/readyz` fails while any slot is stuck.
#[derive(Debug)]
pub struct SlotWatch {
    busy: Mutex<HashMap<u64, Instant>>,
    next: AtomicU64,
    stuck_after: Duration,
}

/// One busy slot; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Busy {
    watch: Arc<SlotWatch>,
    id: u64,
}

impl SlotWatch {
    pub(crate) fn new(bound: Duration) -> Self {
        SlotWatch {
            busy: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            stuck_after: bound.saturating_add(STUCK_ALLOWANCE),
        }
    }

    fn busy(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        // The map stays consistent under a panic elsewhere: insert and remove are single calls.
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn enter(self: &Arc<Self>) -> Busy {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.busy().insert(id, Instant::now());
        Busy {
            watch: self.clone(),
            id,
        }
    }

    /// Slots busy now.
    pub fn in_use(&self) -> usize {
        self.busy().len()
    }

    /// Slots busy for longer than their bound plus [`STUCK_ALLOWANCE`].
    pub fn stuck(&self) -> usize {
        let now = Instant::now();
        self.busy()
            .values()
            .filter(|since| now.saturating_duration_since(**since) > self.stuck_after)
            .count()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.watch.busy().remove(&self.id);
    }
}
