//! A deterministic simulator of sb-inbox (issue 41): the real runtime, the real `sb-servicebus`
//! client on the real `sb-amqp` engine, the real emulator and a SQLite store, all on one
//! thread under tokio's paused clock, joined by a simulated network, with faults drawn from one
//! seed and invariants checked by an independent model after every run.
//!
//! `SIM_SEED=N cargo run -p sim --release -- --seed N` replays one run; see the crate README.

pub mod dbclock;
pub mod handler;
pub mod host;
pub mod net;
pub mod plan;
pub mod process;
pub mod run;
pub mod store;
pub mod world;

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

pub use plan::{Fault, Mix, Plan};
pub use run::{Report, run};

/// The event trace of one run: each line stamped with its virtual time (ms since the start).
/// Two runs of one seed must produce the same lines; their hash is compared.
#[derive(Debug, Clone)]
pub struct Trace {
    start: Instant,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Trace {
    /// A trace starting now.
    pub fn new() -> Self {
        Trace {
            start: Instant::now(),
            lines: Arc::default(),
        }
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `event` at the current virtual time.
    pub fn push(&self, event: impl AsRef<str>) {
        let at = self.start.elapsed().as_millis();
        self.lines().push(format!("{at:>7} {}", event.as_ref()));
    }

    /// Every line so far.
    pub fn snapshot(&self) -> Vec<String> {
        self.lines().clone()
    }

    /// A hash of every line (SipHash with fixed keys: stable across runs of one build).
    pub fn hash(&self) -> u64 {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::hash::DefaultHasher::new();
        self.lines().hash(&mut h);
        h.finish()
    }
}

impl Default for Trace {
    fn default() -> Self {
        Trace::new()
    }
}
