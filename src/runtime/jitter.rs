//! The runtime's source of jitter ([`JitterSource`]): the receive loop's backoff, the circuit's
//! probes, transient holds and delayed retries draw from it. Below all of them, so none imports
//! another for it.

use std::fmt;
use std::sync::Arc;

/// Where jitter comes from: each call yields a number in `[0, 1)`.
///
/// [`JitterSource::random`] in production; tests inject [`JitterSource::fixed`] so delays are
/// exact.
#[derive(Clone)]
pub struct JitterSource(Arc<dyn Fn() -> f64 + Send + Sync>);

impl JitterSource {
    /// Uniformly random numbers (the thread-local generator of `rand`).
    pub fn random() -> Self {
        JitterSource(Arc::new(rand::random::<f64>))
    }

    /// Always `value` (clamped to `[0, 1]`).
    pub fn fixed(value: f64) -> Self {
        let value = if value.is_nan() {
            0.0
        } else {
            value.clamp(0.0, 1.0)
        };
        JitterSource(Arc::new(move || value))
    }

    /// Numbers from a generator seeded with `seed`: the same sequence on every run, for
    /// reproducible tests and simulations.
    pub fn seeded(seed: u64) -> Self {
        use rand::{RngExt as _, SeedableRng as _};
        let rng = std::sync::Mutex::new(rand::rngs::SmallRng::seed_from_u64(seed));
        JitterSource(Arc::new(move || {
            rng.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .random::<f64>()
        }))
    }

    /// A seed drawn from this source, for a generator of its own.
    pub(crate) fn draw_seed(&self) -> u64 {
        // 53 bits: what an f64 in [0, 1) carries.
        (self.sample() * (1u64 << 53) as f64) as u64
    }

    /// Numbers from `source`; values outside `[0, 1]` are clamped.
    pub fn from_fn(source: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        JitterSource(Arc::new(source))
    }

    /// One number in `[0, 1]` (NaN read as 0).
    pub(crate) fn sample(&self) -> f64 {
        let value = (self.0)();
        if value.is_nan() {
            0.0
        } else {
            value.clamp(0.0, 1.0)
        }
    }
}

impl fmt::Debug for JitterSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JitterSource")
    }
}
