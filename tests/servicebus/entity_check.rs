//! Issue 33, must show 3: `sb-inbox run` reads its entity over the management API at start-up
//! (the emulator's TLS listener, trusted through `servicebus.ca_file`): an `[entity]` copy
//! that disagrees refuses the start and names the setting; without `[entity]` the worker reads
//! the entity and computes the replay horizon from it; retention shorter than that horizon is
//! refused.

use std::io::BufRead as _;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_emulator::{EmulatorOptions, EntityProperties, TlsIdentity};

use crate::support::cli;
use crate::support::emulator::queue;
use crate::support::stores::sqlite_file_store;
use crate::worker::{http_get, logged_health_address, ready, sigterm_exits_0, strip_ansi};

/// `orders`: lock 45 s, max delivery count 7, TTL 3 h.
async fn tls_emulator(tag: &str) -> (sb_emulator::Emulator, std::path::PathBuf) {
    let dir = crate::tls::tls_dir(tag);
    let emulator = crate::support::emulator::start(
        vec![queue(
            "orders",
            EntityProperties {
                lock_duration: Duration::from_secs(45),
                max_delivery_count: 7,
                default_message_time_to_live: Duration::from_secs(3 * 3600),
                ..EntityProperties::default()
            },
        )],
        EmulatorOptions::default()
            .with_tls_listen("127.0.0.1:0", TlsIdentity::Generate(dir.clone())),
    )
    .await;
    (emulator, dir)
}

/// The replay horizon of `orders` with the default 7-day DLQ window and no delayed retries:
/// 3 h + 45 s × 7 + 7 d.
const HORIZON_SECS: u64 = 3 * 3600 + 45 * 7 + 7 * 86_400;

/// `sb-inbox run` over `amqps` to the TLS listener, trusting the generated CA, with `env`;
/// its stderr lines are collected as they come.
fn worker(
    emulator: &sb_emulator::Emulator,
    store: &str,
    env: &[(&str, String)],
) -> (std::process::Child, Arc<Mutex<Vec<String>>>) {
    let mut child = cli::worker(store, &emulator.tls_connection_string().unwrap())
        .env(
            "SB_INBOX_SERVICEBUS_CA_FILE",
            emulator.tls_ca_file().unwrap(),
        )
        .env("SB_INBOX_HEALTH_PORT", "0")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().unwrap();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().unwrap().push(strip_ansi(&line));
        }
    });
    (child, lines)
}

/// Waits (bounded) for the process to exit; its status and everything it logged.
async fn exit(
    mut child: std::process::Child,
    lines: &Arc<Mutex<Vec<String>>>,
) -> (std::process::ExitStatus, String) {
    let status = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the worker refuses to start and exits");
    // The reader thread takes the last lines once the pipe closes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    (status, lines.lock().unwrap().join("\n"))
}

/// Waits (bounded) for a logged line containing `needle`.
async fn logged(lines: &Arc<Mutex<Vec<String>>>, needle: &str) -> String {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(line) = lines.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never logged {needle:?}: {:?}", lines.lock().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entity_copy_that_disagrees_refuses_the_start_and_names_the_setting() {
    let (emulator, dir) = tls_emulator("entity-mismatch").await;
    let (store_dir, db) = sqlite_file_store("entity-mismatch").await;
    let store = format!("sqlite://{}", db.display());
    for (key, value, named) in [
        (
            "SB_INBOX_LOCK_DURATION_SECS",
            "30",
            "entity.lock_duration_secs = 30 in [entity], but entity orders has LockDuration 45 s",
        ),
        (
            "SB_INBOX_MAX_DELIVERY_COUNT",
            "10",
            "entity.max_delivery_count = 10 in [entity], but entity orders has MaxDeliveryCount 7",
        ),
        (
            "SB_INBOX_MESSAGE_TTL_SECS",
            "86400",
            "entity.message_ttl_secs = 86400 in [entity], but entity orders has DefaultMessageTimeToLive 10800 s",
        ),
    ] {
        let (child, lines) = worker(&emulator, &store, &[(key, value.to_owned())]);
        let (status, log) = exit(child, &lines).await;
        assert!(!status.success(), "{key}: {log}");
        assert!(log.contains(named), "{key}: {log}");
    }
    // The session mode is checked against RequiresSession too.
    let (child, lines) = worker(
        &emulator,
        &store,
        &[("SB_INBOX_SESSIONS", "true".to_owned())],
    );
    let (status, log) = exit(child, &lines).await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("RequiresSession=false"), "{log}");
    // Nothing was received.
    assert_eq!(emulator.links().len(), 0);
    emulator.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(store_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_entity_section_the_worker_reads_the_entity_and_its_horizon_bounds_retention() {
    let (emulator, dir) = tls_emulator("entity-read").await;
    let (store_dir, db) = sqlite_file_store("entity-read").await;
    let store = format!("sqlite://{}", db.display());

    // Retention one second short of the horizon the entity gives: refused, naming both.
    let short = (HORIZON_SECS - 1).to_string();
    let (child, lines) = worker(&emulator, &store, &[("SB_INBOX_RETENTION_SECS", short)]);
    let (status, log) = exit(child, &lines).await;
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "shorter than the replay horizon {HORIZON_SECS} s (message TTL 10800 s, plus lock duration × max delivery count 315 s"
        )),
        "{log}"
    );

    // Retention equal to it: the worker starts, having read the entity.
    let (child, lines) = worker(
        &emulator,
        &store,
        &[("SB_INBOX_RETENTION_SECS", HORIZON_SECS.to_string())],
    );
    let read = logged(&lines, "Entity settings read from the management API").await;
    assert!(
        read.contains(&format!("horizon_secs={HORIZON_SECS}")),
        "{read}"
    );
    assert!(read.contains("lock_duration=Some(45s)"), "{read}");
    let health = logged(&lines, "Health endpoints listening").await;
    let addr = logged_health_address(&health).unwrap();
    ready(addr).await;
    sigterm_exits_0(child).await;
    emulator.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(store_dir);
}

