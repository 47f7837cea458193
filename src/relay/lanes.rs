//! One pass's publishing plan: the claimed rows in lanes, one lane per ordering key, and what
//! became of each row.
//!
//! A lane holds the rows of one (destination, session id) in id (write) order, or of one
//! destination when the relay publishes in order ([`super::RelayConfig::ordered`]); a row with
//! no order to keep has a lane of its own. A lane has at most one send in flight, and a row
//! that fails (or does not read) halts its lane: the rows after it go back untried, due when
//! it is, and the key stays held across passes until then. Lanes of a destination share its
//! window; a destination that failed transiently is not tried again in the pass.
//!
//! # A destination's window
//! Sized from what its sends measure, as the receive window is (sb-servicebus `window.rs`):
//! the bandwidth-delay product, [`HEADROOM`] × rate × round trip, where the round trip is the
//! smoothed time from a send to the broker's answer and the rate the rows the destination
//! accepted per second over the pass (from its first send to it). Within a pass the window
//! only grows, as TCP's slow start: one more send per answer while the window was full, so a
//! window that limits the rate doubles per round trip; at the pass's end it is set to what the
//! pass measured, so a destination with few rows or a broker close by carries few sends in
//! flight into the next pass. A failed send sets it to one.
//! It is bounded by the ceiling, [`super::RelayConfig::max_in_flight`] (also the pass's bound
//! across destinations). Order is kept apart from the window: an ordered lane (one session, or
//! a destination with [`super::RelayConfig::ordered`]) has one send in flight whatever the
//! window, so a larger window only overlaps different lanes.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use crate::ports::{MAX_ROWS_PER_STATEMENT, OutboxClaim, OutboxRow, UnreadableRow};

/// An ordering key: a destination and a session id (`None`: the destination's rows without
/// one, kept in order only when the relay is told to).
pub(super) type Key = (String, Option<String>);

/// How far beyond the measured bandwidth-delay product a window reaches: enough for a window
/// that limits the rate to double per round trip (the receive window's headroom).
const HEADROOM: f64 = 2.0;

/// The window for a destination accepting `rate` rows per second with sends answered after
/// `rtt`: [`HEADROOM`] × rate × rtt rounded up, between 1 and `ceiling`.
pub(super) fn window_size(rate: f64, rtt: Duration, ceiling: usize) -> usize {
    let in_transit = (HEADROOM * rate * rtt.as_secs_f64()).ceil();
    // Not finite (or NaN: an unmeasurable rate over a zero round trip): nothing in transit.
    let in_transit = if in_transit.is_finite() && in_transit > 0.0 {
        // Saturates by Rust's float-to-int cast rules.
        in_transit as usize
    } else {
        0
    };
    in_transit.clamp(1, ceiling.max(1))
}

/// How many windows the running relay claims at once ([`claim_size`]).
///
/// A claim is a barrier: its last answers are all in before the next claim's sends start, so
/// each turn of [`super::Relay::run`] ends with a round trip in which no send starts. A window
/// is [`HEADROOM`] × the measured rate × the round trip, so a claim of `CLAIM_WINDOWS` windows
/// is 8 round trips of rows at that rate, and the round trip at the turn's end is at most about
/// 1/8 of the turn: a claim sized so settles at 7/8 of the rate the relay makes with the
/// broker close by (rate r = C ÷ (C ÷ R + RTT) with C = 8 × r × RTT gives r = 7/8 × R), where
/// a claim of one window would settle at 1/2 (issue 42).
pub(super) const CLAIM_WINDOWS: usize = 4;

