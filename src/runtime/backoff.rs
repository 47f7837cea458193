//! Exponential backoff: the one step function the receive loop, delayed retries and the
//! outbox relay share, and the jittered [`Backoff`] of the receive loop.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// Exponential backoff with "equal jitter": each delay is half the current step plus a random
/// part up to the other half, and the step doubles up to a cap. The random half keeps many
/// workers cut off by one outage from reconnecting in lockstep; the fixed half keeps a floor.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_inbox::runtime::Backoff;
/// let mut backoff = Backoff::seeded(Duration::from_millis(100), Duration::from_secs(1), 7);
/// let first = backoff.next_delay();
/// assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
    rng: SmallRng,
}

/// Step `attempt` (1-based) of an exponential backoff: `base × 2^(attempt−1)`, capped at `max`.
/// Shared by the receive loop's [`Backoff`], delayed retries' `RetryPolicy` and the outbox
/// relay's row backoff.
pub(crate) fn exponential_step(base: Duration, max: Duration, attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1);
    let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(max, |d| d.min(max))
}

/// Half of `step` plus a random part up to the other half: "equal jitter".
pub(crate) fn equal_jitter(step: Duration, rng: &mut impl RngExt) -> Duration {
    let half = step / 2;
    let spread = u64::try_from((step - half).as_micros()).unwrap_or(u64::MAX);
    half + Duration::from_micros(rng.random_range(0..=spread))
}

impl Backoff {
    /// Steps `base`, 2 × `base`, … up to `max`, seeded from the OS.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self::with_rng(base, max, rand::make_rng::<SmallRng>())
    }

    /// As [`Backoff::new`], seeded from `jitter` (the runtime's [`super::RuntimeConfig::jitter`]).
    pub(crate) fn from_jitter(base: Duration, max: Duration, jitter: &super::JitterSource) -> Self {
        Self::seeded(base, max, jitter.draw_seed())
    }

    /// As [`Backoff::new`] with a fixed seed, for reproducible delays.
    pub fn seeded(base: Duration, max: Duration, seed: u64) -> Self {
        Self::with_rng(base, max, SmallRng::seed_from_u64(seed))
    }

    fn with_rng(base: Duration, max: Duration, rng: SmallRng) -> Self {
        Backoff {
            base,
            max: max.max(base),
            attempt: 1,
            rng,
        }
    }

    /// The next delay, in `[step / 2, step]`; then the step doubles (capped).
    pub fn next_delay(&mut self) -> Duration {
        let step = exponential_step(self.base, self.max, self.attempt);
        let delay = equal_jitter(step, &mut self.rng);
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    /// Back to the first step, after a success.
    pub fn reset(&mut self) {
        self.attempt = 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delays_stay_between_half_and_the_full_step_which_doubles_up_to_the_cap() {
        let mut backoff = Backoff::seeded(100 * MS, 1000 * MS, 1);
        let steps = [100, 200, 400, 800, 1000, 1000, 1000];
        for step in steps {
            let delay = backoff.next_delay();
            assert!(
                delay >= step * MS / 2 && delay <= step * MS,
                "step {step} ms: {delay:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= 100 * MS);
    }

    #[test]
    fn workers_do_not_retry_in_lockstep() {
        let delays = |seed| {
            let mut backoff = Backoff::seeded(100 * MS, 30_000 * MS, seed);
            (0..8).map(|_| backoff.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(delays(3), delays(3), "a seed reproduces its delays");
        assert_ne!(delays(3), delays(4), "two workers get different delays");
        let all: Vec<_> = (0..50).map(|seed| delays(seed)[5]).collect();
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        assert!(distinct.len() > 40, "{} distinct of 50", distinct.len());
    }
}
