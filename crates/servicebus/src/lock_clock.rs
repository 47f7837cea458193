//! Whether a pipelined delivery's lock ran out while it waited on the link, judged without
//! trusting the host's clock against the broker's.
//!
//! `x-opt-locked-until` is the broker's clock; a host 60 s ahead sees every fresh lock as
//! expired, and releasing on that view would bounce every delivery until the entity's max
//! delivery count dead-letters it. So the host's clock is only compared with itself: the
//! entity's lock duration is learned as the shortest `locked_until − enqueued_time` seen (a
//! message delivered right after it was enqueued), which dates each lock's grant in broker
//! time (`locked_until − span`); the smallest `host now − grant` seen lately is the host's
//! offset from the broker plus the shortest wait between a grant and its take. A delivery
//! whose wait beyond that shortest wait reaches the lock duration ran out. Until a span is
//! learned, and for the first delivery, nothing is judged run out: whoever renews the locks
//! decides.
//!
//! No SDK judges a prefetched lock like this (.NET and Java hand the message out and report
//! the lost lock on settlement; "Prefetch Azure Service Bus messages", Microsoft Learn: check
//! `LockedUntilUtc` "but be mindful of clock skew"), so its failure mode is bounded here
//! (protocol3 F3): the host side is read on the monotonic clock, which a host clock step does
//! not move; the offset is a minimum over the last [`WINDOW`] to two, so a step of the
//! broker's clock is forgotten; and after [`MAX_RUN_OUT_IN_A_ROW`] deliveries judged run out
//! in a row, what was learned is dropped and deliveries are handed out again (a release does
//! not count a delivery — Service Bus team, Azure/amqpnetlite#342 — so a wrong judgement
//! would otherwise loop forever).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one bucket of offset samples lasts: the offset is the minimum of the current
/// bucket and the one before it.
pub(super) const WINDOW: Duration = Duration::from_secs(60);

/// Deliveries judged run out in a row after which the judgement is distrusted: what was
/// learned is dropped and the next deliveries are handed out (their settlement then tells).
pub(super) const MAX_RUN_OUT_IN_A_ROW: u32 = 16;

/// What the receiver has learned of the broker's locks and clock (milliseconds).
#[derive(Debug)]
pub(super) struct LockClock {
    /// The host's monotonic time that host milliseconds count from.
    anchor: Instant,
    state: Mutex<Learned>,
}

#[derive(Debug, Default)]
struct Learned {
    /// The shortest `locked_until − enqueued_time` seen.
    span_ms: Option<i64>,
    /// The smallest `host − grant` in the current bucket, and when (host ms) it began.
    current: Option<i64>,
    current_since: i64,
    /// The smallest `host − grant` of the bucket before.
    previous: Option<i64>,
    /// The latest `host − grant` sample: what [`LockClock::broker_now`] reads (never ahead of
    /// the broker, by that delivery's wait).
    latest: Option<i64>,
    /// Deliveries judged run out since the last one that was not.
    run_out_in_a_row: u32,
}

impl Learned {
    fn offset(&self) -> Option<i64> {
        match (self.current, self.previous) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Starts a new bucket when the current one is a [`WINDOW`] old.
    fn rotate(&mut self, host: i64) {
        let window = i64::try_from(WINDOW.as_millis()).unwrap_or(i64::MAX);
        if host.saturating_sub(self.current_since) >= window {
            // Two windows without a sample leave nothing of the old ones.
            self.previous = if host.saturating_sub(self.current_since) >= 2 * window {
                None
            } else {
                self.current
            };
            self.current = None;
            self.current_since = host;
        }
    }
}

impl Default for LockClock {
    fn default() -> Self {
        LockClock {
            // tokio's clock: the monotonic clock, paused and advanced in tests and the simulator.
            anchor: tokio::time::Instant::now().into_std(),
            state: Mutex::new(Learned::default()),
        }
    }
}

impl LockClock {
    /// Host milliseconds since the anchor (monotonic).
    fn host(&self, now: Instant) -> i64 {
        i64::try_from(now.saturating_duration_since(self.anchor).as_millis()).unwrap_or(i64::MAX)
    }