/// Rows the running relay claims at once: [`CLAIM_WINDOWS`] × the sum of the destinations'
/// carried windows, at least `floor` (the configured batch size: a broker close by or a
/// destination with one send in flight keeps the configured claim), at most [`CLAIM_WINDOWS`]
/// × `max_in_flight` (the pass's ceiling on sends in flight: four of the largest windows; it
/// bounds the rows one claim leases, and so what a relay that crashes leaves to be published
/// again), or `floor` if that is larger; never more than [`MAX_ROWS_PER_STATEMENT`], whatever
/// the configuration (SQL Server would escalate a larger claim to a table lock).
pub(super) fn claim_size(
    windows: &HashMap<String, Window>,
    floor: usize,
    max_in_flight: usize,
) -> usize {
    let floor = floor.clamp(1, MAX_ROWS_PER_STATEMENT);
    let ceiling = max_in_flight
        .max(1)
        .saturating_mul(CLAIM_WINDOWS)
        .min(MAX_ROWS_PER_STATEMENT);
    let in_flight = windows
        .values()
        .fold(0usize, |sum, window| sum.saturating_add(window.size));
    in_flight
        .saturating_mul(CLAIM_WINDOWS)
        .clamp(floor, ceiling.max(floor))
}

/// A destination's window as carried between passes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Window {
    /// Sends it may have in flight.
    pub(super) size: usize,
    /// Its sends' round trip, smoothed as TCP smooths its RTT (RFC 6298: 7/8 of the old plus
    /// 1/8 of the new); `None` before the first answer.
    srtt: Option<Duration>,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            size: 1,
            srtt: None,
        }
    }
}

impl Window {
    fn measured(&mut self, took: Duration) {
        self.srtt = Some(match self.srtt {
            Some(old) => old.mul_f64(7.0 / 8.0) + took.mul_f64(1.0 / 8.0),
            None => took,
        });
    }

    /// The window for `accepted` rows since `since`, at `now`.
    fn sized(&self, accepted: usize, since: SystemTime, now: SystemTime, ceiling: usize) -> usize {
        let rtt = self.srtt.unwrap_or_default();
        let elapsed = now.duration_since(since).unwrap_or_default().max(rtt);
        let rate = accepted as f64 / elapsed.as_secs_f64();
        window_size(rate, rtt, ceiling)
    }
}

/// A destination's sends in this pass: since its first send, how many were accepted.
#[derive(Debug, Clone, Copy)]
struct Sent {
    since: SystemTime,
    accepted: usize,
}

/// A claimed row as the plan sees it.
#[derive(Debug, Clone, Copy)]
enum Entry<'a> {
    Row(&'a OutboxRow),
    Unreadable(&'a UnreadableRow),
}

impl Entry<'_> {
    fn id(&self) -> i64 {
        match self {
            Entry::Row(row) => row.id,
            Entry::Unreadable(row) => row.id,
        }
    }

    /// The row's ordering key, when its order is kept.
    fn key(&self, ordered: bool) -> Option<Key> {
        let (destination, session) = match self {
            Entry::Row(row) => (&row.message.destination, &row.message.session_id),
            Entry::Unreadable(row) => {
                let (destination, session) = row.key.as_ref()?;
                (destination, session)
            }
        };
        (session.is_some() || ordered).then(|| (destination.clone(), session.clone()))
    }

    fn destination(&self) -> Option<&str> {
        match self {
            Entry::Row(row) => Some(&row.message.destination),
            Entry::Unreadable(row) => row.key.as_ref().map(|(d, _)| d.as_str()),
        }
    }
}

#[derive(Debug)]
struct Lane<'a> {
    /// `None`: one row with no order to keep.
    key: Option<Key>,
    entries: VecDeque<Entry<'a>>,
    busy: bool,
    /// When its send in flight started.
    sent_at: SystemTime,
}

/// A failed row: its id, when it is due again, and why (kept as its `last_error`).
pub(super) type Failed = (i64, SystemTime, String);

/// What became of a pass's rows.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Rows the broker accepted, to be marked.
    pub(super) sent: Vec<i64>,
    /// Rows that failed or did not read, with their due time and reason.
    pub(super) failed: Vec<Failed>,
    /// Rows not tried, by the time they become due again.
    pub(super) untried: HashMap<SystemTime, Vec<i64>>,
    /// Rows that did not read (also in `failed`).
    pub(super) quarantined: usize,
}

