//! The runtime's wall clock, driven by tokio's timer so paused-clock tests move it.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// Wall-clock time driven by tokio's timer.
///
/// Broker locks are wall-clock instants (`locked_until`), while tests control time through
/// tokio's paused clock. Anchoring the wall clock to a tokio [`Instant`] gives one clock that is
/// both: in a `#[tokio::test(start_paused = true)]` test, `tokio::time::advance` moves
/// [`Clock::now`] and wakes [`Clock::sleep_until`], with no real waiting.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let clock = sb_inbox::Clock::new();
/// let later = clock.now() + std::time::Duration::from_millis(1);
/// clock.sleep_until(later).await;
/// assert!(clock.now() >= later);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall: SystemTime,
    mono: Instant,
}

impl Clock {
    /// A clock anchored at the current wall-clock time.
    pub fn new() -> Self {
        Clock {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }

    /// A clock that reads `wall` now and runs on from there: a process whose clock is ahead of
    /// or behind the others (tests move lease expiry this way).
    pub fn starting_at(wall: SystemTime) -> Self {
        Clock {
            wall,
            mono: Instant::now(),
        }
    }

    /// The current wall-clock time.
    pub fn now(&self) -> SystemTime {
        self.wall + self.mono.elapsed()
    }

    /// Sleeps until the wall-clock time `deadline` (returns at once if it has passed).
    pub async fn sleep_until(&self, deadline: SystemTime) {
        let wait = deadline
            .duration_since(self.now())
            .unwrap_or(Duration::ZERO);
        tokio::time::sleep(wait).await;
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
