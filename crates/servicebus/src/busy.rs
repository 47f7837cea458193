//! [`BusyState`]: the client-wide pause after the service answered busy.
//!
//! .NET `ServiceBusRetryPolicy` keeps one `IsServerBusy` flag per client: a
//! `ServiceBusFailureReason.ServiceBusy` answer sets it for `ServerBusyBaseSleepTime` (10 s),
//! and every operation of the client waits it out before its next try. Java waits 4 s after
//! a busy answer (`ServerBusyException`, `ClientConstants.ServerBusyBaseSleepTimeInSecs`).
//! Retrying after 100 ms instead keeps a throttled
//! namespace throttled and burns the messages' delivery counts.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Until when the service is taken to be busy, and how long a busy answer holds the client.
#[derive(Debug)]
pub(crate) struct BusyState {
    wait: Duration,
    until: Mutex<Option<Instant>>,
}

impl BusyState {
    pub(crate) fn new(wait: Duration) -> Self {
        BusyState {
            wait,
            until: Mutex::new(None),
        }
    }

    /// How long a busy answer holds the client.
    pub(crate) fn wait(&self) -> Duration {
        self.wait
    }

    /// The service answered busy: every operation waits [`BusyState::wait`] from now, unless
    /// a pause is running already, which a later busy answer does not prolong (.NET
    /// `ServiceBusRetryPolicy.SetServerBusy`: "multiple call to this method will not prolong
    /// the timer"; protocol3 F5): under sustained throttling the client still tries once
    /// per pause instead of never.
    pub(crate) fn set(&self) {
        let mut until = self
            .until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if until.is_none_or(|u| u <= now) {
            *until = Some(now + self.wait);
        }
    }

    /// How much of the busy pause remains (zero when the service is not busy).
    pub(crate) fn remaining(&self) -> Duration {
        let until = *self
            .until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        until.map_or(Duration::ZERO, |u| {
            u.saturating_duration_since(Instant::now())
        })
    }

    /// Waits out the busy pause, if any, before an operation's next try.
    pub(crate) async fn wait_out(&self) {
        let remaining = self.remaining();
        if !remaining.is_zero() {
            tracing::debug!(
                ?remaining,
                "The service is busy; waiting before the next try."
            );
            tokio::time::sleep(remaining).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_busy_answer_holds_every_operation_for_the_wait() {
        let busy = BusyState::new(Duration::from_secs(10));
        assert_eq!(busy.remaining(), Duration::ZERO);
        busy.set();
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(busy.remaining(), Duration::from_secs(6));
        let start = Instant::now();
        busy.wait_out().await;
        assert_eq!(start.elapsed(), Duration::from_secs(6));
        assert_eq!(busy.remaining(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_busy_answer_does_not_prolong_the_pause() {
        let busy = BusyState::new(Duration::from_secs(10));
        busy.set();
        tokio::time::advance(Duration::from_secs(5)).await;
        busy.set();
        assert_eq!(busy.remaining(), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(busy.remaining(), Duration::ZERO);
        // Once over, the next busy answer starts a new pause.
        busy.set();
        assert_eq!(busy.remaining(), Duration::from_secs(10));
    }
}
