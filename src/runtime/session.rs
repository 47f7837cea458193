//! Session mode: messages of one session handled strictly one at a time, in order, each with
//! the same inbox transaction as any delivery (`process::Processor`); up to
//! [`SessionConfig::max_sessions`] sessions at once.
//!
//! The session lock is every delivery's lock here: the lock keeper renews it through
//! [`crate::Delivery::renew_lock`] while a message is handled, and this module renews it while
//! the session waits for its next message. A lost session lock is a lost lock: the commit is
//! fenced and the session given up (another receiver gets it, and its messages from the
//! first unsettled one on, in order).
//!
//! Throughput: one session is one handler slot, so a session's rate is bounded by one
//! transaction after another (plus a settlement round trip each); the runtime's
//! concurrency is the number of sessions held, never more than one delivery per session.
//! Delayed retries are refused: a retry copy is a new message at the end of its session,
//! after messages sent later, which breaks the order sessions exist for. Transient failures
//! abandon instead: the broker redelivers the same message first.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Backoff, Clock, Inner, Outcome, Runtime, RuntimeConfig, RuntimeError};
use crate::ports::{ReceiveError, SessionReceiver, SessionSource, SettleError, Store};
use crate::runtime::Handler;

/// How a [`Runtime`] over a [`SessionSource`] takes sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Sessions processed at once (each handles one message at a time).
    pub max_sessions: usize,
    /// A session quiet this long is closed, so its slot takes the next available session.
    pub idle: Duration,
}

impl Default for SessionConfig {
    /// 8 sessions, 5 s of quiet.
    fn default() -> Self {
        SessionConfig {
            max_sessions: 8,
            idle: Duration::from_secs(5),
        }
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Quiet for [`SessionConfig::idle`], or shutdown: closed and released.
    Closed,
    /// Its lock was lost (expired, its link detached, taken over).
    LockLost,
}

impl<R, S, H> Runtime<R, S, H>
where
    R: SessionSource,
    S: Store,
    H: Handler<S::Tx>,
{
    /// A runtime taking sessions from `sessions` (run it with [`Runtime::run_sessions`]).
    pub fn for_sessions(sessions: R, store: S, handler: H, config: RuntimeConfig) -> Self {
        Runtime::for_sessions_with_clock(sessions, store, handler, config, Clock::new())
    }

    /// [`Runtime::for_sessions`] on a given clock.
    pub fn for_sessions_with_clock(
        sessions: R,
        store: S,
        handler: H,
        config: RuntimeConfig,
        clock: Clock,
    ) -> Self {
        let source = sessions.source();
        Runtime::assemble(sessions, source, store, handler, config, clock)
    }

    /// Accepts sessions and handles their messages until `shutdown` is cancelled: up to
    /// `sessions.max_sessions` at once, each strictly in order, one message at a time. A
    /// session quiet for `sessions.idle` is released for the next one. On shutdown the
    /// message in hand gets [`RuntimeConfig::shutdown_grace`], then is rolled back and
    /// abandoned; every held session is closed.
    ///
    /// # Errors
    /// [`RuntimeError::Config`] for zero sessions, with delayed retries (a retry copy would
    /// leave its session's order) or with batched transactions ([`RuntimeConfig::batch_size`]
    /// over 1); [`RuntimeError::Receive`] when the source fails for good.
    pub async fn run_sessions(
        &self,
        sessions: SessionConfig,
        shutdown: CancellationToken,
    ) -> Result<(), RuntimeError> {
        check_session_mode(&self.inner.config, &sessions)?;
        let tracker = TaskTracker::new();
        let abort = CancellationToken::new();
        // A fatal source error stops every slot.
        let stop = shutdown.child_token();
        let failure: Arc<StdMutex<Option<RuntimeError>>> = Arc::default();
        let _probing = self.inner.probing();
        for _ in 0..sessions.max_sessions {
            let (inner, sessions) = (self.inner.clone(), sessions.clone());
            let (stop, abort, failure) = (stop.clone(), abort.clone(), failure.clone());
            tracker.spawn(async move {
                if let Err(error) = inner.take_sessions(&sessions, &stop, &abort).await {
                    *failure
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
                    stop.cancel();
                }
            });
        }
        stop.cancelled().await;
        self.inner.drain(&tracker, &abort).await;
        let failure = failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        failure.map_or(Ok(()), Err)
    }
}

impl<R, S, H> Inner<R, S, H>
where
    R: SessionSource,
    S: Store,
    H: Handler<S::Tx>,
{
    /// One session slot: accept a session, handle it until it is quiet or lost, repeat.
    async fn take_sessions(
        &self,
        config: &SessionConfig,
        stop: &CancellationToken,
        abort: &CancellationToken,
    ) -> Result<(), RuntimeError> {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        loop {
            // Paused by the kill switch: no session is taken.
            if !self.circuit.wait_admissible(stop).await {
                return Ok(());
            }
            let accepted = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                accepted = self.receiver.accept_next() => accepted,
            };
            let session = match accepted {
                Ok(Some(session)) => {
                    backoff.reset();
                    session
                }
                Ok(None) => continue,
                Err(ReceiveError::Transient(error)) => {
                    let delay = backoff.next_delay();
                    tracing::debug!(%error, ?delay, "Accepting a session failed; retrying.");
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
                Err(error) => return Err(RuntimeError::Receive(error)),
            };
            let ended = self.handle_session(&session, config, stop, abort).await;
            if ended == Ended::LockLost {
                self.observer.session_lock_lost();
                tracing::warn!(session_id = %session.session_id(), "Session lock lost; giving the session up.");
            }
            session.close().await;
        }
    }

    /// Handles `session`'s messages in order until it is quiet, lost or shut down.
    async fn handle_session(
        &self,
        session: &R::Session,
        config: &SessionConfig,
        stop: &CancellationToken,
        abort: &CancellationToken,
    ) -> Ended {
        let margin = self.config.lock_margin;
        loop {
            let received = tokio::select! {
                () = stop.cancelled() => return Ended::Closed,
                () = keep_session(session, margin, self.clock) => return Ended::LockLost,
                received = session.receive(config.idle) => received,
            };
            let delivery = match received {
                Ok(Some(delivery)) => Arc::new(delivery),
                Ok(None) => return Ended::Closed,
                Err(error) => {
                    tracing::debug!(%error, session_id = %session.session_id(), "Session receive failed.");
                    return Ended::LockLost;
                }
            };
            // Paused by the kill switch (or its trial taken): the message goes back unstarted
            // and the session is let go, so its messages come back in order.
            let Some(_ticket) = self.circuit.try_admit() else {
                self.give_back(&*delivery).await;
                return Ended::Closed;
            };
            let processor = self.processor();
            // The delivery's lock is the session lock: the keeper renews the session.
            let lock = processor.keeper.keep(delivery.clone());
            let report = {
                let _busy = self.slots.enter();
                processor.run(delivery, lock, abort).await
            };
            self.stats.record(&report);
            let lost = report.outcome == Outcome::LockLost
                || matches!(report.settled, Some(Err(SettleError::LockLost)));
            if lost {
                return Ended::LockLost;
            }
            if report.settled.as_ref().is_some_and(Result::is_err) {
                // Unsettled, the message keeps its lock and blocks the session's order until
                // the lock runs out: let the session go so its messages come back in order.
                return Ended::Closed;
            }
        }
    }
}

/// Renews the session lock `margin` before each expiry while the session waits for a
/// message; resolves only when the lock is lost.
async fn keep_session<T: SessionReceiver>(session: &T, margin: Duration, clock: Clock) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let until = session.locked_until();
        let renew_at = until.checked_sub(margin).unwrap_or(until);
        let wait = renew_at
            .duration_since(clock.now())
            .unwrap_or(Duration::ZERO);
        tokio::time::sleep(wait).await;
        match session.renew().await {
            Ok(_) => backoff.reset(),
            Err(SettleError::Transient(error)) if clock.now() < session.locked_until() => {
                tracing::debug!(%error, "Renewing the session lock failed; retrying.");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(_) => return,
        }
        if clock.now() >= session.locked_until() {
            return;
        }
    }
}

