//! One pass's publishing plan: the claimed rows in lanes, one lane per ordering key, and what
//! became of each row.
//!
//! A lane holds the rows of one (destination, session id) in id (write) order, or of one
//! destination when the relay publishes in order ([`super::RelayConfig::ordered`]); a row with
//! no order to keep has a lane of its own. A lane has at most one send in flight, and a row
//! that fails (or does not read) halts its lane: the rows after it go back untried, due when
//! it is, and the key stays held across passes until then. Lanes of a destination share its
//! window; a destination that failed transiently is not tried again in the pass.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use crate::ports::{OutboxClaim, OutboxRow, UnreadableRow};

/// An ordering key: a destination and a session id (`None`: the destination's rows without
/// one, kept in order only when the relay is told to).
pub(super) type Key = (String, Option<String>);

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
    windows: HashMap<String, usize>,
    in_flight: HashMap<String, usize>,
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
        windows: HashMap<String, usize>,
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
                    });
                }
            }
        }
        Plan {
            lanes,
            windows,
            in_flight: HashMap::new(),
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
            let window = self.windows.get(destination).copied().unwrap_or(1);
            let busy = self.in_flight.entry(destination.to_owned()).or_default();
            if *busy >= window {
                continue;
            }
            *busy += 1;
            self.sending += 1;
            self.lanes[at].busy = true;
            self.lanes[at].entries.pop_front();
            start.push((at, row));
        }
        start
    }

    /// Records the broker's answer for `row` of lane `at`: accepted, or failed with its due
    /// time, reason and whether it was transient (the destination is then down for the pass).
    pub(super) fn answered(
        &mut self,
        at: usize,
        row: &OutboxRow,
        failure: Option<(SystemTime, String, bool)>,
    ) {
        let destination = row.message.destination.as_str();
        self.sending = self.sending.saturating_sub(1);
        if let Some(busy) = self.in_flight.get_mut(destination) {
            *busy = busy.saturating_sub(1);
        }
        self.lanes[at].busy = false;
        let max = self.max_in_flight;
        let window = self.windows.entry(destination.to_owned()).or_insert(1);
        match failure {
            None => {
                *window = (*window * 2).min(max);
                self.outcome.sent.push(row.id);
            }
            Some((due, reason, transient)) => {
                *window = 1;
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

    /// The outcome, the windows and the keys still held, for the relay to keep. Only the
    /// windows of destinations this pass sent to are kept (one absent starts at 1 again), so
    /// the map holds no more than a pass's destinations however many were ever used.
    pub(super) fn finish(self) -> (Outcome, HashMap<String, usize>, HashMap<Key, SystemTime>) {
        let mut windows = self.windows;
        windows
            .retain(|destination, window| *window > 1 && self.in_flight.contains_key(destination));
        (self.outcome, windows, self.held)
    }
}
