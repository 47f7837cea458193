//! The receive window of a pipelined receiver: how many deliveries it keeps in flight (credit on
//! the link, transfers on their way, deliveries handed out and not yet being settled), sized
//! from what it measures so that the broker's distance needs no tuning.
//!
//! # Algorithm
//! A delivery costs the window from the credit that asked for it until its settlement starts:
//! one round trip for the transfer to arrive, then the caller's queue and transaction. Its
//! settlement's own round trip is not counted (it holds no slot and its lock needs no
//! renewal); settlements in flight are bounded apart, at [`SETTLING_FACTOR`] × the window.
//!
//! To keep the caller busy the window must cover what it takes while a credit travels: the
//! bandwidth-delay product, taken rate × round trip. The receiver measures both:
//! - the round trip as the broker's answer to a disposition on the link (a smoothed mean);
//! - the rate as the deliveries taken per [`SAMPLE_PERIOD`], and its highest sample over the
//!   last [`PEAK_HOLD`]: the bandwidth-delay product is taken at that peak, so that a lull of
//!   a few sample periods (arrivals are bursty) does not shrink the window the next burst
//!   needs; BBR keeps its bottleneck bandwidth as a windowed maximum of the delivery rate for
//!   the same reason (Cardwell et al., "BBR: Congestion-Based Congestion Control", ACM Queue
//!   14(5), 2016).
//!
//! [`window_size`] keeps `base + HEADROOM × peak rate × rtt`: `base` is what the caller handles
//! at once (its slots), so that each has a delivery waiting; the headroom lets a window that
//! limits the rate grow: limited, the rate is `window ÷ (rtt + service)`, and twice that times
//! the round trip exceeds the window whenever the round trip exceeds the service time, so the
//! window doubles per sample until the caller's slots, not the distance, bound the rate. The
//! result is bounded by the ceiling (the receiver's capacity), by memory
//! ([`WINDOW_MEMORY_BUDGET`] ÷ the mean message size) and by the lock: what waits beyond the
//! caller's slots drains at the rate, and must not wait longer than [`LOCK_WAIT_FRACTION`] of the
//! lock time left at receipt (a delivery's lock runs from the moment the broker sends it,
//! learn.microsoft.com/azure/service-bus-messaging/service-bus-prefetch: "the lock timer starts
//! when the message is prefetched").

use std::time::Duration;

use tokio::time::Instant;

/// The default ceiling of a self-sizing window, in deliveries: 2 × 4400 msg/s (a local
/// worker's rate on the reference workload) × 40 ms (a cross-region round trip) plus slots,
/// rounded up. A caller that handles more at once than half of it gets twice its slots.
pub const AUTO_WINDOW_CEILING: u32 = 512;

/// The memory the window's deliveries may take, in bytes of message: with the mean message
/// size measured, the window holds at most this much.
pub const WINDOW_MEMORY_BUDGET: u64 = 32 * 1024 * 1024;

/// A delivery beyond the caller's slots may wait at most `1 / LOCK_WAIT_FRACTION` of its lock
/// time before a slot takes it: the rest stays for the handler and the renewals' margin.
pub const LOCK_WAIT_FRACTION: u32 = 4;

/// Settlements in flight (started, not answered) are bounded at this many windows: a slow
/// broker then stops new credit instead of piling up unanswered dispositions.
pub const SETTLING_FACTOR: u32 = 2;

/// How far beyond the measured bandwidth-delay product the window reaches: enough for a window
/// that limits the rate to grow (see the module's algorithm).
const HEADROOM: f64 = 2.0;

/// How often the rate is sampled and the window recomputed.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// How long the highest rate sampled keeps the window: a lull shorter than this does not
/// shrink it. Past it (an idle link, a rate that fell for good) the window follows the rate.
pub const PEAK_HOLD: Duration = Duration::from_secs(1);

/// A receive that waited on a link with credit longer than this many round trips (plus
/// [`IDLE_SLACK`]) found the broker with nothing to send: the time beyond it is idle, not a
/// measure of how fast the pipeline takes deliveries. A delivery asked for arrives within one
/// round trip; the second is margin, so that a window that limits the rate (each credit
/// answered a round trip after it was granted) never counts as idle.
const IDLE_AFTER_ROUND_TRIPS: u32 = 2;

