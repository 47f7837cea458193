//! An injectable wall clock driven by tokio's timer.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// Wall-clock time driven by tokio's timer.
///
/// Service Bus exposes wall-clock instants (`locked-until`, enqueued time, scheduled time), while
/// tests control time through tokio's paused clock. Anchoring the wall clock to a tokio
/// [`Instant`] gives one clock that is both: under `#[tokio::test(start_paused = true)]`,
/// `tokio::time::advance` moves [`Clock::now`] and wakes [`Clock::sleep_until`], so lock expiry,
/// TTL and scheduled messages are tested without real waiting.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let clock = sb_emulator::Clock::new();
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
        Clock::anchored_at(SystemTime::now())
    }

    /// A clock that reads `wall` now and advances with tokio's timer.
    pub fn anchored_at(wall: SystemTime) -> Self {
        Clock {
            wall,
            mono: Instant::now(),
        }
    }

    /// A clock `offset_secs` seconds ahead of the host's (behind it when negative): a broker
    /// whose timestamps (locked-until, enqueued time) are off from the clients' clocks, as
    /// hosts drift in production, for testing that clients do not mix the two clocks.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::{Duration, SystemTime};
    /// let behind = sb_emulator::Clock::shifted(-60);
    /// assert!(behind.now() + Duration::from_secs(59) < SystemTime::now());
    /// # }
    /// ```
    pub fn shifted(offset_secs: i64) -> Self {
        let offset = Duration::from_secs(offset_secs.unsigned_abs());
        let now = SystemTime::now();
        let wall = if offset_secs >= 0 {
            now.checked_add(offset)
        } else {
            now.checked_sub(offset)
        };
        Clock::anchored_at(wall.unwrap_or(now))
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
