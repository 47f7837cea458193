//! [`ReplayHorizon`]: how long after processing a message can come back, and the check that
//! dedupe retention covers it.

use std::time::Duration;

/// The default DLQ resubmission window: 7 days (as `dlqResubmitWindowSecs` in infra/main.bicep).
pub const DEFAULT_RESUBMIT_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// How long after its first processing a message can be delivered again.
///
/// A message lives on the entity at most its time-to-live; while it lives, lock expiries and
/// abandons redeliver it, at most `max delivery count` times of `lock duration` each; a delayed
/// retry can put a copy of it (same logical id) on the entity later still; after
/// dead-lettering, an operator may resubmit it within the resubmission window. An inbox row
/// deleted before the horizon ends lets such a redelivery take effect a second time.
///
/// The horizon is the *sum* of the four (as docs/deploy.md and infra/main.bicep compute it),
/// not the longer of TTL and redeliveries plus the rest: Service Bus does not expire a locked
/// message, so a delivery that starts just before the TTL runs out still holds its lock (and is
/// redelivered on its expiry or abandon) past the TTL; `lock duration × max delivery count`
/// bounds the time a message can spend locked, whatever the order.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_inbox::worker::ReplayHorizon;
/// let horizon = ReplayHorizon::new(Duration::from_secs(14 * 86_400), Duration::from_secs(60), 10)
///     .with_dlq_resubmit_window(Duration::from_secs(7 * 86_400));
/// assert_eq!(horizon.span(), Duration::from_secs(21 * 86_400 + 600));
/// assert!(horizon.check(Duration::from_secs(30 * 86_400)).is_ok());
/// assert!(horizon.check(Duration::from_secs(7 * 86_400)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct ReplayHorizon {
    /// The entity's `DefaultMessageTimeToLive` (the smaller of it and any message's own TTL).
    pub message_ttl: Duration,
    /// The entity's `LockDuration`.
    pub lock_duration: Duration,
    /// The entity's `MaxDeliveryCount`.
    pub max_delivery_count: u32,
    /// How much later than its original a delayed-retry copy can come: max retries × max
    /// delay (zero without delayed retries).
    pub retry_span: Duration,
    /// How long after dead-lettering operators may resubmit (`sb-inbox dlq resubmit`).
    pub dlq_resubmit_window: Duration,
}

/// Retention shorter than the replay horizon.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "dedupe retention {retention_secs} s is shorter than the replay horizon {horizon_secs} s \
     (message TTL {ttl_secs} s, plus lock duration × max delivery count {redelivery_secs} s, \
     plus delayed retries {retry_secs} s, plus the DLQ resubmission window {dlq_secs} s): raise \
     SB_INBOX_RETENTION_SECS (retention.retention_secs) to at least {horizon_secs}, or lower the \
     entity's DefaultMessageTimeToLive / the DLQ resubmission window"
)]
pub struct RetentionTooShort {
    /// The configured retention.
    pub retention_secs: u64,
    /// The horizon it must cover.
    pub horizon_secs: u64,
    /// Message TTL.
    pub ttl_secs: u64,
    /// Lock duration × max delivery count.
    pub redelivery_secs: u64,
    /// Delayed retries: max retries × max delay.
    pub retry_secs: u64,
    /// DLQ resubmission window.
    pub dlq_secs: u64,
}

impl ReplayHorizon {
    /// The horizon of an entity with `message_ttl`, `lock_duration` and `max_delivery_count`,
    /// no delayed retries and the [`DEFAULT_RESUBMIT_WINDOW`].
    pub fn new(message_ttl: Duration, lock_duration: Duration, max_delivery_count: u32) -> Self {
        ReplayHorizon {
            message_ttl,
            lock_duration,
            max_delivery_count,
            retry_span: Duration::ZERO,
            dlq_resubmit_window: DEFAULT_RESUBMIT_WINDOW,
        }
    }

    /// How much later than its original a delayed-retry copy can come.
    #[must_use]
    pub fn with_retry_span(mut self, retry_span: Duration) -> Self {
        self.retry_span = retry_span;
        self
    }

    /// How long after dead-lettering operators may resubmit.
    #[must_use]
    pub fn with_dlq_resubmit_window(mut self, window: Duration) -> Self {
        self.dlq_resubmit_window = window;
        self
    }

    fn redelivery(&self) -> Duration {
        self.lock_duration.saturating_mul(self.max_delivery_count)
    }

    /// The horizon: the TTL, plus the redelivery span, plus the delayed-retry span, plus the DLQ
    /// window.
    pub fn span(&self) -> Duration {
        self.message_ttl
            .saturating_add(self.redelivery())
            .saturating_add(self.retry_span)
            .saturating_add(self.dlq_resubmit_window)
    }

    /// Checks that `retention` covers the horizon.
    ///
    /// # Errors
    /// [`RetentionTooShort`], naming the value to change.
    pub fn check(&self, retention: Duration) -> Result<(), RetentionTooShort> {
        let horizon = self.span();
        if retention >= horizon {
            return Ok(());
        }
        Err(RetentionTooShort {
            retention_secs: retention.as_secs(),
            horizon_secs: horizon.as_secs(),
            ttl_secs: self.message_ttl.as_secs(),
            redelivery_secs: self.redelivery().as_secs(),
            retry_secs: self.retry_span.as_secs(),
            dlq_secs: self.dlq_resubmit_window.as_secs(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sum, as docs/deploy.md and infra/main.bicep say: a delivery begun just before the
    /// TTL ends is still redelivered after it.
    #[test]
    fn the_horizon_adds_ttl_and_redeliveries() {
        let horizon = ReplayHorizon {
            message_ttl: Duration::from_secs(60),
            lock_duration: Duration::from_secs(300),
            max_delivery_count: 10,
            retry_span: Duration::ZERO,
            dlq_resubmit_window: Duration::from_secs(100),
        };
        assert_eq!(horizon.span(), Duration::from_secs(3160));
        let error = horizon.check(Duration::from_secs(3159)).unwrap_err();
        assert_eq!((error.horizon_secs, error.retention_secs), (3160, 3159));
        assert!(error.to_string().contains("SB_INBOX_RETENTION_SECS"));
        assert!(horizon.check(Duration::from_secs(3160)).is_ok());
        let long_ttl = ReplayHorizon {
            message_ttl: Duration::from_secs(86_400),
            ..horizon
        };
        assert_eq!(long_ttl.span(), Duration::from_secs(86_400 + 3000 + 100));
        let retried = ReplayHorizon {
            retry_span: Duration::from_secs(50),
            ..horizon
        };
        assert_eq!(retried.span(), Duration::from_secs(3210));
        assert!(
            retried
                .check(Duration::from_secs(3160))
                .unwrap_err()
                .to_string()
                .contains("delayed retries 50 s")
        );
    }
}