/// Scheduling slack on top of [`IDLE_AFTER_ROUND_TRIPS`] (a local broker's round trip is well
/// under a millisecond, a busy host's wake-up is not).
const IDLE_SLACK: Duration = Duration::from_millis(5);

/// How often the window is logged under `sb_inbox::pipeline` (as the runtime's phase trace).
const REPORT_EVERY: Duration = Duration::from_secs(2);

/// A receiver's window as it stands ([`crate::ServiceBusReceiver::window`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct WindowSnapshot {
    /// Deliveries kept in flight: credit and transfers on the link plus those handed out and
    /// not being settled.
    pub window: u32,
    /// The broker's round trip as measured (`None` before the first answer, or not
    /// self-sizing).
    pub rtt: Option<Duration>,
    /// Deliveries taken per second, as last sampled.
    pub rate: f64,
    /// Settlements started and not answered yet (outside the window).
    pub settling: usize,
}

/// What [`window_size`] decides from: all measured or configured, no clock read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowInputs {
    /// What the caller handles at once (its slots): the window never goes below it, unless
    /// memory says so.
    pub base: u32,
    /// The most the window may reach (the receiver's capacity).
    pub ceiling: u32,
    /// Deliveries taken per second, as last sampled: what bounds the wait by the lock (a
    /// delivery beyond the slots drains at the rate of now, not at a past peak).
    pub rate: f64,
    /// The highest rate sampled over the last [`PEAK_HOLD`]: what the bandwidth-delay product
    /// is taken at (never below `rate`).
    pub peak_rate: f64,
    /// The broker's round trip, as measured (zero before the first answer).
    pub rtt: Duration,
    /// The mean size of a message's body and properties, in bytes (0: unknown).
    pub mean_message_bytes: u64,
    /// What the window's messages may take, in bytes ([`WINDOW_MEMORY_BUDGET`]).
    pub memory_budget: u64,
    /// The shortest lock time left at receipt lately (`None`: unknown).
    pub lock_left: Option<Duration>,
}

/// The window for `inputs`: `base + HEADROOM × peak rate × rtt`, at most the lock's share
/// (`base + rate × lock_left ÷ LOCK_WAIT_FRACTION`, at the rate of now), the ceiling and the
/// memory budget, and at least one delivery.
#[must_use]
pub fn window_size(inputs: &WindowInputs) -> u32 {
    let rate = sane_rate(inputs.rate);
    let peak = sane_rate(inputs.peak_rate).max(rate);
    let in_transit = peak * inputs.rtt.as_secs_f64() * HEADROOM;
    let mut window = u64::from(inputs.base).saturating_add(whole(in_transit.ceil()));
    if let Some(lock) = inputs.lock_left {
        let waiting = rate * lock.as_secs_f64() / f64::from(LOCK_WAIT_FRACTION);
        window = window.min(u64::from(inputs.base).saturating_add(whole(waiting.floor())));
    }
    window = window.min(u64::from(inputs.ceiling));
    if let Some(fits) = inputs.memory_budget.checked_div(inputs.mean_message_bytes) {
        window = window.min(fits);
    }
    u32::try_from(window.max(1)).unwrap_or(u32::MAX)
}

/// A rate as a finite non-negative number (a nonsense one counts as none).
fn sane_rate(rate: f64) -> f64 {
    if rate.is_finite() { rate.max(0.0) } else { 0.0 }
}

/// A non-negative float as a whole count (saturating).
fn whole(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        // Saturates at u64::MAX by Rust's float-to-int cast rules.
        x as u64
    } else {
        0
    }
}

/// The measurements behind a receiver's window, and the window they give.
#[derive(Debug)]
pub(crate) struct Sizer {
    base: u32,
    rate: f64,
    /// The rates sampled over the last [`PEAK_HOLD`], with when each sample ended.
    recent: std::collections::VecDeque<(Instant, f64)>,
    rtt: Option<Duration>,
    mean_bytes: Option<f64>,
    lock_left: Option<Duration>,
    /// The shortest lock left seen in the current sample.
    sample_lock: Option<Duration>,
    sample_start: Option<Instant>,
    sample_taken: u32,
    window: u32,
    last_report: Option<Instant>,
}

