//! An injectable wall clock driven by tokio's timer.

use std::sync::atomic::{AtomicI64, Ordering};
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
    /// Milliseconds the clock was stepped by since it started ([`Clock::steppable`]), shared
    /// by every copy.
    step: Option<&'static AtomicI64>,
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
            step: None,
        }
    }

    /// This clock, steppable while it runs ([`Clock::step`]) by every copy of it, as a host's
    /// clock is stepped by an NTP correction or a VM resumed after a pause. Each call makes
    /// one small cell that lives as long as the process (clocks are `Copy`).
    #[must_use]
    pub fn steppable(self) -> Self {
        Clock {
            step: Some(Box::leak(Box::new(AtomicI64::new(0)))),
            ..self
        }
    }

    /// Steps this clock (and every copy of it) by `secs` seconds (back when negative); false
    /// (and nothing happens) unless it is [`Clock::steppable`]. Timers already waiting keep
    /// their deadlines; what reads the time from now on sees the step.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::{Duration, SystemTime};
    /// let clock = sb_emulator::Clock::new().steppable();
    /// assert!(clock.step(-60));
    /// assert!(clock.now() + Duration::from_secs(59) < SystemTime::now());
    /// assert!(!sb_emulator::Clock::new().step(60));
    /// # }
    /// ```
    pub fn step(&self, secs: i64) -> bool {
        match self.step {
            Some(step) => {
                step.fetch_add(secs.saturating_mul(1000), Ordering::AcqRel);
                true
            }
            None => false,
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
        let now = self.wall + self.mono.elapsed();
        match self.step.map(|s| s.load(Ordering::Acquire)) {
            None | Some(0) => now,
            Some(ms) if ms > 0 => now + Duration::from_millis(ms.unsigned_abs()),
            Some(ms) => now
                .checked_sub(Duration::from_millis(ms.unsigned_abs()))
                .unwrap_or(now),
        }
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
