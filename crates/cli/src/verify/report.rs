//! What a verification found: one result per scenario, the measured latencies and the window
//! they imply, the environment; as a table for people and JSON (`--report FILE`) for machines.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// How a scenario ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The guarantee held.
    Passed,
    /// The guarantee did not hold, or the scenario could not run to its end.
    Failed,
    /// Not run; the reason says what it needs.
    Skipped,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Passed => "PASS",
            Status::Failed => "FAIL",
            Status::Skipped => "SKIP",
        }
    }
}

/// One scenario's result.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// The scenario's name (stable: tests and CI read it).
    pub name: &'static str,
    /// How it ended.
    pub status: Status,
    /// What was seen: for a failure, what broke; for a skip, what it needs.
    pub reason: String,
    /// How long it took, in milliseconds.
    pub millis: u64,
}

/// Latencies measured against the user's systems, and what they imply for the worker's
/// settings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Measurements {
    /// The broker's round trip (a `$management` peek), median, in milliseconds.
    pub broker_rtt_ms: Option<f64>,
    /// One store transaction (begin, insert an inbox row, commit), median, in milliseconds.
    pub store_commit_ms: Option<f64>,
    /// What one handler slot can do per second: one message costs about two broker round
    /// trips (its transfer and its settlement) plus one commit.
    pub per_slot_per_sec: Option<f64>,
    /// Deliveries in flight (`concurrency` + `prefetch`) that keep one store connection busy
    /// while the others travel: (2 × RTT + commit) / commit, rounded up.
    pub window: Option<u64>,
}

impl Measurements {
    /// Fills in what the two latencies imply.
    pub fn derive(mut self) -> Self {
        if let (Some(rtt), Some(commit)) = (self.broker_rtt_ms, self.store_commit_ms) {
            let per_message = 2.0 * rtt + commit;
            if per_message > 0.0 {
                self.per_slot_per_sec = Some(1000.0 / per_message);
            }
            if commit > 0.0 {
                // Lossless: the ratio of two small positive latencies is far below u64::MAX.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let window = (per_message / commit).ceil().max(1.0) as u64;
                self.window = Some(window);
            }
        }
        self
    }
}

/// Where the verification ran.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Environment {
    /// The namespace host (never the key).
    pub namespace: String,
    /// `scratch` (entities created and deleted) or `given` (the entities named, purged).
    pub entities: String,
    /// The entities used.
    pub entity_names: Vec<String>,
    /// The store's provider (`postgres`, `sqlite`, `mssql`).
    pub store: String,
    /// The database's version, as it reports it.
    pub database_version: Option<String>,
    /// The scratch schema (or file) the store's scenarios ran in, removed afterwards.
    pub scratch_store: String,
    /// This tool's version.
    pub tool_version: String,
}

/// The whole verification.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Every scenario, in the order run.
    pub scenarios: Vec<ScenarioResult>,
    /// Latencies and the window they imply.
    pub measurements: Measurements,
    /// Where it ran.
    pub environment: Environment,
    /// What verify left behind: empty unless removing a scratch entity or schema failed.
    pub left_behind: Vec<String>,
}

/// The process's exit code for a report: see [`VerifyReport::exit_code`].
pub const EXIT_PASSED: u8 = 0;
/// A scenario failed, or verify could not set up or clean up.
pub const EXIT_FAILED: u8 = 1;
/// Nothing failed, but some scenario was skipped (its reason says what it needs).
pub const EXIT_SKIPPED: u8 = 3;

impl VerifyReport {
    /// Whether every scenario ran and passed, and nothing was left behind.
    pub fn all_passed(&self) -> bool {
        self.left_behind.is_empty() && self.scenarios.iter().all(|s| s.status == Status::Passed)
    }

    /// [`EXIT_PASSED`] only if every scenario passed; [`EXIT_FAILED`] if one failed or
    /// something was left behind; else [`EXIT_SKIPPED`].
    pub fn exit_code(&self) -> u8 {
        let failed = !self.left_behind.is_empty()
            || self.scenarios.iter().any(|s| s.status == Status::Failed);
        if failed {
            EXIT_FAILED
        } else if self.all_passed() {
            EXIT_PASSED
        } else {
            EXIT_SKIPPED
        }
    }

    /// The pass/fail table with the measurements under it.
    pub fn table(&self) -> String {
        let width = self
            .scenarios
            .iter()
            .map(|s| s.name.len())
            .max()
            .unwrap_or(8);
        let mut out = String::new();
        let _ = writeln!(out, "  {:<width$}  result  time      reason", "scenario");
        for s in &self.scenarios {
            let time = format!("{:.1}s", Duration::from_millis(s.millis).as_secs_f64());
            let _ = writeln!(
                out,
                "  {:<width$}  {:<6}  {:>7}   {}",
                s.name,
                s.status.label(),
                time,
                s.reason
            );
        }
        let m = &self.measurements;
        let ms = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2} ms"));
        let _ = writeln!(out);
        let _ = writeln!(out, "  broker round trip:   {}", ms(m.broker_rtt_ms));
        let _ = writeln!(out, "  store commit:        {}", ms(m.store_commit_ms));
        if let (Some(per_slot), Some(window)) = (m.per_slot_per_sec, m.window) {
            let _ = writeln!(
                out,
                "  implies:             about {per_slot:.0} messages/s per handler slot; a window \
                 (concurrency + prefetch) of at least {window} per store connection keeps it busy"
            );
        }
        for left in &self.left_behind {
            let _ = writeln!(out, "  LEFT BEHIND: {left}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(statuses: &[Status]) -> VerifyReport {
        VerifyReport {
            scenarios: statuses
                .iter()
                .map(|&status| ScenarioResult {
                    name: "s",
                    status,
                    reason: String::new(),
                    millis: 0,
                })
                .collect(),
            measurements: Measurements::default(),
            environment: Environment::default(),
            left_behind: Vec::new(),
        }
    }

    #[test]
    fn exit_zero_only_when_every_scenario_passed() {
        assert_eq!(report(&[Status::Passed]).exit_code(), EXIT_PASSED);
        assert_eq!(
            report(&[Status::Passed, Status::Skipped]).exit_code(),
            EXIT_SKIPPED
        );
        assert_eq!(
            report(&[Status::Skipped, Status::Failed]).exit_code(),
            EXIT_FAILED
        );
        let mut left = report(&[Status::Passed]);
        left.left_behind.push("queue q".to_owned());
        assert_eq!(left.exit_code(), EXIT_FAILED);
    }

    #[test]
    fn the_window_covers_two_round_trips_per_commit() {
        let m = Measurements {
            broker_rtt_ms: Some(10.0),
            store_commit_ms: Some(5.0),
            ..Measurements::default()
        }
        .derive();
        // (2 × 10 + 5) / 5 = 5 in flight; 1000 / 25 = 40 per second per slot.
        assert_eq!(m.window, Some(5));
        assert!((m.per_slot_per_sec.unwrap_or(0.0) - 40.0).abs() < 1e-9);
    }
}