    fn learned(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Learns from a delivery taken from the link at host time `now` (its lock's end and its
    /// enqueued time, both broker time).
    pub(super) fn learn(
        &self,
        locked_until: SystemTime,
        enqueued: Option<SystemTime>,
        now: Instant,
    ) {
        let until = millis(locked_until);
        let host = self.host(now);
        let mut learned = self.learned();
        if let Some(span) = enqueued.map(|at| until.saturating_sub(millis(at)))
            && span > 0
        {
            learned.span_ms = Some(learned.span_ms.map_or(span, |s| s.min(span)));
        }
        let Some(span) = learned.span_ms else {
            return;
        };
        let sample = host.saturating_sub(until.saturating_sub(span));
        learned.rotate(host);
        learned.current = Some(learned.current.map_or(sample, |c| c.min(sample)));
        learned.latest = Some(sample);
    }

    /// True when the lock `locked_until` of a delivery taken at host time `now` (and learned
    /// from, [`LockClock::learn`]) ran out while it waited on the link.
    pub(super) fn ran_out(&self, locked_until: SystemTime, now: Instant) -> bool {
        let host = self.host(now);
        let mut learned = self.learned();
        let Some(offset) = learned.offset() else {
            return false;
        };
        if host.saturating_sub(offset) < millis(locked_until) {
            learned.run_out_in_a_row = 0;
            return false;
        }
        learned.run_out_in_a_row += 1;
        if learned.run_out_in_a_row > MAX_RUN_OUT_IN_A_ROW {
            tracing::warn!(
                in_a_row = MAX_RUN_OUT_IN_A_ROW,
                "Every recent delivery looked expired on arrival; relearning the broker's clock."
            );
            let span_ms = learned.span_ms;
            *learned = Learned {
                span_ms,
                current_since: host,
                ..Learned::default()
            };
            return false;
        }
        true
    }

    /// The broker's time at host time `now` as far as it was learned (behind it by the latest
    /// delivery's wait between its grant and its take): what a lock's end is compared with.
    /// `wall` (the host's clock) until anything was learned.
    pub(super) fn broker_now(&self, now: Instant, wall: SystemTime) -> SystemTime {
        let Some(latest) = self.learned().latest else {
            return wall;
        };
        let broker = self.host(now).saturating_sub(latest);
        if broker >= 0 {
            UNIX_EPOCH + Duration::from_millis(broker.unsigned_abs())
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::from_millis(broker.unsigned_abs()))
                .unwrap_or(UNIX_EPOCH)
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

    /// The host as the tests drive it: broker time `t0` is host monotonic time `base`; the
    /// host's wall clock may step, its monotonic clock does not.
    struct Host {
        base: Instant,
        t0: SystemTime,
    }

    impl Host {
        fn new() -> Self {
            Host {
                // Room for a host 2 h behind the broker.
                base: Instant::now() + Duration::from_secs(7200),
                t0: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            }
        }

        /// The host's monotonic time at broker time `at` when the host's monotonic clock is
        /// `skew` seconds off the broker's.
        fn at(&self, at: SystemTime, skew: i64) -> Instant {
            let since = at.duration_since(self.t0).unwrap_or_default();
            let host = self.base + since;
            if skew >= 0 {
                host + Duration::from_secs(skew.unsigned_abs())
            } else {
                host - Duration::from_secs(skew.unsigned_abs())
            }
        }
    }

    /// A lock granted at broker time `granted` (enqueued just before), taken `waited` later on
    /// a host whose monotonic clock is `skew` seconds off the broker's.
    fn judge(
        clock: &LockClock,
        host: &Host,
        granted: SystemTime,
        skew: i64,
        waited: Duration,
    ) -> bool {
        let now = host.at(granted + waited, skew);
        clock.learn(granted + LOCK, Some(granted), now);
        clock.ran_out(granted + LOCK, now)
    }

    #[test]
    fn a_lock_that_waited_past_its_duration_ran_out_whatever_the_hosts_skew() {
        for skew in [0, 60, -60, 3600] {
            let clock = LockClock::default();
            let host = Host::new();
            let t0 = host.t0;
            assert!(
                !judge(&clock, &host, t0, skew, Duration::from_millis(5)),
                "{skew}"
            );
            let t1 = t0 + Duration::from_secs(1);
            assert!(
                !judge(&clock, &host, t1, skew, Duration::from_secs(20)),
                "{skew}"
            );
            let t2 = t0 + Duration::from_secs(2);
            assert!(
                judge(&clock, &host, t2, skew, Duration::from_secs(31)),
                "{skew}"
            );
        }
    }

    #[test]
    fn nothing_is_judged_before_a_span_is_learned() {
        let clock = LockClock::default();
        let host = Host::new();
        let t0 = host.t0;
        // No enqueued time: no span, however stale the lock looks on the host.
        let late = host.at(t0 + Duration::from_secs(600), 0);
        clock.learn(t0, None, late);
        assert!(!clock.ran_out(t0, late));
        assert_eq!(clock.broker_now(late, t0), t0);
    }

    #[test]
    fn the_brokers_time_is_the_hosts_less_the_learned_offset() {
        let clock = LockClock::default();
        let host = Host::new();
        let t0 = host.t0;
        // Taken 5 ms after its grant on a host 60 s ahead.
        assert!(!judge(&clock, &host, t0, 60, Duration::from_millis(5)));
        let later = host.at(t0 + Duration::from_secs(10), 60);
        assert_eq!(
            clock.broker_now(later, UNIX_EPOCH),
            t0 + Duration::from_secs(10) - Duration::from_millis(5)
        );
    }

    /// Learns at `before` (the host's monotonic clock against the broker's, seconds), then
    /// judges 40 fresh locks at `after`: how many were judged run out, and the last 10.
    fn fresh_locks_after_a_step(before: i64, after: i64) -> (usize, Vec<bool>) {
        let clock = LockClock::default();
        let host = Host::new();
        let t0 = host.t0;
        assert!(!judge(&clock, &host, t0, before, Duration::from_millis(5)));
        let judged: Vec<bool> = (1..=40)
            .map(|n| {
                let t = t0 + Duration::from_secs(n);
                judge(&clock, &host, t, after, Duration::from_millis(5))
            })
            .collect();
        let run_out = judged.iter().filter(|r| **r).count();
        (run_out, judged[30..].to_vec())
    }

    /// A host clock step does not reach the judgement at all (the receiver passes
    /// `Instant::now()`); what can still change the relation is the broker's clock, or a host
    /// learned from while its monotonic clock was suspended. protocol3 F3: learned 60 s
    /// behind, then at skew 0: fresh locks look run out only for a bounded run.
    #[test]
    fn after_learning_60_s_behind_fresh_locks_are_handed_out_after_a_bounded_run() {
        let (run_out, last) = fresh_locks_after_a_step(-60, 0);
        assert!(run_out <= MAX_RUN_OUT_IN_A_ROW as usize, "{run_out}");
        assert_eq!(last, [false; 10]);
    }

    /// correctness3 M7: learned at skew 0, then fresh locks at host now + LOCK + 1 s.
    #[test]
    fn after_a_step_of_a_lock_and_a_second_fresh_locks_are_handed_out_after_a_bounded_run() {
        let (run_out, last) = fresh_locks_after_a_step(0, 31);
        assert!(run_out <= MAX_RUN_OUT_IN_A_ROW as usize, "{run_out}");
        assert_eq!(last, [false; 10]);
    }

    #[test]
    fn a_step_the_other_way_judges_nothing_run_out() {
        assert_eq!(fresh_locks_after_a_step(0, -60), (0, vec![false; 10]));
    }

    #[test]
    fn what_is_relearned_after_a_run_still_judges_a_lock_that_ran_out() {
        let clock = LockClock::default();
        let host = Host::new();
        let t0 = host.t0;
        assert!(!judge(&clock, &host, t0, 0, Duration::from_millis(5)));
        for n in 1..=40 {
            judge(
                &clock,
                &host,
                t0 + Duration::from_secs(n),
                60,
                Duration::from_millis(5),
            );
        }
        let t = t0 + Duration::from_secs(50);
        assert!(judge(&clock, &host, t, 60, Duration::from_secs(31)));
    }

    #[test]
    fn a_smaller_backward_step_is_forgotten_within_two_windows() {
        // The broker's clock steps back 20 s: a delivery that waited 15 s (15 s left) looks
        // run out against the old minimum, but not once the window moved on.
        let clock = LockClock::default();
        let host = Host::new();
        let t0 = host.t0;
        assert!(!judge(&clock, &host, t0, 0, Duration::from_millis(5)));
        let t1 = t0 + Duration::from_secs(1);
        assert!(judge(&clock, &host, t1, 20, Duration::from_secs(15)));
        // Fresh deliveries keep coming after the step.
        for n in 2..=130 {
            let t = t0 + Duration::from_secs(n);
            judge(&clock, &host, t, 20, Duration::from_millis(5));
        }
        let t = t0 + Duration::from_secs(131);
        assert!(!judge(&clock, &host, t, 20, Duration::from_secs(15)));
    }

    #[test]
    fn the_brokers_time_does_not_run_ahead_after_its_clock_stepped_back() {
        let clock = LockClock::default();
        let host = Host::new();
        let t0 = host.t0;
        assert!(!judge(&clock, &host, t0, 0, Duration::from_millis(5)));
        let t1 = t0 + Duration::from_secs(1);
        judge(&clock, &host, t1, 60, Duration::from_millis(5));
        let now = host.at(t1 + Duration::from_secs(2), 60);
        assert!(clock.broker_now(now, UNIX_EPOCH) <= t1 + Duration::from_secs(2));
    }
}
