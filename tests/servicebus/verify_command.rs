//! Issue 43: `sb-inbox verify` as a user runs it, a process against the emulator (in-process,
//! its management API on a plain HTTP listener) and PostgreSQL or SQLite: every scenario this
//! build runs passes; each fails against a setup broken for it, with a reason naming the
//! break; nothing is left behind; a given entity with messages verify did not send is refused
//! and left untouched.

use std::collections::BTreeMap;
use std::process::Output;

use sb_emulator::{Emulator, EmulatorOptions, EntityProperties, QueueConfig};
use sb_inbox::Message;
use sb_inbox::PgStore;

use crate::support::cli;
use crate::support::emulator::{client, duration, properties, queue, session_properties, start};
use crate::support::pg_url;

/// The scenarios this build runs (the others report `skipped` with what they need).
const RUN: &[&str] = &[
    "duplicate_delivery",
    "republished_message",
    "dead_letter_reason",
    "session_order",
    "outbox_relayed_once",
    "store_conformance",
    "lock_loss_fenced",
    "crash_between_commit_and_settlement",
    "delayed_retry",
];

/// An emulator with `queues` and its management API on a plain HTTP listener.
async fn emulator(queues: Vec<QueueConfig>) -> Emulator {
    start(
        queues,
        EmulatorOptions::default().with_http_listen("127.0.0.1:0"),
    )
    .await
}

/// What one verify run printed and reported.
struct Run {
    output: Output,
    report: serde_json::Value,
}

impl Run {
    fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    /// Each scenario's (status, reason).
    fn scenarios(&self) -> BTreeMap<String, (String, String)> {
        self.report["scenarios"]
            .as_array()
            .unwrap_or_else(|| panic!("no scenarios in {}", self.report))
            .iter()
            .map(|s| {
                (
                    s["name"].as_str().unwrap().to_owned(),
                    (
                        s["status"].as_str().unwrap().to_owned(),
                        s["reason"].as_str().unwrap().to_owned(),
                    ),
                )
            })
            .collect()
    }

    fn status(&self, name: &str) -> (String, String) {
        self.scenarios()
            .remove(name)
            .unwrap_or_else(|| panic!("{name} missing from {}", self.report))
    }

    fn describe(&self) -> String {
        format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code(),
            String::from_utf8_lossy(&self.output.stdout),
            String::from_utf8_lossy(&self.output.stderr)
        )
    }
}

/// Runs `sb-inbox verify` on `emulator` with `store` and `extra` arguments, reading its JSON
/// report (`Null` when it wrote none).
async fn verify(emulator: &Emulator, store: &str, extra: &[&str], tag: &str) -> Run {
    verify_as(emulator, &emulator.connection_string(), store, extra, tag).await
}