/// A snapshot of the window for telemetry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WindowState {
    pub(crate) window: u32,
    pub(crate) rtt: Option<Duration>,
    pub(crate) rate: f64,
}

impl Sizer {
    /// Starts at `base` (nothing measured yet).
    pub(crate) fn new(base: u32) -> Self {
        Sizer {
            base,
            rate: 0.0,
            recent: std::collections::VecDeque::new(),
            rtt: None,
            mean_bytes: None,
            lock_left: None,
            sample_lock: None,
            sample_start: None,
            sample_taken: 0,
            window: base.max(1),
            last_report: None,
        }
    }

    /// The window as last computed, at most `ceiling`.
    pub(crate) fn window(&self, ceiling: u32) -> u32 {
        self.window.min(ceiling).max(1)
    }

    pub(crate) fn state(&self, ceiling: u32) -> WindowState {
        WindowState {
            window: self.window(ceiling),
            rtt: self.rtt,
            rate: self.rate,
        }
    }

    /// Records the rate just sampled at `now` and returns the highest over the last
    /// [`PEAK_HOLD`].
    fn peak_rate(&mut self, now: Instant) -> f64 {
        while self
            .recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > PEAK_HOLD)
        {
            self.recent.pop_front();
        }
        self.recent.push_back((now, self.rate));
        self.recent
            .iter()
            .map(|(_, rate)| *rate)
            .fold(0.0, f64::max)
    }

    /// A broker round trip measured (a disposition answered on the link): smoothed as TCP
    /// smooths its RTT (RFC 6298: 7/8 of the old plus 1/8 of the new).
    pub(crate) fn round_trip(&mut self, sample: Duration) {
        self.rtt = Some(match self.rtt {
            None => sample,
            Some(rtt) => (rtt * 7 + sample) / 8,
        });
    }

    /// A receive waited `waited` on a link with credit before its delivery came, with
    /// `in_hand` deliveries handed out. Longer than [`IDLE_AFTER_ROUND_TRIPS`] round trips and
    /// [`IDLE_SLACK`], with a slot free for the delivery, the link was idle: the broker had
    /// nothing to send and the caller was keeping up. The sample under way is then dropped and
    /// the window kept as it is: an idle gap measures neither the pipeline nor the caller, and
    /// the window the last busy samples gave is what the next burst needs (BBR likewise keeps
    /// application-limited samples from lowering its bandwidth estimate: Cheng et al., "Delivery
    /// Rate Estimation", IETF draft-cheng-iccrg-delivery-rate-estimation, 2017). With
    /// deliveries waiting beyond the slots the sample goes on: its rate is what bounds their
    /// wait by the lock.
    pub(crate) fn waited(&mut self, waited: Duration, in_hand: usize) {
        let expected = self.rtt.unwrap_or_default() * IDLE_AFTER_ROUND_TRIPS + IDLE_SLACK;
        let slot_free = u32::try_from(in_hand).is_ok_and(|held| held < self.base);
        if waited > expected && slot_free {
            self.sample_start = None;
            self.sample_taken = 0;
            self.sample_lock = None;
        }
    }

    /// A delivery taken at `now`, of `bytes`, with `lock_left` of its lock; once a sample
    /// period has passed (since the sample began: an idle gap drops it, see [`Sizer::waited`]),
    /// the rate is sampled and the window recomputed under `ceiling`. Returns the new state
    /// when it is time to report it.
    pub(crate) fn taken(
        &mut self,
        now: Instant,
        bytes: usize,
        lock_left: Option<Duration>,
        ceiling: u32,
    ) -> Option<WindowState> {
        let bytes = bytes as f64;
        self.mean_bytes = Some(match self.mean_bytes {
            None => bytes,
            Some(mean) => mean + (bytes - mean) / 16.0,
        });
        if let Some(left) = lock_left {
            self.sample_lock = Some(self.sample_lock.map_or(left, |l| l.min(left)));
        }
        self.sample_taken = self.sample_taken.saturating_add(1);
        let start = *self.sample_start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        if elapsed < SAMPLE_PERIOD {
            return None;
        }
        self.rate = f64::from(self.sample_taken) / elapsed.as_secs_f64();
        let peak_rate = self.peak_rate(now);
        self.lock_left = self.sample_lock.take();
        self.sample_taken = 0;
        self.sample_start = Some(now);
        self.window = window_size(&WindowInputs {
            base: self.base,
            ceiling,
            rate: self.rate,
            peak_rate,
            rtt: self.rtt.unwrap_or_default(),
            mean_message_bytes: whole(self.mean_bytes.unwrap_or(0.0)),
            memory_budget: WINDOW_MEMORY_BUDGET,
            lock_left: self.lock_left,
        });
        let due = self
            .last_report
            .is_none_or(|last| now.saturating_duration_since(last) >= REPORT_EVERY);
        due.then(|| {
            self.last_report = Some(now);
            self.state(ceiling)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(rate: f64, rtt_ms: u64) -> WindowInputs {
        WindowInputs {
            base: 16,
            ceiling: AUTO_WINDOW_CEILING,
            rate,
            peak_rate: 0.0,
            rtt: Duration::from_millis(rtt_ms),
            mean_message_bytes: 0,
            memory_budget: WINDOW_MEMORY_BUDGET,
            lock_left: None,
        }
    }

    #[test]
    fn the_window_is_the_slots_plus_twice_the_bandwidth_delay_product() {
        // Local: nothing in transit.
        assert_eq!(window_size(&inputs(4000.0, 0)), 16);
        // 4000/s over 10 ms: 40 in transit, twice that as headroom.
        assert_eq!(window_size(&inputs(4000.0, 10)), 16 + 80);
        // Idle: the slots only.
        assert_eq!(window_size(&inputs(0.0, 40)), 16);
        // A nonsense rate counts as none.
        assert_eq!(window_size(&inputs(f64::NAN, 40)), 16);
        assert_eq!(window_size(&inputs(-5.0, 40)), 16);
    }

    #[test]
    fn the_ceiling_bounds_the_window() {
        assert_eq!(window_size(&inputs(4000.0, 40)), 16 + 320);
        assert_eq!(window_size(&inputs(10_000.0, 40)), AUTO_WINDOW_CEILING);
        assert_eq!(window_size(&inputs(f64::INFINITY, 40)), 16);
        let tight = WindowInputs {
            ceiling: 20,
            ..inputs(4000.0, 10)
        };
        assert_eq!(window_size(&tight), 20);
    }

    #[test]
    fn memory_bounds_the_window_even_below_the_slots() {
        let large = WindowInputs {
            mean_message_bytes: 1024 * 1024,
            ..inputs(4000.0, 40)
        };
        assert_eq!(window_size(&large), 32);
        let huge = WindowInputs {
            mean_message_bytes: 100 * 1024 * 1024,
            ..inputs(4000.0, 40)
        };
        assert_eq!(window_size(&huge), 1, "at least one delivery");
        let small = WindowInputs {
            mean_message_bytes: 400,
            ..inputs(4000.0, 40)
        };
        assert_eq!(window_size(&small), 16 + 320);
    }

    #[test]
    fn what_waits_beyond_the_slots_drains_within_a_quarter_of_the_lock() {
        // 100/s with 2 s of lock left: at most 50 beyond the slots (0.5 s of taking).
        let short_lock = WindowInputs {
            lock_left: Some(Duration::from_secs(2)),
            ..inputs(100.0, 400)
        };
        assert_eq!(window_size(&short_lock), 16 + 50);
        // A long lock does not bind.
        let long_lock = WindowInputs {
            lock_left: Some(Duration::from_secs(60)),
            ..inputs(100.0, 400)
        };
        assert_eq!(window_size(&long_lock), 16 + 80);
        // A lock already gone leaves the slots only.
        let gone = WindowInputs {
            lock_left: Some(Duration::ZERO),
            ..inputs(100.0, 400)
        };
        assert_eq!(window_size(&gone), 16);
    }

    #[test]
    fn the_bounds_hold_for_any_input() {
        for base in [1, 16, 512] {
            for ceiling in [1, 16, 64, 512, 4096] {
                for rate in [0.0, 1.0, 100.0, 5000.0, 1e12] {
                    for (rtt, peak_rate) in
                        [(0, 0.0), (1, 1e12), (10, 5000.0), (40, 0.0), (1000, 1e12)]
                    {
                        for bytes in [0, 100, 1 << 20, 1 << 30] {
                            for lock in [None, Some(0), Some(1), Some(60)] {
                                let i = WindowInputs {
                                    base,
                                    ceiling,
                                    rate,
                                    peak_rate,
                                    rtt: Duration::from_millis(rtt),
                                    mean_message_bytes: bytes,
                                    memory_budget: WINDOW_MEMORY_BUDGET,
                                    lock_left: lock.map(Duration::from_secs),
                                };
                                let w = window_size(&i);
                                assert!(w >= 1, "{i:?}");
                                assert!(w <= ceiling.max(1), "{i:?}: {w}");
                                if let Some(fits) = WINDOW_MEMORY_BUDGET.checked_div(bytes) {
                                    assert!(u64::from(w) <= fits.max(1), "{i:?}: {w}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_that_limits_the_rate_grows_until_the_slots_do() {
        // A model caller: 16 slots, 4 ms per transaction, the broker 40 ms away. Each sample
        // period takes what the window allows: window ÷ (rtt + service), at most 16 ÷ service.
        let (slots, service, rtt) = (16.0, 0.004, Duration::from_millis(40));
        let mut sizer = Sizer::new(16);
        sizer.round_trip(rtt);
        let mut window = sizer.window(AUTO_WINDOW_CEILING);
        for _ in 0..20 {
            let rate = (f64::from(window) / (rtt.as_secs_f64() + service)).min(slots / service);
            let taken = (rate * SAMPLE_PERIOD.as_secs_f64()) as u32;
            let start = Instant::now();
            for i in 0..taken {
                let at = start + SAMPLE_PERIOD * i / taken;
                sizer.taken(at, 300, Some(Duration::from_secs(30)), AUTO_WINDOW_CEILING);
            }
            tokio::time::advance(SAMPLE_PERIOD).await;
            sizer.taken(
                Instant::now(),
                300,
                Some(Duration::from_secs(30)),
                AUTO_WINDOW_CEILING,
            );
            window = sizer.window(AUTO_WINDOW_CEILING);
        }
        // 4000/s over 40 ms is 160 in transit; the window covers it and the slots.
        assert!(window >= 16 + 160, "{window}");
        assert!(window <= AUTO_WINDOW_CEILING, "{window}");
    }

    #[test]
    fn the_peak_rate_sizes_the_transit_and_the_rate_of_now_the_lock_share() {
        let lull = WindowInputs {
            peak_rate: 4000.0,
            ..inputs(100.0, 10)
        };
        assert_eq!(
            window_size(&lull),
            16 + 80,
            "the peak's bandwidth-delay product"
        );
        let short_lock = WindowInputs {
            lock_left: Some(Duration::from_secs(2)),
            ..lull
        };
        assert_eq!(
            window_size(&short_lock),
            16 + 50,
            "what waits beyond the slots drains at the rate of now within a quarter of the lock"
        );
    }

    /// Feeds `sizer` `rate` deliveries per second for `samples` sample periods (paused clock)
    /// and returns the window after.
    async fn run_at(sizer: &mut Sizer, rate: f64, samples: u32) -> u32 {
        for _ in 0..samples {
            let taken = (rate * SAMPLE_PERIOD.as_secs_f64()) as u32;
            let start = Instant::now();
            for i in 0..taken {
                let at = start + SAMPLE_PERIOD * i / taken.max(1);
                sizer.taken(at, 300, Some(Duration::from_secs(60)), AUTO_WINDOW_CEILING);
            }
            tokio::time::advance(SAMPLE_PERIOD).await;
        }
        sizer.window(AUTO_WINDOW_CEILING)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lull_shorter_than_the_peak_hold_does_not_shrink_the_window() {
        let mut sizer = Sizer::new(16);
        sizer.round_trip(Duration::from_millis(40));
        let busy = run_at(&mut sizer, 2000.0, 5).await;
        // 2000/s over 40 ms: 80 in transit, twice that as headroom.
        assert!((16 + 150..=16 + 170).contains(&busy), "{busy}");
        let lull = run_at(&mut sizer, 100.0, 3).await;
        assert_eq!(lull, busy, "a lull of 300 ms keeps the window");
        let after = run_at(&mut sizer, 100.0, 12).await;
        assert!(
            after <= 16 + 10,
            "past the hold it follows the rate: {after}"
        );
        assert!(after >= 16, "{after}");
    }

    /// Takes `per_ms` deliveries each millisecond for `ms` (paused clock), each receive
    /// having waited under a millisecond, with `in_hand` handed out.
    async fn busy_for(sizer: &mut Sizer, per_ms: u32, ms: u32, in_hand: usize, lock: Duration) {
        for _ in 0..ms {
            tokio::time::advance(Duration::from_millis(1)).await;
            for _ in 0..per_ms {
                sizer.waited(Duration::from_micros(500), in_hand);
                sizer.taken(Instant::now(), 300, Some(lock), AUTO_WINDOW_CEILING);
            }
        }
    }

    /// The link, with credit, sat idle for `gap` with `in_hand` handed out; then one delivery.
    async fn after_gap(sizer: &mut Sizer, gap: Duration, in_hand: usize, lock: Duration) {
        tokio::time::advance(gap).await;
        sizer.waited(gap, in_hand);
        sizer.taken(Instant::now(), 300, Some(lock), AUTO_WINDOW_CEILING);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_gap_keeps_the_window_the_next_burst_needs() {
        let lock = Duration::from_secs(60);
        let mut sizer = Sizer::new(16);
        sizer.round_trip(Duration::from_millis(40));
        busy_for(&mut sizer, 2, 550, 4, lock).await;
        let busy = sizer.window(AUTO_WINDOW_CEILING);
        // 2000/s over 40 ms: 80 in transit, twice that as headroom.
        assert!((16 + 150..=16 + 170).contains(&busy), "{busy}");
        // Three seconds with nothing to receive (past the peak hold), then a burst: it finds
        // the window as the busy link left it, not shrunk to the slots, and keeps it.
        after_gap(&mut sizer, Duration::from_secs(3), 0, lock).await;
        assert_eq!(
            sizer.window(AUTO_WINDOW_CEILING),
            busy,
            "kept across the gap"
        );
        busy_for(&mut sizer, 2, 150, 4, lock).await;
        let burst = sizer.window(AUTO_WINDOW_CEILING);
        assert!((16 + 150..=16 + 170).contains(&burst), "{burst}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_gap_with_deliveries_waiting_beyond_the_slots_still_counts_for_the_lock() {
        // 100/s with a 2 s lock, 400 ms away: the lock binds (16 + 50).
        let lock = Duration::from_secs(2);
        let mut sizer = Sizer::new(16);
        sizer.round_trip(Duration::from_millis(400));
        for _ in 0..50 {
            tokio::time::advance(Duration::from_millis(10)).await;
            sizer.taken(Instant::now(), 300, Some(lock), AUTO_WINDOW_CEILING);
        }
        assert_eq!(sizer.window(AUTO_WINDOW_CEILING), 16 + 50);
        // Every slot busy and more waiting: a long wait on the link is the caller's pace, not
        // idleness, so it is sampled and the lock's share shrinks the window (1 in 10 s).
        after_gap(&mut sizer, Duration::from_secs(10), 20, lock).await;
        assert_eq!(sizer.window(AUTO_WINDOW_CEILING), 16);
    }

    #[tokio::test(start_paused = true)]
    async fn a_receive_answered_within_two_round_trips_is_not_idle() {
        let mut sizer = Sizer::new(16);
        sizer.round_trip(Duration::from_millis(40));
        sizer.taken(Instant::now(), 300, None, AUTO_WINDOW_CEILING);
        // A window that limits the rate: each credit is answered a round trip later.
        sizer.waited(Duration::from_millis(85), 0);
        assert_eq!(sizer.sample_taken, 1, "the sample goes on");
        sizer.waited(Duration::from_millis(86), 0);
        assert_eq!(sizer.sample_taken, 0, "an idle gap drops it");
        assert_eq!(sizer.sample_start, None);
    }

    #[test]
    fn the_round_trip_is_smoothed() {
        let mut sizer = Sizer::new(1);
        sizer.round_trip(Duration::from_millis(80));
        assert_eq!(sizer.rtt, Some(Duration::from_millis(80)));
        sizer.round_trip(Duration::from_millis(0));
        assert_eq!(sizer.rtt, Some(Duration::from_millis(70)));
    }
}
