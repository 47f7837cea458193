//! Whether the store can run this consumer's transactions, as the transactions find it.
//!
//! A [`crate::ErrorKind::Deployment`] error (a table or column missing because the code was
//! rolled out before `migrate`, a missing grant, a read-only database) is not the message's
//! fault: the message is retried like any transient failure, and the store is reported unfit
//! (`/readyz` fails) until a transaction commits or no such error was seen for
//! [`DEPLOYMENT_WINDOW`]. The error is logged at error level once per window and counted in
//! `sb_inbox.store.deployment_errors`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;
use tokio::time::Instant;

use super::ConsumerName;
use crate::ports::StoreError;
use crate::telemetry::names::{attr, metric};

/// How long a deployment error keeps the store unfit without a new one, and how often the same
/// condition is logged.
pub const DEPLOYMENT_WINDOW: Duration = Duration::from_secs(60);

/// The store's fitness as the runtime's transactions see it; cheap to clone and share with a
/// readiness probe.
#[derive(Debug, Clone)]
pub struct StoreHealth {
    state: Arc<Mutex<State>>,
    errors: Counter<u64>,
    consumer: KeyValue,
}

#[derive(Debug, Default)]
struct State {
    /// The last deployment error and when it was seen; `None` once a transaction committed.
    failing: Option<(Instant, String)>,
    /// When the condition was last logged, and how many errors were not logged since.
    logged: Option<Instant>,
    unlogged: u64,
    /// When a transaction last committed: evidence for a readiness probe that the store works
    /// even while its pool has no free connection.
    last_commit: Option<Instant>,
}

impl StoreHealth {
    /// A healthy store for `consumer`, counting into the global meter provider present now.
    pub fn new(consumer: &ConsumerName) -> Self {
        let errors = opentelemetry::global::meter("sb-inbox")
            .u64_counter(metric::STORE_DEPLOYMENT_ERRORS)
            .with_unit("{error}")
            .build();
        StoreHealth {
            state: Arc::default(),
            errors,
            consumer: KeyValue::new(attr::CONSUMER, consumer.as_str().to_owned()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A transaction failed with a deployment error: count it, log it once per window, and
    /// report the store unfit.
    pub(crate) fn deployment_error(&self, error: &StoreError) {
        let code = error.code().unwrap_or("none").to_owned();
        self.errors.add(
            1,
            &[self.consumer.clone(), KeyValue::new(attr::ERROR_TYPE, code)],
        );
        let now = Instant::now();
        let mut state = self.state();
        state.failing = Some((now, error.redacted()));
        let due = state
            .logged
            .is_none_or(|at| now.duration_since(at) >= DEPLOYMENT_WINDOW);
        if due {
            tracing::error!(
                %error,
                suppressed = state.unlogged,
                "The store does not match the code (missing table or column, missing grant, \
                 read-only database): messages are retried, not dead-lettered, and /readyz fails \
                 until this is fixed (run `sb-inbox migrate`, grant the identity its rights)."
            );
            state.logged = Some(now);
            state.unlogged = 0;
        } else {
            state.unlogged += 1;
        }
    }

    /// A transaction committed: the store runs this consumer's work.
    pub(crate) fn committed(&self) {
        let mut state = self.state();
        state.last_commit = Some(Instant::now());
        if state.failing.take().is_some() {
            // A new occurrence is a new incident: logged at once.
            state.logged = None;
            tracing::info!("The store commits again; deployment errors cleared.");
        }
    }

    /// When a transaction of this consumer last committed (`None` before the first).
    pub fn last_commit(&self) -> Option<Instant> {
        self.state().last_commit
    }

    /// The deployment error that makes the store unfit now, redacted; `None` when fit.
    pub fn problem(&self) -> Option<String> {
        let state = self.state();
        state
            .failing
            .as_ref()
            .filter(|(at, _)| at.elapsed() < DEPLOYMENT_WINDOW)
            .map(|(_, error)| error.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ErrorKind;

    fn missing_table() -> StoreError {
        StoreError::new(
            ErrorKind::Deployment,
            Some("42P01".into()),
            None,
            "relation \"inventory_stock\" does not exist",
        )
    }

    #[tokio::test(start_paused = true)]
    async fn unfit_until_a_commit_or_a_quiet_window() {
        let health = StoreHealth::new(&ConsumerName::new("c").unwrap());
        assert_eq!((health.problem(), health.last_commit()), (None, None));
        health.deployment_error(&missing_table());
        let problem = health.problem().expect("unfit");
        assert!(
            problem.contains("deployment") && problem.contains("42P01"),
            "{problem}"
        );
        assert!(!problem.contains("inventory_stock"), "redacted: {problem}");
        health.committed();
        assert_eq!(health.problem(), None, "a commit clears it");
        assert_eq!(health.last_commit(), Some(Instant::now()));

        health.deployment_error(&missing_table());
        tokio::time::advance(DEPLOYMENT_WINDOW - Duration::from_secs(1)).await;
        assert!(health.problem().is_some());
        health.deployment_error(&missing_table());
        assert_eq!(health.state().unlogged, 1, "logged once per window");
        tokio::time::advance(DEPLOYMENT_WINDOW).await;
        assert_eq!(health.problem(), None, "no error for a window");
    }
}