/// As [`verify`], with `connection` (another key of the emulator).
async fn verify_as(
    emulator: &Emulator,
    connection: &str,
    store: &str,
    extra: &[&str],
    tag: &str,
) -> Run {
    let http = format!(
        "http://{}",
        emulator.http_addr().expect("the HTTP listener")
    );
    let report =
        std::env::temp_dir().join(format!("sb-inbox-verify-{tag}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let report_arg = report.display().to_string();
    let mut args = vec![
        "verify",
        "--admin-endpoint",
        &http,
        "--store",
        store,
        "--report",
        &report_arg,
    ];
    args.extend_from_slice(extra);
    let output = cli::run_async(Some(connection), &args).await;
    let report = std::fs::read(&report)
        .ok()
        .map_or(serde_json::Value::Null, |bytes| {
            serde_json::from_slice(&bytes).unwrap()
        });
    Run { output, report }
}

/// The queues the emulator's management API lists (`GET /$Resources/queues` serves this list).
fn queue_names(emulator: &Emulator) -> Vec<String> {
    emulator
        .broker()
        .queues()
        .into_iter()
        .map(|q| q.name)
        .collect()
}

/// Schemas of the test database named `name`.
async fn schema_exists(name: &str) -> bool {
    let admin = PgStore::connect(&pg_url(), 1).await.unwrap();
    let rows = admin
        .query(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
            &[&name],
        )
        .await
        .unwrap();
    rows[0].get::<_, i64>(0) > 0
}

/// Every scenario of [`RUN`] passed, the rest are skipped, and the exit code says so (3: none
/// failed, some skipped; 0 is kept for a run where every scenario passed).
fn all_run_passed(run: &Run) {
    for (name, (status, reason)) in run.scenarios() {
        let expected = if RUN.contains(&name.as_str()) {
            "passed"
        } else {
            "skipped"
        };
        assert_eq!(status, expected, "{name}: {reason}\n{}", run.describe());
    }
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    assert!(
        run.report["left_behind"].as_array().unwrap().is_empty(),
        "{}",
        run.report
    );
}

/// Headless Chromium (Debian's `chromium`), or `None` (and a note) when it is not installed;
/// under `CI=true` a missing browser fails the test instead (`.ci/setup` installs it).
fn chromium() -> Option<&'static str> {
    for candidate in ["chromium", "chromium-browser", "google-chrome"] {
        let found = std::process::Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return Some(candidate);
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "no chromium under CI=true: .ci/setup installs it (apt-get install chromium)"
    );
    eprintln!("SKIPPED the HTML report's screenshot: no chromium (apt-get install chromium)");
    None
}

/// A screenshot of `page` (a file) by headless `browser`, its PNG's size in bytes.
fn screenshot(browser: &str, page: &std::path::Path, png: &std::path::Path) -> u64 {
    let _ = std::fs::remove_file(png);
    let profile = png.with_extension("profile");
    let output = std::process::Command::new(browser)
        .args([
            "--headless",
            // Root in a container has no user namespace for the sandbox.
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,1000",
            &format!("file://{}", page.display()),
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "{browser}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::metadata(png)
        .unwrap_or_else(|e| {
            panic!(
                "no screenshot {}: {e}\n{}",
                png.display(),
                String::from_utf8_lossy(&output.stderr)
            )
        })
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_the_emulator_and_postgresql_and_leaves_nothing_behind() {
    let emulator = emulator(Vec::new()).await;
    let dir = std::env::temp_dir().join(format!("sb-inbox-verify-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("verify.html");
    let page_arg = page.display().to_string();
    let run = verify(&emulator, &pg_url(), &["--html", &page_arg], "pg").await;
    all_run_passed(&run);

    // The HTML report: one row per scenario, the measurements and the environment, and a
    // browser draws it (a screenshot well above a blank page's size: text, colours, bars).
    let html = std::fs::read_to_string(&page).unwrap();
    for (name, (status, _)) in run.scenarios() {
        assert!(
            html.contains(&format!("<tr id=\"scenario-{name}\" class=\"{status}\">")),
            "{name} ({status}) missing from the page:\n{html}"
        );
    }
    for part in [
        "id=\"measurements\"",
        "broker round trip",
        "window",
        "namespace tier",
    ] {
        assert!(html.contains(part), "{part} missing:\n{html}");
    }
    // The emulator's `$namespaceinfo` says Standard.
    assert_eq!(run.report["environment"]["namespace_tier"], "Standard");
    assert!(html.contains("<td>Standard</td>"), "{html}");
    assert!(html.contains("PostgreSQL"), "{html}");
    if let Some(browser) = chromium() {
        let blank = dir.join("blank.html");
        std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").unwrap();
        let blank_size = screenshot(browser, &blank, &dir.join("blank.png"));
        let size = screenshot(browser, &page, &dir.join("verify.png"));
        assert!(
            size > 4 * blank_size,
            "the report's screenshot ({size} B) is no bigger than a blank page's ({blank_size} B)"
        );
        eprintln!("screenshot: {size} B, a blank page's: {blank_size} B");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let table = String::from_utf8_lossy(&run.output.stdout);
    assert!(
        table.contains("duplicate_delivery") && table.contains("PASS"),
        "{table}"
    );
    let m = &run.report["measurements"];
    assert!(m["broker_rtt_ms"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["store_commit_ms"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["window"].as_u64().unwrap() >= 1, "{m}");
    let env = &run.report["environment"];
    assert_eq!(env["entities"], "scratch", "{env}");
    assert!(
        env["database_version"]
            .as_str()
            .unwrap()
            .starts_with("PostgreSQL"),
        "{env}"
    );

    // The scratch queues were there (named in the report) and are gone; so is the schema.
    let names: Vec<String> = env["entity_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 4, "{env}");
    assert!(names.iter().all(|n| n.starts_with("sbv-")), "{names:?}");
    let listed = queue_names(&emulator);
    assert!(
        listed.iter().all(|q| !q.starts_with("sbv-")),
        "left behind: {listed:?}"
    );
    let schema = env["scratch_store"]
        .as_str()
        .unwrap()
        .strip_prefix("schema ")
        .unwrap()
        .to_owned();
    assert!(schema.starts_with("sbv_"), "{schema}");
    assert!(!schema_exists(&schema).await, "schema {schema} left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_the_emulator_and_sqlite_and_removes_its_scratch_file() {
    let dir = std::env::temp_dir().join(format!("sb-inbox-verify-sqlite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("app.db").display());
    let emulator = emulator(Vec::new()).await;
    let run = verify(&emulator, &store, &[], "sqlite").await;
    all_run_passed(&run);
    assert_eq!(run.report["environment"]["store"], "sqlite");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}",
        dir.display()
    );
    assert!(
        queue_names(&emulator)
            .iter()
            .all(|q| !q.starts_with("sbv-"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_refuses_a_given_queue_holding_messages_it_did_not_send_and_touches_nothing() {
    let emulator = emulator(vec![queue("theirs", properties("PT5S", 10))]).await;
    client(&emulator)
        .sender("theirs")
        .send(Message::new("their-1", "their.contract.v1", "{}"))
        .await
        .unwrap();
    let run = verify(&emulator, &pg_url(), &["--queue", "theirs"], "foreign").await;
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    let stderr = String::from_utf8_lossy(&run.output.stderr);
    assert!(
        stderr.contains("theirs holds messages verify did not send; it touched nothing"),
        "{stderr}"
    );
    assert!(run.report.is_null(), "no report: {}", run.report);
    // Still there, never locked or delivered; no scratch entity was made.
    let entity = emulator.broker().entity("theirs").unwrap();
    let peeked = entity.peek(0, 10).unwrap();
    assert_eq!(peeked.len(), 1);
    assert_eq!(peeked[0].delivery_count, 0);
    assert_eq!(queue_names(&emulator), ["theirs"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_on_given_empty_queues_passes_and_purges_them() {
    let emulator = emulator(vec![
        queue("mine", properties("PT5S", 10)),
        queue("mine-sessions", session_properties("PT5S")),
    ])
    .await;
    let run = verify(
        &emulator,
        &pg_url(),
        &["--queue", "mine", "--session-queue", "mine-sessions"],
        "given",
    )
    .await;
    all_run_passed(&run);
    assert_eq!(run.report["environment"]["entities"], "given");
    for name in ["mine", "mine-sessions"] {
        let c = emulator.broker().entity(name).unwrap().counts();
        assert_eq!(
            (c.active, c.locked, c.scheduled, c.dead_lettered),
            (0, 0, 0, 0),
            "{name}: {c:?}"
        );
    }
}

/// Each scenario fails against a setup broken for it, with a reason that names the break.
async fn fails_with(run: &Run, scenario: &str, reason: &str) {
    let (status, why) = run.status(scenario);
    assert_eq!(status, "failed", "{scenario}: {why}\n{}", run.describe());
    assert!(why.contains(reason), "{scenario}: {why}");
    assert_eq!(run.code(), Some(1), "{}", run.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_inbox_unique_key_dropped_duplicate_delivery_and_conformance_fail() {
    let emulator = emulator(Vec::new()).await;
    let run = verify(
        &emulator,
        &pg_url(),
        &["--break-store", "inbox-unique"],
        "inbox",
    )
    .await;
    fails_with(
        &run,
        "duplicate_delivery",
        "expected Processed then an inbox Duplicate",
    )
    .await;
    fails_with(&run, "store_conformance", "inbox_insert_then_duplicate").await;
    fails_with(
        &run,
        "crash_between_commit_and_settlement",
        "the redelivery after the crash was Duplicate(BusinessKey), not an inbox Duplicate",
    )
    .await;
    assert_eq!(run.status("republished_message").0, "passed");
    assert!(
        queue_names(&emulator)
            .iter()
            .all(|q| !q.starts_with("sbv-"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_business_key_unique_key_dropped_the_republished_message_fails() {
    let emulator = emulator(Vec::new()).await;
    let run = verify(
        &emulator,
        &pg_url(),
        &["--break-store", "business-key-unique"],
        "business_key",
    )
    .await;
    fails_with(
        &run,
        "republished_message",
        "expected Processed then a business-key Duplicate",
    )
    .await;
    fails_with(&run, "store_conformance", "business_key_duplicate").await;
    assert_eq!(run.status("duplicate_delivery").0, "passed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_duplicate_detection_on_the_queue_duplicate_delivery_fails_naming_it() {
    let emulator = emulator(vec![queue(
        "deduped",
        EntityProperties {
            requires_duplicate_detection: true,
            duplicate_detection_history_time_window: duration("PT10M"),
            ..properties("PT5S", 10)
        },
    )])
    .await;
    let run = verify(&emulator, &pg_url(), &["--queue", "deduped"], "dedup").await;
    fails_with(
        &run,
        "duplicate_delivery",
        "is duplicate detection on for deduped",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_dead_letters_forwarded_away_the_dead_letter_reason_fails() {
    let emulator = emulator(vec![
        queue(
            "forwarding",
            EntityProperties {
                forward_dead_lettered_messages_to: Some("elsewhere".to_owned()),
                ..properties("PT5S", 10)
            },
        ),
        queue("elsewhere", properties("PT5S", 10)),
    ])
    .await;
    let run = verify(&emulator, &pg_url(), &["--queue", "forwarding"], "dlq").await;
    fails_with(
        &run,
        "dead_letter_reason",
        "did not arrive in forwarding/$DeadLetterQueue",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_session_queue_that_does_not_require_sessions_session_order_fails() {
    let emulator = emulator(vec![
        queue("plain", properties("PT5S", 10)),
        queue("not-sessions", properties("PT5S", 10)),
    ])
    .await;
    let run = verify(
        &emulator,
        &pg_url(),
        &["--queue", "plain", "--session-queue", "not-sessions"],
        "sessions",
    )
    .await;
    fails_with(&run, "session_order", "accepting session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_stopped_by_sigterm_mid_run_still_removes_its_queues_and_schema() {
    let emulator = emulator(Vec::new()).await;
    let http = format!("http://{}", emulator.http_addr().unwrap());
    let report = std::env::temp_dir().join(format!(
        "sb-inbox-verify-sigterm-{}.json",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&report);
    let store = pg_url();
    let child = tokio::process::Command::from(cli::command(
        Some(&emulator.connection_string()),
        &[
            "verify",
            "--admin-endpoint",
            &http,
            "--store",
            &store,
            "--report",
            &report.display().to_string(),
        ],
    ))
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Mid-run: its scratch queues exist and the scenarios have sent their first message.
    let emulator_ref = &emulator;
    crate::verification::until("verify created its queues and sent", move || async move {
        emulator_ref
            .broker()
            .queues()
            .iter()
            .any(|q| q.name.starts_with("sbv-") && (q.counts.completed > 0 || q.counts.active > 0))
    })
    .await;
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("interrupted"), "{stdout}");
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let listed = queue_names(&emulator);
    assert!(
        listed.iter().all(|q| !q.starts_with("sbv-")),
        "left behind: {listed:?}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let schema = json["environment"]["scratch_store"]
        .as_str()
        .unwrap()
        .strip_prefix("schema ")
        .unwrap()
        .to_owned();
    assert!(!schema_exists(&schema).await, "schema {schema} left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_idle_secs_past_the_emulators_link_idle_timeout_the_idle_sender_survives() {
    let emulator = start(
        Vec::new(),
        EmulatorOptions::default()
            .with_http_listen("127.0.0.1:0")
            .with_link_idle_timeout(std::time::Duration::from_secs(2)),
    )
    .await;
    let run = verify(&emulator, &pg_url(), &["--idle-secs", "3"], "idle").await;
    let (status, reason) = run.status("idle_detach_survival");
    assert_eq!(status, "passed", "{reason}\n{}", run.describe());
    assert!(
        reason.contains("detached while idle 3s and replaced"),
        "{reason}"
    );
    // Every other scenario this build runs holds under the short idle timeout too.
    for (name, (status, reason)) in run.scenarios() {
        if name != "token_refresh" {
            assert_eq!(status, "passed", "{name}: {reason}");
        }
    }
}

/// The tokens live 20 s (`--token-lifetime`), so the scenario takes about 25 s; the client
/// refreshes such a token at half its life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_token_refresh_the_sender_refreshes_before_its_short_token_expires() {
    let emulator = emulator(Vec::new()).await;
    let run = verify(
        &emulator,
        &pg_url(),
        &["--token-refresh", "--token-lifetime", "20"],
        "token",
    )
    .await;
    let (status, reason) = run.status("token_refresh");
    assert_eq!(status, "passed", "{reason}\n{}", run.describe());
    assert!(reason.contains("before its expiry at 20s"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_lifetime_below_ten_seconds_is_refused_before_anything_is_created() {
    let emulator = emulator(Vec::new()).await;
    let run = verify(
        &emulator,
        &pg_url(),
        &["--token-refresh", "--token-lifetime", "5"],
        "token_short",
    )
    .await;
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    assert!(run.report.is_null(), "{}", run.report);
    assert!(queue_names(&emulator).is_empty());
}

/// A host clock 60 s behind the broker's (`--clock-offset 60`: the broker runs ahead), a real
/// outside fault: the runtime schedules its retry by the host's clock, the broker finds that
/// time already past and delivers the copy at once, so the retry's delay is not honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_brokers_clock_a_minute_ahead_delayed_retry_fails_arriving_early() {
    let emulator = crate::support::emulator::start_on_clock(
        Vec::new(),
        EmulatorOptions::default().with_http_listen("127.0.0.1:0"),
        sb_emulator::Clock::shifted(60),
    )
    .await;
    let run = verify(&emulator, &pg_url(), &[], "clock").await;
    fails_with(&run, "delayed_retry", "before its scheduled time").await;
}

/// `--allow-skipped` (the Container Apps job's verify reads only the exit code): a run where
/// none failed but some were skipped (in-memory SQLite: no child process can open it) exits 0
/// instead of 3, its report still saying what was skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_allow_skipped_a_run_with_skips_and_no_failure_exits_zero() {
    let emulator = emulator(Vec::new()).await;
    let run = verify(&emulator, "sqlite::memory:", &["--allow-skipped"], "allow").await;
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let statuses = run.scenarios();
    assert_eq!(statuses["lock_loss_fenced"].0, "skipped");
    assert!(statuses.values().all(|(status, _)| status != "failed"));
}

/// A store that acknowledges the relay's dispatch mark and does not keep it (a trigger keeps
/// `dispatched_at` NULL): the second relay pass still publishes nothing (the row is leased),
/// and the scenario sees the row pending, which would go out again once its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_outbox_forgetting_its_dispatch_mark_outbox_relayed_once_fails() {
    let emulator = emulator(Vec::new()).await;
    let run = verify(
        &emulator,
        &pg_url(),
        &[
            "--break-store",
            "outbox-mark-lost",
            "--scenario",
            "outbox_relayed_once",
        ],
        "outbox_mark",
    )
    .await;
    fails_with(
        &run,
        "outbox_relayed_once",
        "1 outbox row(s) still pending after the relay published",
    )
    .await;
    // Only the chosen scenario ran.
    assert_eq!(run.status("duplicate_delivery").0, "skipped");
}

/// `--idle-secs` shorter than the broker's link idle timeout (the emulator's default, the
/// service's 10 minutes): the link was never detached, so the scenario showed nothing and
/// fails saying so, instead of passing on a sender that was never put to the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_idle_secs_short_of_the_link_idle_timeout_idle_detach_survival_fails_as_not_shown() {
    let emulator = emulator(Vec::new()).await;
    let run = verify(
        &emulator,
        &pg_url(),
        &["--idle-secs", "1", "--scenario", "idle_detach_survival"],
        "idle_short",
    )
    .await;
    fails_with(
        &run,
        "idle_detach_survival",
        "the sender's link was never detached in 1s idle",
    )
    .await;
}

/// A broker whose clock runs 15 s ahead of the host's (a real outside fault): the 20 s tokens
/// verify signs expire at the broker 5 s after they are put, before the client refreshes at
/// half their life, so the broker detaches the sender's link (the service drops an entity's
/// links when their token expires). The sender replaces it and its sends go through; the
/// scenario fails on the second link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_brokers_clock_ahead_of_the_tokens_refresh_token_refresh_fails() {
    let emulator = crate::support::emulator::start_on_clock(
        Vec::new(),
        EmulatorOptions::default().with_http_listen("127.0.0.1:0"),
        sb_emulator::Clock::shifted(15),
    )
    .await;
    let run = verify(
        &emulator,
        &pg_url(),
        &[
            "--token-refresh",
            "--token-lifetime",
            "20",
            "--scenario",
            "token_refresh",
        ],
        "token_clock",
    )
    .await;
    fails_with(
        &run,
        "token_refresh",
        "the sender's link was detached and replaced (",
    )
    .await;
}

/// A key without Manage rights (Send and Listen: the management API refuses it) on a given
/// queue with a 5 s lock, a broker whose clock runs a minute ahead of the host's, and attaches
/// answered 6 s late: the message waits in the queue before the stalled consumer gets it, and
/// verify's own receiver attaches only after that consumer's lock ran out, so the stalled one
/// resumes a second past it (a lock duration counted from receipt is later than the broker's
/// by the delivery's transfer; without that second the fence would race it).
/// Without the entity's lock duration the stalled consumer reckons its lock from the broker's
/// timestamps, which that wait stretches: it commits after the broker redelivered, and
/// `lock_loss_fenced` fails on the missing fence. With the root key verify reads the lock
/// duration and hands it to its child (as the Worker's start check does), and the same setup
/// passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_entitys_lock_duration_a_host_behind_the_broker_does_not_fence_the_stall() {
    use sb_emulator::{Right, Rights, SharedAccessPolicy};
    let policy = SharedAccessPolicy {
        name: "sendlisten".to_owned(),
        key: "c2VuZGxpc3Rlbi1rZXk=".to_owned(),
        rights: Rights::default().with(Right::Send).with(Right::Listen),
    };
    let emulator = crate::support::emulator::start_on_clock(
        vec![queue("locked", properties("PT5S", 10))],
        EmulatorOptions::default()
            .with_http_listen("127.0.0.1:0")
            .with_attach_delay(std::time::Duration::from_secs(6))
            .with_policy(policy.clone()),
        sb_emulator::Clock::shifted(60),
    )
    .await;
    let args = ["--queue", "locked", "--scenario", "lock_loss_fenced"];
    let root = emulator.connection_string();
    let send_listen = root
        .replace("RootManageSharedAccessKey", &policy.name)
        .replace("SAS_KEY_VALUE", &policy.key);
    let run = verify_as(&emulator, &send_listen, &pg_url(), &args, "lock_nomanage").await;
    fails_with(
        &run,
        "lock_loss_fenced",
        "the stalled consumer committed after its lock was lost: no fence",
    )
    .await;
    let run = verify_as(&emulator, &root, &pg_url(), &args, "lock_manage").await;
    let (status, reason) = run.status("lock_loss_fenced");
    assert_eq!(status, "passed", "{reason}\n{}", run.describe());
}
