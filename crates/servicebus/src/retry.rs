//! [`RetryOptions`]: how the client retries an operation the service may answer next time (a
//! detached send link re-attached, a settlement that timed out or found the service busy), as
//! the SDKs' retry options do: .NET `ServiceBusRetryOptions` (`MaxRetries` 3, `Delay` 0.8 s,
//! `MaxDelay` 60 s, exponential), Python `retry_total` / `retry_backoff_factor` /
//! `retry_backoff_max`.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// How the client retries.
///
/// Sends make at most [`RetryOptions::tries`] attempts, pausing between them; settlements keep
/// trying with the same pauses while the message's lock lasts (a settlement after the lock ran
/// out cannot succeed). Each pause is exponential (`delay`, 2 × `delay`, … up to `max_delay`)
/// with equal jitter (a random point in the upper half of the step), so clients that failed
/// together do not retry together.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_servicebus::RetryOptions;
/// let retry = RetryOptions::default()
///     .with_tries(5)
///     .with_delay(Duration::from_millis(200))
///     .with_max_delay(Duration::from_secs(10));
/// assert_eq!(retry.tries(), 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryOptions {
    tries: u32,
    delay: Duration,
    max_delay: Duration,
    /// `Some`: the jitter of every retry sequence comes from a generator seeded with it.
    jitter_seed: Option<u64>,
}

impl Default for RetryOptions {
    /// 3 attempts in all; pauses from 0.8 s up to 60 s (.NET's `Delay` and `MaxDelay`; .NET
    /// counts retries after the first attempt, `MaxRetries` 3).
    fn default() -> Self {
        RetryOptions {
            tries: 3,
            delay: Duration::from_millis(800),
            max_delay: Duration::from_secs(60),
            jitter_seed: None,
        }
    }
}

impl RetryOptions {
    /// At most `tries` attempts of a send in all, the first included (at least 1).
    #[must_use]
    pub fn with_tries(mut self, tries: u32) -> Self {
        self.tries = tries.max(1);
        self
    }

    /// The first pause between attempts.
    #[must_use]
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The longest pause between attempts.
    #[must_use]
    pub fn with_max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The same options drawing the jitter of each operation's pauses from a generator seeded
    /// with `seed` (so every operation pauses alike), instead of one seeded by the OS: for
    /// reproducible tests and simulations. Not for production, where clients that failed
    /// together must not retry together.
    #[must_use]
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// Attempts of a send in all, the first included.
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// The first pause between attempts.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The longest pause between attempts.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The pauses of one operation's retries.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff {
            base: self.delay,
            max: self.max_delay.max(self.delay),
            attempt: 1,
            seed: self.jitter_seed,
            rng: None,
        }
    }
}

/// The pauses of one operation's retries (see [`RetryOptions`]).
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
    /// [`RetryOptions::with_jitter_seed`]'s seed; `None`: the OS seeds the generator.
    seed: Option<u64>,
    /// Made at the first pause, not with the backoff: every send and settlement makes a
    /// backoff and almost none pauses, and seeding from the OS is a system call (`getrandom`)
    /// per message on the hot path.
    rng: Option<SmallRng>,
}

impl Backoff {
    /// The next pause, in `[step / 2, step]`; then the step doubles (capped).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let doublings = self.attempt.saturating_sub(1);
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        let step = self
            .base
            .checked_mul(factor)
            .map_or(self.max, |d| d.min(self.max));
        let half = step / 2;
        let spread = u64::try_from((step - half).as_micros()).unwrap_or(u64::MAX);
        self.attempt = self.attempt.saturating_add(1);
        let seed = self.seed;
        let rng = self.rng.get_or_insert_with(|| {
            seed.map_or_else(rand::make_rng::<SmallRng>, SmallRng::seed_from_u64)
        });
        half + Duration::from_micros(rng.random_range(0..=spread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_stay_between_half_and_the_full_step_which_doubles_up_to_the_cap() {
        let mut backoff = RetryOptions::default()
            .with_delay(100 * MS)
            .with_max_delay(1000 * MS)
            .backoff();
        for step in [100, 200, 400, 800, 1000, 1000] {
            let delay = backoff.next_delay();
            assert!(
                delay >= step * MS / 2 && delay <= step * MS,
                "step {step} ms: {delay:?}"
            );
        }
    }

    /// A backoff that never pauses (nearly every send's and settlement's) seeds no generator,
    /// so it costs no `getrandom` system call; a seeded one pauses as before.
    #[test]
    fn the_generator_is_made_at_the_first_pause() {
        let mut backoff = RetryOptions::default().backoff();
        assert!(backoff.rng.is_none(), "no generator before a pause");
        backoff.next_delay();
        assert!(backoff.rng.is_some());
        let seeded = RetryOptions::default().with_jitter_seed(7);
        let (mut a, mut b) = (seeded.backoff(), seeded.backoff());
        assert_eq!(
            a.next_delay(),
            b.next_delay(),
            "the same seed, the same pauses"
        );
    }

    #[test]
    fn at_least_one_try_and_the_sdk_defaults() {
        assert_eq!(RetryOptions::default().with_tries(0).tries(), 1);
        let defaults = RetryOptions::default();
        assert_eq!(
            (defaults.tries(), defaults.delay(), defaults.max_delay()),
            (3, 800 * MS, Duration::from_secs(60))
        );
    }
}