/// The plan of one pass.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    lanes: Vec<Lane<'a>>,
    /// Sends each destination may have in flight (carried between passes by the relay).
    windows: HashMap<String, Window>,
    in_flight: HashMap<String, usize>,
    sent: HashMap<String, Sent>,
    sending: usize,
    max_in_flight: usize,
    /// Destinations that failed transiently in this pass, with their backoff end.
    down: HashMap<String, SystemTime>,
    /// Ordered keys that wait for an earlier row, until when (carried between passes).
    held: HashMap<Key, SystemTime>,
    outcome: Outcome,
}

impl<'a> Plan<'a> {
    /// The claim in lanes, in the order of each lane's first row; keys still `held` at `now`
    /// keep waiting (their rows go back untried, due with the row they wait for).
    pub(super) fn new(
        claim: &'a OutboxClaim,
        ordered: bool,
        windows: HashMap<String, Window>,
        mut held: HashMap<Key, SystemTime>,
        max_in_flight: usize,
        now: SystemTime,
    ) -> Self {
        held.retain(|_, due| *due > now);
        let mut entries: Vec<Entry<'a>> = claim.rows.iter().map(Entry::Row).collect();
        entries.extend(claim.unreadable.iter().map(Entry::Unreadable));
        entries.sort_by_key(Entry::id);
        let mut lanes: Vec<Lane<'a>> = Vec::new();
        let mut index: HashMap<Key, usize> = HashMap::new();
        let mut outcome = Outcome::default();
        for entry in entries {
            let key = entry.key(ordered);
            if let Some(due) = key.as_ref().and_then(|key| held.get(key)) {
                outcome.untried.entry(*due).or_default().push(entry.id());
                continue;
            }
            match key.as_ref().and_then(|key| index.get(key)) {
                Some(&at) => lanes[at].entries.push_back(entry),
                None => {
                    if let Some(key) = &key {
                        index.insert(key.clone(), lanes.len());
                    }
                    lanes.push(Lane {
                        key,
                        entries: VecDeque::from([entry]),
                        busy: false,
                        sent_at: now,
                    });
                }
            }
        }
        Plan {
            lanes,
            windows,
            in_flight: HashMap::new(),
            sent: HashMap::new(),
            sending: 0,
            max_in_flight: max_in_flight.max(1),
            down: HashMap::new(),
            held,
            outcome,
        }
    }

    /// The rows to send now, each with its lane: the first row of every idle lane while the
    /// pass and its destination have room. When `stopping`, every row not started goes back
    /// untried; a row that does not read is quarantined with `backoff(attempts)`.
    pub(super) fn ready(
        &mut self,
        now: SystemTime,
        stopping: bool,
        backoff: impl Fn(u32) -> Duration,
    ) -> Vec<(usize, &'a OutboxRow)> {
        let mut start = Vec::new();
        for at in 0..self.lanes.len() {
            if self.lanes[at].busy {
                continue;
            }
            let Some(entry) = self.lanes[at].entries.front().copied() else {
                continue;
            };
            if stopping {
                self.halt(at, now);
                continue;
            }
            if let Some(due) = entry.destination().and_then(|d| self.down.get(d)).copied() {
                self.halt(at, due);
                continue;
            }
            let row = match entry {
                Entry::Unreadable(row) => {
                    self.quarantine(at, row, now + backoff(row.attempts));
                    continue;
                }
                Entry::Row(row) => row,
            };
            if self.sending >= self.max_in_flight {
                break;
            }
            let destination = row.message.destination.as_str();
            let window = self.windows.get(destination).map_or(1, |w| w.size);
            let busy = self.in_flight.entry(destination.to_owned()).or_default();
            if *busy >= window {
                continue;
            }
            *busy += 1;
            self.sending += 1;
            self.sent.entry(destination.to_owned()).or_insert(Sent {
                since: now,
                accepted: 0,
            });
            self.lanes[at].busy = true;
            self.lanes[at].sent_at = now;
            self.lanes[at].entries.pop_front();
            start.push((at, row));
        }
        start
    }

