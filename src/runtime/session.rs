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
//! concurrency is the number of sessions held, never more than one delivery per session
//! handled at a time. The session's receiver may have the next message on its way meanwhile
//! (the Service Bus session link keeps two in flight); after an abandon it gives those back,
//! so the abandoned message comes first again.
//! Delayed retries are refused: a retry copy is a new message at the end of its session,
//! after messages sent later, which breaks the order sessions exist for. Transient failures
//! abandon instead: the broker redelivers the same message first.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Backoff, Clock, Inner, Outcome, Runtime, RuntimeConfig, RuntimeError};
use crate::ports::{ReceiveError, SessionReceiver, SessionSource, SettleError, Store};
use crate::runtime::Handler;

/// How a [`Runtime`] over a [`SessionSource`] takes sessions: [`SessionConfig::default`] and
/// the `with_*` methods; deserialisable with the `serde` feature.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct SessionConfig {
    /// Sessions processed at once (each handles one message at a time).
    pub max_sessions: usize,
    /// A session quiet this long is closed, so its slot takes the next available session.
    pub idle: Duration,
}

impl SessionConfig {
    /// Sessions processed at once.
    #[must_use]
    pub fn with_max_sessions(mut self, max_sessions: usize) -> Self {
        self.max_sessions = max_sessions;
        self
    }

