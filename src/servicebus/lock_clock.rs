//! Whether a pipelined delivery's lock ran out while it waited on the link, judged without
//! trusting the host's clock against the broker's.
//!
//! `x-opt-locked-until` is the broker's clock; a host 60 s ahead sees every fresh lock as
//! expired, and releasing on that view would bounce every delivery until the entity's max
//! delivery count dead-letters it. So the host's clock is only compared with itself: the
//! entity's lock duration is learned as the shortest `locked_until − enqueued_time` seen (a
//! message delivered right after it was enqueued), which dates each lock's grant in broker
//! time (`locked_until − span`); the smallest `host now − grant` seen is the host's offset
//! from the broker plus the shortest wait between a grant and its take. A delivery whose wait
//! beyond that shortest wait reaches the lock duration ran out. Until a span is learned, and
//! for the first delivery, nothing is judged run out: the runtime's lock keeper decides.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What the receiver has learned of the broker's locks and clock (milliseconds).
#[derive(Debug)]
pub(super) struct LockClock {
    /// The shortest `locked_until − enqueued_time` seen (`i64::MAX`: none yet).
    span_ms: AtomicI64,
    /// The smallest `host now − (locked_until − span)` seen (`i64::MAX`: none yet).
    offset_ms: AtomicI64,
}

impl Default for LockClock {
    fn default() -> Self {
        LockClock {
            span_ms: AtomicI64::new(i64::MAX),
            offset_ms: AtomicI64::new(i64::MAX),
        }
    }
}

impl LockClock {
    /// True when the lock `locked_until` of a delivery taken from the link at host time `now`
    /// ran out while it waited there; learns from it either way.
    pub(super) fn ran_out(
        &self,
        locked_until: SystemTime,
        enqueued: Option<SystemTime>,
        now: SystemTime,
    ) -> bool {
        let until = millis(locked_until);
        if let Some(span) = enqueued.map(|at| until.saturating_sub(millis(at)))
            && span > 0
        {
            self.span_ms.fetch_min(span, Ordering::AcqRel);
        }
        let span = self.span_ms.load(Ordering::Acquire);
        if span == i64::MAX {
            return false;
        }
        let sample = millis(now).saturating_sub(until.saturating_sub(span));
        let offset = self
            .offset_ms
            .fetch_min(sample, Ordering::AcqRel)
            .min(sample);
        // The broker's time now, as the host's clock and the learned offset place it.
        millis(now).saturating_sub(offset) >= until
    }
}

/// Milliseconds since the epoch, negative before it.
fn millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LOCK: Duration = Duration::from_secs(30);

    /// A lock granted at broker time `granted` (enqueued just before), taken at host time
    /// `granted + skew + waited`.
    fn judge(clock: &LockClock, granted: SystemTime, skew: i64, waited: Duration) -> bool {
        let now = granted + waited;
        let now = if skew >= 0 {
            now + Duration::from_secs(skew.unsigned_abs())
        } else {
            now - Duration::from_secs(skew.unsigned_abs())
        };
        clock.ran_out(granted + LOCK, Some(granted), now)
    }

    #[test]
    fn a_lock_that_waited_past_its_duration_ran_out_whatever_the_hosts_skew() {
        for skew in [0, 60, -60, 3600] {
            let clock = LockClock::default();
            let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            assert!(!judge(&clock, t0, skew, Duration::from_millis(5)), "{skew}");
            let t1 = t0 + Duration::from_secs(1);
            assert!(!judge(&clock, t1, skew, Duration::from_secs(20)), "{skew}");
            let t2 = t0 + Duration::from_secs(2);
            assert!(judge(&clock, t2, skew, Duration::from_secs(31)), "{skew}");
        }
    }

    #[test]
    fn nothing_is_judged_before_a_span_is_learned() {
        let clock = LockClock::default();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // No enqueued time: no span, however stale the lock looks on the host.
        assert!(!clock.ran_out(t0, None, t0 + Duration::from_secs(600)));
    }
}