    /// Records the broker's answer for `row` of lane `at`, come at `now`: accepted, or failed
    /// with its due time, reason and whether it was transient (the destination is then down for
    /// the pass).
    pub(super) fn answered(
        &mut self,
        at: usize,
        row: &OutboxRow,
        failure: Option<(SystemTime, String, bool)>,
        now: SystemTime,
    ) {
        let destination = row.message.destination.as_str();
        self.sending = self.sending.saturating_sub(1);
        let mut limited = false;
        if let Some(busy) = self.in_flight.get_mut(destination) {
            limited = *busy >= self.windows.get(destination).map_or(1, |w| w.size);
            *busy = busy.saturating_sub(1);
        }
        self.lanes[at].busy = false;
        let took = now
            .duration_since(self.lanes[at].sent_at)
            .unwrap_or_default();
        let max = self.max_in_flight;
        let window = self.windows.entry(destination.to_owned()).or_default();
        window.measured(took);
        match failure {
            None => {
                // Slow start: one more per answer while the window was full, so a window that
                // limits the rate doubles per round trip (the rate over the pass so far lags
                // too far behind to size it: it would grow by about two per round trip).
                if limited {
                    window.size = (window.size + 1).min(max);
                }
                if let Some(sent) = self.sent.get_mut(destination) {
                    sent.accepted += 1;
                }
                self.outcome.sent.push(row.id);
            }
            Some((due, reason, transient)) => {
                window.size = 1;
                if transient {
                    self.down.insert(destination.to_owned(), due);
                }
                self.outcome.failed.push((row.id, due, reason));
                self.halt(at, due);
            }
        }
    }

    /// Quarantines an unreadable row: it fails at once, and halts its lane.
    fn quarantine(&mut self, at: usize, row: &UnreadableRow, due: SystemTime) {
        self.lanes[at].entries.pop_front();
        self.outcome.quarantined += 1;
        self.outcome.failed.push((row.id, due, row.reason.clone()));
        self.halt(at, due);
    }

    /// Hands the rest of lane `at` back untried, due at `due`; an ordered key waits until then
    /// in later passes too (rows of it claimed later must not overtake the failed row).
    fn halt(&mut self, at: usize, due: SystemTime) {
        let lane = &mut self.lanes[at];
        // Held even with nothing left here: the key's later rows may be in a later claim.
        if let Some(key) = &lane.key {
            let held = self.held.entry(key.clone()).or_insert(due);
            *held = (*held).max(due);
        }
        if !lane.entries.is_empty() {
            let untried = self.outcome.untried.entry(due).or_default();
            untried.extend(lane.entries.drain(..).map(|entry| entry.id()));
        }
    }