    /// How long a quiet session keeps its slot.
    #[must_use]
    pub fn with_idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }
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
                if let Err(error) = inner.slot(&sessions, &stop, &abort).await {
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
    /// One session slot for the runtime's life. User code's panics are caught where it runs
    /// (`panic`); one that escapes anyway (a port's own code) ends the session it was in, not
    /// the slot: without this the slot would be gone for good, and after `max_sessions` such
    /// panics the worker would handle nothing while its process stayed up.
    async fn slot(
        &self,
        config: &SessionConfig,
        stop: &CancellationToken,
        abort: &CancellationToken,
    ) -> Result<(), RuntimeError> {
        // Paced, so that a port that panics at once every time does not spin; drawn from the
        // runtime's jitter like every other delay it picks, so a seeded run replays.
        let mut backoff = Backoff::from_jitter(
            Duration::from_millis(100),
            Duration::from_secs(30),
            &self.config.jitter,
        );
        loop {
            match super::panic::catch(self.take_sessions(config, stop, abort)).await {
                Ok(ended) => return ended,
                Err(super::panic::Panicked(why)) => {
                    let delay = backoff.next_delay();
                    tracing::error!(error = %why, ?delay, "A session slot panicked; its session is given up and the slot goes on.");
                    if stop
                        .run_until_cancelled(tokio::time::sleep(delay))
                        .await
                        .is_none()
                    {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// One session slot: accept a session, handle it until it is quiet or lost, repeat.
    async fn take_sessions(
        &self,
        config: &SessionConfig,
        stop: &CancellationToken,
        abort: &CancellationToken,
    ) -> Result<(), RuntimeError> {
        let mut backoff = Backoff::from_jitter(
            Duration::from_millis(100),
            Duration::from_secs(30),
            &self.config.jitter,
        );
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
                () = keep_session(session, margin, self.clock, &self.config.jitter) => return Ended::LockLost,
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
            // The delivery's lock is the session lock: the keeper renews the session. It was
            // granted before the delivery, so the delivery's enqueued time bounds nothing.
            let remaining = plausible_remaining(session.locked_until(), self.clock.now(), margin);
            let lock = processor.keeper.keep_for(delivery.clone(), remaining);
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
            if report.outcome.settlement() == super::Settlement::Abandon {
                // Should the session link have fetched the next message ahead, it is given
                // back, so the abandoned one, available again, comes before it (sb-servicebus's
                // session links fetch nothing ahead: then there is nothing to give back).
                session.give_back_ahead().await;
            }
        }
    }
}

/// Renews the session lock `margin` before each expiry while the session waits for a
/// message; resolves only when the lock is lost: the broker refused a renewal, or renewals
/// failed transiently until the lock's expiry passed.
///
/// The expiry is a point on the monotonic clock, set from each lock the broker granted: the
/// host's view `locked_until − now` mixes the broker's clock with the host's, so it is trusted
/// only while it is plausible. A lock the broker has just granted or renewed that looks
/// expired, or within the margin, on the host clock says the host is ahead of the broker (a
/// host 60 s ahead saw every fresh 60 s lock as expired and gave the session up on its first
/// idle wait): the lock then counts as lasting `margin`, renewed every `margin / 2`, and only
/// the broker's answer ends it.
async fn keep_session<T: SessionReceiver>(
    session: &T,
    margin: Duration,
    clock: Clock,
    jitter: &super::JitterSource,
) {
    let mut backoff =
        Backoff::from_jitter(Duration::from_millis(200), Duration::from_secs(5), jitter);
    let mut granted = Instant::now();
    let mut remaining = plausible_remaining(session.locked_until(), clock.now(), margin);
    loop {
        // Never before half of the lock has passed: a margin as long as the lock would
        // otherwise renew without pause.
        let renew_at = granted + remaining.saturating_sub(margin).max(remaining / 2);
        tokio::time::sleep_until(renew_at).await;
        match session.renew().await {
            Ok(until) => {
                backoff.reset();
                granted = Instant::now();
                remaining = plausible_remaining(until, clock.now(), margin);
            }
            Err(SettleError::Transient(error)) if Instant::now() < granted + remaining => {
                tracing::debug!(%error, "Renewing the session lock failed; retrying.");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(_) => return,
        }
    }
}

/// How long a lock the broker has just granted lasts, as far as the host can tell: `until −
/// now`, or `margin` when the host clock is so far ahead that the lock looks expired or within
/// the margin.
fn plausible_remaining(until: SystemTime, now: SystemTime, margin: Duration) -> Duration {
    match until.duration_since(now) {
        Ok(remaining) if remaining > margin => remaining,
        _ => {
            tracing::debug!(
                ?margin,
                "The session lock looks expired on the host clock (ahead of the broker's); renewing every half margin."
            );
            margin
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

    /// A session whose lock runs on a broker clock 60 s behind the host's: each lock lasts 30 s
    /// from the broker's now, so on the host clock every fresh lock looks 30 s expired.
    struct BehindTheHost {
        host: Clock,
        renewals: std::sync::atomic::AtomicU32,
    }

    impl BehindTheHost {
        fn broker_until(&self) -> SystemTime {
            self.host.now() - Duration::from_secs(60) + Duration::from_secs(30)
        }
    }

    impl SessionReceiver for BehindTheHost {
        type Delivery = crate::testing::MemoryDelivery;

        fn session_id(&self) -> &str {
            "s-1"
        }

        fn locked_until(&self) -> SystemTime {
            self.broker_until()
        }

        async fn renew(&self) -> Result<SystemTime, SettleError> {
            self.renewals
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(self.broker_until())
        }

        async fn receive(
            &self,
            _: Duration,
        ) -> Result<Option<Self::Delivery>, crate::ports::ReceiveError> {
            Ok(None)
        }

        async fn close(&self) {}
    }

    /// A host clock 60 s ahead of the broker's does not give the session up: the keeper keeps
    /// renewing (every half margin) for as long as the broker grants the lock.
    #[tokio::test(start_paused = true)]
    async fn a_host_clock_ahead_of_the_broker_keeps_the_session() {
        let session = BehindTheHost {
            host: Clock::new(),
            renewals: std::sync::atomic::AtomicU32::new(0),
        };
        let margin = Duration::from_secs(10);
        let jitter = crate::runtime::JitterSource::seeded(1);
        let kept = tokio::select! {
            () = keep_session(&session, margin, session.host, &jitter) => false,
            () = tokio::time::sleep(Duration::from_secs(300)) => true,
        };
        assert!(kept, "the session was given up");
        let renewals = session.renewals.load(std::sync::atomic::Ordering::SeqCst);
        assert!((59..=61).contains(&renewals), "{renewals}");
    }

    #[test]
    fn defaults_hold_eight_sessions() {
        assert_eq!(SessionConfig::default().max_sessions, 8);
    }

    #[test]
    fn session_mode_refuses_batched_transactions() {
        let config = RuntimeConfig {
            batch_size: 2,
            ..RuntimeConfig::new(crate::runtime::consumer::ConsumerName::new("orders").unwrap())
        };
        let error = check_session_mode(&config, &SessionConfig::default()).unwrap_err();
        assert!(
            matches!(&error, RuntimeError::Config(why) if why.contains("batch_size must be 1")),
            "{error:?}"
        );
        let single =
            RuntimeConfig::new(crate::runtime::consumer::ConsumerName::new("orders").unwrap());
        assert!(check_session_mode(&single, &SessionConfig::default()).is_ok());
    }
}