/// Refuses what session mode cannot honour, as the worker's configuration does: no session
/// slots, delayed retries (a retry copy would leave its session's order) and batched
/// transactions (a session handles one message at a time, each in its own transaction).
fn check_session_mode(
    config: &RuntimeConfig,
    sessions: &SessionConfig,
) -> Result<(), RuntimeError> {
    config.validate()?;
    if sessions.max_sessions == 0 {
        return Err(RuntimeError::Config(
            "max_sessions must be at least 1".into(),
        ));
    }
    if config.delayed_retry.is_some() {
        return Err(RuntimeError::Config(
            "delayed retries cannot keep a session's order (a retry copy goes to the end of its session): turn them off in session mode".into(),
        ));
    }
    if config.batch_size > 1 {
        return Err(RuntimeError::Config(
            "session mode handles a session's messages one at a time, each in its own transaction: batch_size must be 1".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_hold_eight_sessions() {
        assert_eq!(SessionConfig::default().max_sessions, 8);
    }

    #[test]
    fn session_mode_refuses_batched_transactions() {
        let config = RuntimeConfig {
            batch_size: 2,
            ..RuntimeConfig::new(crate::ConsumerName::new("orders").unwrap())
        };
        let error = check_session_mode(&config, &SessionConfig::default()).unwrap_err();
        assert!(
            matches!(&error, RuntimeError::Config(why) if why.contains("batch_size must be 1")),
            "{error:?}"
        );
        let single = RuntimeConfig::new(crate::ConsumerName::new("orders").unwrap());
        assert!(check_session_mode(&single, &SessionConfig::default()).is_ok());
    }
}
