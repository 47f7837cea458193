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
//! for the first delivery, nothing is judged run out: whoever renews the locks decides.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// Learns from a delivery taken from the link at host time `now` (its lock's end and its
    /// enqueued time, both broker time).
    pub(super) fn learn(
        &self,
        locked_until: SystemTime,
        enqueued: Option<SystemTime>,
        now: SystemTime,
    ) {
        let until = millis(locked_until);
        if let Some(span) = enqueued.map(|at| until.saturating_sub(millis(at)))
            && span > 0
        {
            self.span_ms.fetch_min(span, Ordering::AcqRel);
        }
        let span = self.span_ms.load(Ordering::Acquire);
        if span != i64::MAX {
            let sample = millis(now).saturating_sub(until.saturating_sub(span));
            self.offset_ms.fetch_min(sample, Ordering::AcqRel);
        }
    }

    /// True when the lock `locked_until` of a delivery taken at host time `now` (and learned
    /// from, [`LockClock::learn`]) ran out while it waited on the link.
    pub(super) fn ran_out(&self, locked_until: SystemTime, now: SystemTime) -> bool {
        match self.offset_ms.load(Ordering::Acquire) {
            i64::MAX => false,
            offset => millis(now).saturating_sub(offset) >= millis(locked_until),
        }
    }

    /// The broker's time at host time `now` as far as it was learned (a little behind it, by
    /// the shortest wait between a grant and its take): what a lock's end is compared with.
    /// The host's clock until anything was learned.
    pub(super) fn broker_now(&self, now: SystemTime) -> SystemTime {
        match self.offset_ms.load(Ordering::Acquire) {
            i64::MAX => now,
            offset if offset >= 0 => now
                .checked_sub(Duration::from_millis(offset.unsigned_abs()))
                .unwrap_or(now),
            offset => now
                .checked_add(Duration::from_millis(offset.unsigned_abs()))
                .unwrap_or(now),
        }
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
        clock.learn(granted + LOCK, Some(granted), now);
        clock.ran_out(granted + LOCK, now)
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
        clock.learn(t0, None, t0 + Duration::from_secs(600));
        assert!(!clock.ran_out(t0, t0 + Duration::from_secs(600)));
        assert_eq!(clock.broker_now(t0), t0);
    }

    #[test]
    fn the_brokers_time_is_the_hosts_less_the_learned_offset() {
        let clock = LockClock::default();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // Taken 5 ms after its grant on a host 60 s ahead.
        assert!(!judge(&clock, t0, 60, Duration::from_millis(5)));
        let host = t0 + Duration::from_secs(70);
        let broker = clock.broker_now(host);
        assert_eq!(
            broker,
            t0 + Duration::from_secs(10) - Duration::from_millis(5)
        );
    }
}