/// Issue 40, M5: every hosted entity is read and judged, and retention must outlast the
/// longest horizon. Two `[[consumers]]` on `orders` (TTL 1 d) and `returns` (TTL 14 d), with a
/// retention of 15 d (past `orders`' horizon, inside `returns`'): the start is refused naming
/// `returns`. Before, only the first consumer's entity was judged and the worker started,
/// deleting `returns`' inbox rows inside its own horizon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_must_outlast_every_hosted_entitys_horizon() {
    let dir = crate::tls::tls_dir("entity-two");
    let day = Duration::from_secs(86_400);
    let entity = |ttl_days: u32| EntityProperties {
        lock_duration: Duration::from_secs(45),
        max_delivery_count: 7,
        default_message_time_to_live: day * ttl_days,
        ..EntityProperties::default()
    };
    let emulator = crate::support::emulator::start(
        vec![queue("orders", entity(1)), queue("returns", entity(14))],
        EmulatorOptions::default()
            .with_tls_listen("127.0.0.1:0", TlsIdentity::Generate(dir.clone())),
    )
    .await;
    let (store_dir, db) = sqlite_file_store("entity-two").await;
    let config = store_dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "sqlite://{}"
[[consumers]]
name = "inventory.orders"
entity = "orders"
[[consumers]]
name = "inventory.returns"
entity = "returns"
"#,
            db.display()
        ),
    )
    .unwrap();
    let mut child = cli::command(Some(&emulator.tls_connection_string().unwrap()), &["run"])
        .arg("--config")
        .arg(&config)
        .env(
            "SB_INBOX_SERVICEBUS_CA_FILE",
            emulator.tls_ca_file().unwrap(),
        )
        .env("SB_INBOX_HEALTH_PORT", "0")
        .env("SB_INBOX_RETENTION_SECS", (15 * 86_400).to_string())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().unwrap();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().unwrap().push(strip_ansi(&line));
        }
    });
    let (status, log) = exit(child, &lines).await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("returns"), "{log}");
    assert!(log.contains("shorter than the replay horizon"), "{log}");
    assert_eq!(emulator.links().len(), 0, "nothing was received");
    emulator.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(store_dir);
}

/// protocol3 F4: a management API that keeps answering 429 (throttled at a fleet roll-out)
/// through the client's retries is no reason to refuse the start: the worker falls back to
/// `[entity]`, says so on `/readyz`, and runs. Then, with every read stalled, a SIGTERM during
/// the check ends the worker at once (exit 0) instead of after the check's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_management_api_falls_back_and_a_stalled_one_yields_to_sigterm() {
    let (emulator, dir) = tls_emulator("entity-throttled").await;
    let (store_dir, db) = sqlite_file_store("entity-throttled").await;
    let store = format!("sqlite://{}", db.display());
    emulator.fail_management_requests([sb_emulator::ManagementFault::Status(429); 4]);
    let (child, lines) = worker(&emulator, &store, &[]);
    let fell_back = logged(
        &lines,
        "Entity settings not read; using [entity] as configured",
    )
    .await;
    assert!(fell_back.contains("kept failing"), "{fell_back}");
    assert!(fell_back.contains("429"), "{fell_back}");
    let health = logged(&lines, "Health endpoints listening").await;
    let addr = logged_health_address(&health).unwrap();
    ready(addr).await;
    let readyz = http_get(addr, "/readyz").await;
    assert!(readyz.contains("settings from [entity]"), "{readyz}");
    sigterm_exits_0(child).await;

    emulator.fail_management_requests([sb_emulator::ManagementFault::Stall; 8]);
    let (child, lines) = worker(&emulator, &store, &[]);
    logged(&lines, "Health endpoints listening").await;
    // The check is under way (each try stalls for 10 s, 40 s and more in all): SIGTERM ends
    // it well before.
    tokio::time::timeout(Duration::from_secs(30), sigterm_exits_0(child))
        .await
        .expect("SIGTERM ends the start-up check");
    emulator.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(store_dir);
}