    /// The outcome, the windows and the keys still held, for the relay to keep; each window
    /// set to what the pass measured at `now`. Only the windows of destinations this pass sent
    /// to are kept (one absent starts at 1 again), so the map holds no more than a pass's
    /// destinations however many were ever used.
    pub(super) fn finish(
        self,
        now: SystemTime,
    ) -> (Outcome, HashMap<String, Window>, HashMap<Key, SystemTime>) {
        let mut windows = self.windows;
        let max = self.max_in_flight;
        windows.retain(|destination, window| {
            let Some(sent) = self.sent.get(destination) else {
                return false;
            };
            // A failed destination starts again at one, as in the pass.
            if window.size > 1 {
                window.size = window.sized(sent.accepted, sent.since, now, max);
            }
            true
        });
        (self.outcome, windows, self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn windows(sizes: &[usize]) -> HashMap<String, Window> {
        sizes
            .iter()
            .enumerate()
            .map(|(n, &size)| (format!("d{n}"), Window { size, srtt: None }))
            .collect()
    }

    /// The running relay claims four windows over all destinations, between the batch size
    /// and four times `max_in_flight`: with nothing measured (or a broker close by) the batch
    /// size.
    #[test]
    fn a_claim_spans_four_windows_between_the_batch_size_and_the_ceiling() {
        assert_eq!(claim_size(&windows(&[]), 100, 1000), 100);
        assert_eq!(claim_size(&windows(&[1, 3]), 100, 1000), 100);
        assert_eq!(claim_size(&windows(&[50]), 100, 1000), 200);
        assert_eq!(claim_size(&windows(&[50, 25]), 100, 1000), 300);
        assert_eq!(claim_size(&windows(&[400]), 100, 1000), 1600);
        assert_eq!(claim_size(&windows(&[1000, 1000]), 100, 1000), 4000);
        assert_eq!(claim_size(&windows(&[usize::MAX]), 100, 1000), 4000);
        assert_eq!(claim_size(&windows(&[400]), 100, 16), 100);
        // A batch larger than the ceiling is still claimed whole, as configured.
        assert_eq!(claim_size(&windows(&[400]), 2000, 100), 2000);
        assert_eq!(claim_size(&windows(&[]), 0, 0), 1);
    }

    /// No configuration makes a claim larger than one statement may lock on SQL Server without
    /// escalating to a table lock: not `max_in_flight` above 1000 with its windows full, not a
    /// batch size above the cap.
    #[test]
    fn a_claim_never_exceeds_the_rows_one_statement_may_lock() {
        let cap = MAX_ROWS_PER_STATEMENT;
        assert_eq!(claim_size(&windows(&[5000]), 100, 5000), cap);
        assert_eq!(claim_size(&windows(&[5000, 5000]), 100, 5000), cap);
        assert_eq!(claim_size(&windows(&[usize::MAX]), 100, usize::MAX), cap);
        assert_eq!(claim_size(&windows(&[]), 10_000, 1000), cap);
        assert_eq!(claim_size(&windows(&[400]), 5000, 1000), cap);
        // Below the cap the windows still decide.
        assert_eq!(claim_size(&windows(&[900]), 100, 5000), 3600);
    }

    /// The window is the bandwidth-delay product with its headroom, rounded up.
    #[test]
    fn a_window_covers_twice_the_rows_in_transit() {
        assert_eq!(window_size(1000.0, 10 * MS, 64), 20);
        assert_eq!(window_size(150.0, 10 * MS, 64), 3);
    }

    /// A window that limits the rate (w sends per round trip) doubles.
    #[test]
    fn a_window_that_limits_the_rate_doubles() {
        for w in [1_usize, 2, 5, 16] {
            let rtt = 40 * MS;
            let rate = w as f64 / rtt.as_secs_f64();
            assert_eq!(window_size(rate, rtt, 1024), 2 * w);
        }
    }

    /// Bounded by the ceiling above and one below, whatever is measured.
    #[test]
    fn a_window_stays_between_one_and_its_ceiling() {
        assert_eq!(window_size(1e6, 40 * MS, 64), 64);
        assert_eq!(window_size(f64::INFINITY, 10 * MS, 64), 1);
        assert_eq!(window_size(f64::INFINITY, Duration::ZERO, 64), 1);
        assert_eq!(window_size(f64::NAN, 10 * MS, 64), 1);
        assert_eq!(window_size(0.0, 10 * MS, 64), 1);
        assert_eq!(
            window_size(5000.0, Duration::ZERO, 64),
            1,
            "a broker close by"
        );
        assert_eq!(window_size(1e6, 40 * MS, 0), 1, "a ceiling of 0 is 1");
    }

    /// The pass's measure: the rows accepted over the time since the first send, at least one
    /// round trip.
    #[test]
    fn a_window_is_sized_from_the_pass_rate_and_the_smoothed_round_trip() {
        let mut window = Window::default();
        window.measured(10 * MS);
        window.measured(18 * MS);
        assert_eq!(window.srtt, Some(11 * MS));
        let since = SystemTime::UNIX_EPOCH;
        // 50 rows in 100 ms: 500/s × 11 ms × 2 = 11.
        assert_eq!(window.sized(50, since, since + 100 * MS, 64), 11);
        // One answer right away: the rate is taken over one round trip, not zero time.
        assert_eq!(window.sized(1, since, since, 64), 2);
    }

    fn row(id: i64, session: Option<&str>) -> OutboxRow {
        let mut message = crate::ports::OutboxMessage::new("a", "t.v1", Vec::new());
        message.session_id = session.map(str::to_owned);
        OutboxRow {
            id,
            message,
            attempts: 1,
            created_at: SystemTime::UNIX_EPOCH,
        }
    }

    /// The most sends in flight at once: to the destination, and of the session's lane.
    #[derive(Debug, Default)]
    struct Peaks {
        destination: usize,
        session: usize,
    }

    /// One pass over `claim` with every send accepted `rtt` after it started; asserts at every
    /// step that the destination's sends in flight stay within its window and the ceiling.
    /// Returns the carried windows and the peaks.
    fn pass(
        claim: &OutboxClaim,
        windows: HashMap<String, Window>,
        rtt: Duration,
        ceiling: usize,
    ) -> (HashMap<String, Window>, Peaks) {
        let mut now = SystemTime::UNIX_EPOCH;
        let mut plan = Plan::new(claim, false, windows, HashMap::new(), ceiling, now);
        let mut flying: Vec<(SystemTime, usize, &OutboxRow)> = Vec::new();
        let mut peaks = Peaks::default();
        loop {
            for (at, row) in plan.ready(now, false, |_| Duration::ZERO) {
                flying.push((now + rtt, at, row));
            }
            let window = plan.windows.get("a").map_or(1, |w| w.size);
            assert!(
                flying.len() <= window,
                "{} in flight, window {window}",
                flying.len()
            );
            assert!(
                window <= ceiling,
                "window {window} past the ceiling {ceiling}"
            );
            let session = flying
                .iter()
                .filter(|(_, _, row)| row.message.session_id.is_some())
                .count();
            peaks.destination = peaks.destination.max(flying.len());
            peaks.session = peaks.session.max(session);
            flying.sort_by_key(|(due, _, _)| *due);
            if flying.is_empty() {
                break;
            }
            let (due, at, row) = flying.remove(0);
            now = due;
            plan.answered(at, row, None, now);
        }
        let (outcome, windows, _) = plan.finish(now);
        assert_eq!(outcome.sent.len(), claim.rows.len());
        (windows, peaks)
    }

    /// A destination with rows waiting, 10 ms away: its window grows to the ceiling and no
    /// further, and the session's lane among its rows keeps one send in flight however large
    /// the window.
    #[test]
    fn the_window_grows_to_its_ceiling_and_an_ordered_lane_sends_one_at_a_time() {
        let rows = (1..=300)
            .map(|id| row(id, (id % 10 == 0).then_some("s")))
            .collect();
        let claim = OutboxClaim {
            rows,
            unreadable: Vec::new(),
        };
        let (windows, peaks) = pass(&claim, HashMap::new(), 10 * MS, 32);
        assert_eq!(peaks.destination, 32);
        assert_eq!(peaks.session, 1);
        assert!(windows["a"].size > 1, "carried: {windows:?}");
    }

    /// A destination with few rows per pass keeps the window they need, not the ceiling: the
    /// window carried from a full pass falls to what a pass of 4 rows measured.
    #[test]
    fn few_rows_per_pass_carry_a_small_window() {
        let full = OutboxClaim {
            rows: (1..=300).map(|id| row(id, None)).collect(),
            unreadable: Vec::new(),
        };
        let (windows, _) = pass(&full, HashMap::new(), 10 * MS, 64);
        let big = windows["a"].size;
        let few = OutboxClaim {
            rows: (301..=304).map(|id| row(id, None)).collect(),
            unreadable: Vec::new(),
        };
        let (windows, peaks) = pass(&few, windows, 10 * MS, 64);
        assert_eq!(peaks.destination, 4, "the four overlap");
        let small = windows["a"].size;
        assert!(small < big && small <= 8, "from {big} to {small}");
    }
}
