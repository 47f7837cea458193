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
    /// The namespace's tier as the management API tells an SDK (`GET /$namespaceinfo`:
    /// `Standard`, `Premium (2 MU)`); `None` when it did not answer (no Manage rights).
    pub namespace_tier: Option<String>,
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

/// `text` with HTML's five special characters escaped: reasons and versions come from the
/// broker and the database.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's style: inline, so the file is the whole page (no network, no other file).
const HTML_STYLE: &str = "body{font:15px/1.4 system-ui,sans-serif;margin:0;background:#f4f6f8;\
color:#1b1f24}header{padding:20px 28px;color:#fff}header.passed{background:#1a7f37}\
header.failed{background:#cf222e}header.skipped{background:#9a6700}h1{margin:0;font-size:24px}\
main{padding:20px 28px}table{border-collapse:collapse;background:#fff;width:100%;\
margin-bottom:22px}th,td{border:1px solid #d0d7de;padding:6px 10px;text-align:left;\
vertical-align:top}th{background:#eaeef2}td.status{font-weight:bold;color:#fff;width:4em;\
text-align:center}tr.passed td.status{background:#1a7f37}tr.failed td.status{background:#cf222e}\
tr.skipped td.status{background:#9a6700}td.time{text-align:right;white-space:nowrap}\
.bar{display:inline-block;height:10px;background:#0969da;margin-right:6px}\
h2{font-size:18px;margin:18px 0 8px}";

impl VerifyReport {
    /// One self-contained HTML page (`--html FILE`): the verdict, every scenario with its
    /// time, the measurements and the window, the environment.
    pub fn html(&self) -> String {
        let verdict = match self.exit_code() {
            EXIT_PASSED => ("passed", "every scenario passed"),
            EXIT_SKIPPED => ("skipped", "no scenario failed; some were skipped"),
            _ => ("failed", "a scenario failed or something was left behind"),
        };
        let mut out = String::new();
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>sb-inbox verify: {ns}</title><style>{HTML_STYLE}</style></head><body>\
             <header class=\"{class}\"><h1>sb-inbox verify: {verdict}</h1>\
             <div>{ns} · {store}</div></header><main>",
            ns = escape(&self.environment.namespace),
            store = escape(&self.environment.store),
            class = verdict.0,
            verdict = verdict.1,
        );
        self.html_scenarios(&mut out);
        self.html_measurements(&mut out);
        self.html_environment(&mut out);
        self.html_left_behind(&mut out);
        out.push_str("</main></body></html>\n");
        out
    }

    /// The scenarios table: each with its status, its time as a bar scaled to the slowest, its reason.
    fn html_scenarios(&self, out: &mut String) {
        let slowest = self
            .scenarios
            .iter()
            .map(|s| s.millis)
            .max()
            .unwrap_or(0)
            .max(1);
        let _ = write!(
            out,
            "<h2>Scenarios</h2><table id=\"scenarios\"><tr><th>scenario</th><th>result</th>\
             <th>time</th><th>reason</th></tr>"
        );
        for s in &self.scenarios {
            let class = match s.status {
                Status::Passed => "passed",
                Status::Failed => "failed",
                Status::Skipped => "skipped",
            };
            // A bar of up to 120 px: where the run's time went at a glance.
            let width = s.millis.saturating_mul(120) / slowest;
            let _ = write!(
                out,
                "<tr id=\"scenario-{name}\" class=\"{class}\"><td>{name}</td>\
                 <td class=\"status\">{label}</td><td class=\"time\">\
                 <span class=\"bar\" style=\"width:{width}px\"></span>{secs:.1} s</td>\
                 <td>{reason}</td></tr>",
                name = escape(s.name),
                label = s.status.label(),
                secs = Duration::from_millis(s.millis).as_secs_f64(),
                reason = escape(&s.reason),
            );
        }
        out.push_str("</table>");
    }

    /// The measurements table (`n/a` where a scenario could not measure).
    fn html_measurements(&self, out: &mut String) {
        let m = &self.measurements;
        let ms = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2} ms"));
        let per_slot = m
            .per_slot_per_sec
            .map_or_else(|| "n/a".to_owned(), |v| format!("about {v:.0} messages/s"));
        let window = m.window.map_or_else(
            || "n/a".to_owned(),
            |w| format!("at least {w} per store connection"),
        );
        let _ = write!(
            out,
            "<h2>Measurements</h2><table id=\"measurements\">\
             <tr><th>broker round trip (median)</th><td>{rtt}</td></tr>\
             <tr><th>store commit (median)</th><td>{commit}</td></tr>\
             <tr><th>per handler slot</th><td>{per_slot}</td></tr>\
             <tr><th>window (concurrency + prefetch)</th><td>{window}</td></tr></table>",
            rtt = ms(m.broker_rtt_ms),
            commit = ms(m.store_commit_ms),
        );
    }

    /// The environment table (`unknown` where verify could not read it).
    fn html_environment(&self, out: &mut String) {
        let e = &self.environment;
        let or_unknown =
            |v: &Option<String>| v.as_deref().map_or_else(|| "unknown".to_owned(), escape);
        let _ = write!(
            out,
            "<h2>Environment</h2><table id=\"environment\">\
             <tr><th>namespace</th><td>{ns}</td></tr>\
             <tr><th>namespace tier</th><td>{tier}</td></tr>\
             <tr><th>entities</th><td>{entities}: {names}</td></tr>\
             <tr><th>store</th><td>{store}</td></tr>\
             <tr><th>database version</th><td>{db}</td></tr>\
             <tr><th>scratch store</th><td>{scratch}</td></tr>\
             <tr><th>sb-inbox</th><td>{tool}</td></tr></table>",
            ns = escape(&e.namespace),
            tier = or_unknown(&e.namespace_tier),
            entities = escape(&e.entities),
            names = escape(&e.entity_names.join(", ")),
            store = escape(&e.store),
            db = or_unknown(&e.database_version),
            scratch = escape(&e.scratch_store),
            tool = escape(&e.tool_version),
        );
    }

    /// What the run could not clean up, when anything.
    fn html_left_behind(&self, out: &mut String) {
        if !self.left_behind.is_empty() {
            out.push_str("<h2>Left behind</h2><ul id=\"left-behind\">");
            for left in &self.left_behind {
                let _ = write!(out, "<li>{}</li>", escape(left));
            }
            out.push_str("</ul>");
        }
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
    fn the_html_page_escapes_what_the_broker_and_database_said() {
        let mut r = report(&[Status::Failed]);
        r.scenarios[0].reason = "<script>alert('x')</script> & more".to_owned();
        r.environment.database_version = Some("PostgreSQL <16>".to_owned());
        let html = r.html();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more"));
        assert!(html.contains("PostgreSQL &lt;16&gt;"));
        assert!(html.contains("id=\"scenario-s\" class=\"failed\""));
        // Self-contained: nothing fetched from elsewhere.
        assert!(!html.contains("http://") && !html.contains("https://") && !html.contains("src="));
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
