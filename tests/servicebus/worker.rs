//! The worker end to end over the emulator: two instances, PostgreSQL, duplicates, poison.

use std::time::Duration;

use sb_inbox::worker::WorkerConfig;
use sb_inbox::{Message, PgStore};
use sb_inbox_cli::inventory::InventoryStore;
use tokio_util::sync::CancellationToken;

use crate::support::cli;
use crate::support::emulator::{client, emulator, send};
use crate::support::orders::order;
use crate::support::{
    inventory_totals, pg_store, pg_url, schema_for, sqlite_file_store, with_search_path,
};

/// Waits (bounded) until the queue holds nothing active or locked and `settled` messages were
/// completed or dead-lettered.
pub(crate) async fn drained(emulator: &sb_emulator::Emulator, settled: u64) {
    queue_drained(emulator, "orders", settled).await;
}

/// As [`drained`], for any queue.
pub(crate) async fn queue_drained(emulator: &sb_emulator::Emulator, queue: &str, settled: u64) {
    let entity = emulator.broker().entity(queue).unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let c = entity.counts();
            if c.active == 0 && c.locked == 0 && c.completed + c.dead_lettered_total >= settled {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the queue drains");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_on_postgres_apply_each_order_once() {
    crate::support::init_tracing();
    let store: PgStore = pg_store("sb_two_workers", 4).await;
    let emulator = emulator("PT5S").await;
    let sender = client(&emulator).sender("orders");
    let mut sent = 0;
    for i in 0..30 {
        let message = order(&format!("m-{i}"), &format!("o-{i}"));
        if i % 3 == 0 {
            sender.send(message.clone()).await.unwrap();
            sent += 1;
        }
        sender.send(message).await.unwrap();
        sent += 1;
    }
    sender
        .send(Message::new("poison", "orders.order-placed.v1", "{nope"))
        .await
        .unwrap();
    sent += 1;

    let env = |name: &str| match name {
        "SB_INBOX_CONSUMER" => Some(sb_inbox_cli::inventory::CONSUMER.to_owned()),
        "SB_INBOX_STORE" => Some(with_search_path(&pg_url(), &schema_for("sb_two_workers"))),
        "SB_INBOX_SERVICEBUS_CONNECTION" => Some(emulator.connection_string()),
        "SB_INBOX_ENTITY" => Some("orders".to_owned()),
        "SB_INBOX_CONCURRENCY" => Some("4".to_owned()),
        "SB_INBOX_LOCK_MARGIN_SECS" => Some("2".to_owned()),
        _ => None,
    };
    let config = WorkerConfig::load(None, &env).unwrap();
    let shutdown = CancellationToken::new();
    let workers = [
        tokio::spawn({
            let (config, token) = (config.clone(), shutdown.clone());
            async move { sb_inbox_cli::run::run(&config, None, token).await }
        }),
        tokio::spawn({
            let (config, token) = (config.clone(), shutdown.clone());
            async move { sb_inbox_cli::run::run(&config, None, token).await }
        }),
    ];
    drained(&emulator, sent).await;
    shutdown.cancel();
    let mut processed = 0;
    let mut duplicates = 0;
    for worker in workers {
        let stats = worker.await.unwrap().unwrap();
        processed += stats.processed;
        duplicates += stats.duplicate;
    }
    assert_eq!((processed, duplicates), (30, 10));
    assert_eq!(inventory_totals(&store).await, (30, 30, 60));
    assert_eq!(
        emulator
            .broker()
            .entity("orders/$DeadLetterQueue")
            .unwrap()
            .counts()
            .active,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_applies_every_order_exactly_once() {
    let plan = sb_inbox_cli::demo::DemoPlan {
        orders: 30,
        redeliveries: 5,
        concurrent_copies: 3,
        republished: 2,
        refused_settlements: 2,
        poison: 1,
        unsupported: 1,
    };
    let report = sb_inbox_cli::demo::run(plan, &|_, _| {}).await.unwrap();
    assert!(report.is_correct(), "{report:?}");
    assert_eq!(report.counts.reservations, 33);
    assert_eq!(report.stats.permanent, 2);
    // The refused settlements (`server-busy`) are retried by lock token and succeed: no
    // redelivery comes of them.
    assert_eq!(report.stats.settle_failed, 0);
    assert_eq!(report.stats.duplicate, 5 + 3 + 2);
    let table = sb_inbox_cli::demo::table(&report);
    assert!(table.contains("distinct orders 33: OK"), "{table}");
}

#[test]
fn run_with_invalid_config_exits_2_listing_every_problem() {
    let output = std::process::Command::new(cli::BINARY)
        .args(["run"])
        .env_clear()
        .env("SB_INBOX_CONCURRENCY", "zero")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for field in [
        "SB_INBOX_CONSUMER",
        "SB_INBOX_STORE",
        "SB_INBOX_SERVICEBUS_CONNECTION",
        "SB_INBOX_CONCURRENCY",
    ] {
        assert!(stderr.contains(field), "{field} missing from:\n{stderr}");
    }
}

/// Reads the worker's stderr until the health endpoints log their address.
pub(crate) fn health_address(stderr: std::process::ChildStderr) -> std::net::SocketAddr {
    use std::io::BufRead as _;
    let mut lines = std::io::BufReader::new(stderr).lines();
    loop {
        let line = lines
            .next()
            .expect("the worker logs its health address")
            .unwrap();
        if let Some(addr) = logged_health_address(&strip_ansi(&line)) {
            // Keep draining stderr so the worker never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return addr;
        }
    }
}

/// The address in the worker's `Health endpoints listening addr=…` line, if `line` is it.
pub(crate) fn logged_health_address(line: &str) -> Option<std::net::SocketAddr> {
    if !line.contains("Health endpoints listening") {
        return None;
    }
    let at = line.find("addr=")?;
    let addr: String = line[at + 5..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    addr.replace("0.0.0.0", "127.0.0.1").parse().ok()
}

pub(crate) fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A migrated SQLite database in a directory of its own (`tag`), and `sb-inbox run` on it
/// consuming `orders` over `connection`, with `extra` environment; stderr piped.
pub(crate) async fn sqlite_worker(
    tag: &str,
    connection: &str,
    extra: &[(&str, &str)],
) -> (std::path::PathBuf, std::path::PathBuf, std::process::Child) {
    let (dir, db) = sqlite_file_store(tag).await;
    let child = cli::worker(&format!("sqlite://{}", db.display()), connection)
        .env("SB_INBOX_HEALTH_PORT", "0")
        .envs(extra.iter().copied())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    (dir, db, child)
}

/// As [`sqlite_worker`], with `args` after `run` (`--config FILE`).
pub(crate) async fn sqlite_worker_with_args(
    tag: &str,
    connection: &str,
    args: &[&str],
) -> (std::path::PathBuf, std::path::PathBuf, std::process::Child) {
    let (dir, db) = sqlite_file_store(tag).await;
    let child = cli::worker(&format!("sqlite://{}", db.display()), connection)
        .args(args)
        .env("SB_INBOX_HEALTH_PORT", "0")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    (dir, db, child)
}

/// Waits (bounded) until the worker's `/readyz` answers 200.
pub(crate) async fn ready(addr: std::net::SocketAddr) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("ready once broker and store are connected");
}

pub(crate) use crate::support::cli::sigterm_exits_0;

pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let _ = stream
        .write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
        .await;
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    response
}

/// `sb-inbox run` on the emulator's `orders` queue and `store`, health on an ephemeral port;
/// the process and its health address.
async fn spawn_worker(
    emulator: &sb_emulator::Emulator,
    store: &str,
) -> (std::process::Child, std::net::SocketAddr) {
    let mut child = cli::worker(store, &emulator.connection_string())
        .env("SB_INBOX_HEALTH_PORT", "0")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let addr = tokio::task::spawn_blocking(move || health_address(stderr))
        .await
        .unwrap();
    (child, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_process_is_ready_then_drains_and_exits_0_on_sigterm() {
    let emulator = emulator("PT30S").await;
    let (dir, db) = sqlite_file_store("sigterm").await;

    let (child, addr) = spawn_worker(&emulator, &format!("sqlite://{}", db.display())).await;
    assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    ready(addr).await;

    send(&client(&emulator), "orders", order("m-1", "o-1")).await;
    drained(&emulator, 1).await;

    sigterm_exits_0(child).await;
    let counts = sb_inbox::SqliteStore::open(&db)
        .unwrap()
        .inventory_counts()
        .await
        .unwrap();
    assert_eq!(counts.reservations, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET /readyz` until `done` accepts the response (bounded).
async fn readyz_until(
    addr: std::net::SocketAddr,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let response = http_get(addr, "/readyz").await;
            if done(&response) {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("/readyz never showed {what}"))
}

/// A first deployment: the worker starts before its database exists and before `migrate` ran.
/// It stays alive (`/healthz` 200), reports why it is not ready on `/readyz`, and once the
/// database and the schema appear it becomes ready and processes messages: the same process,
/// no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_started_before_its_database_and_migrate_becomes_ready_without_a_restart() {
    let emulator = emulator("PT30S").await;
    let admin = PgStore::connect(&pg_url(), 1)
        .await
        .expect("PostgreSQL reachable at DATABASE_URL");
    let database = format!("sb_first_deploy_{}", std::process::id());
    admin
        .query(&format!("DROP DATABASE IF EXISTS {database}"), &[])
        .await
        .unwrap();
    // The same server, another database: postgres://USER@HOST:PORT/DB[?…].
    let base = pg_url();
    let (before_query, query) = base.split_once('?').unwrap_or((&base, ""));
    let server = &before_query[..before_query.rfind('/').unwrap()];
    let url = if query.is_empty() {
        format!("{server}/{database}")
    } else {
        format!("{server}/{database}?{query}")
    };

    let (mut child, addr) = spawn_worker(&emulator, &url).await;

    // No database: alive, not ready, and the reason names the store's error.
    assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    let response = readyz_until(addr, "the missing database", |r| {
        r.contains(&database) && r.contains("\"store\"")
    })
    .await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.contains("\"ready\":false"), "{response}");

    // The database exists, the schema does not yet.
    admin
        .query(&format!("CREATE DATABASE {database}"), &[])
        .await
        .unwrap();
    let response = readyz_until(addr, "the missing schema", |r| {
        r.contains("schema not migrated")
    })
    .await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the worker stays alive"
    );

    // The core schema without the reference consumer's tables: still alive, not ready, and
    // `/readyz` names the command that fixes it.
    let migrate = cli::run(&["migrate", "--store", &url]);
    assert!(migrate.status.success(), "{migrate:?}");
    let response = readyz_until(addr, "the missing inventory tables", |r| {
        r.contains("migrate --inventory")
    })
    .await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the worker stays alive"
    );

    let migrate = cli::run(&["migrate", "--inventory", "--store", &url]);
    assert!(migrate.status.success(), "{migrate:?}");
    let response = readyz_until(addr, "ready", |r| r.starts_with("HTTP/1.1 200")).await;
    assert!(response.contains("\"ready\":true"), "{response}");

    send(&client(&emulator), "orders", order("m-1", "o-1")).await;
    drained(&emulator, 1).await;
    let store = PgStore::connect(&url, 1).await.unwrap();
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 1);
    assert!(child.try_wait().unwrap().is_none(), "the same process");

    sigterm_exits_0(child).await;
    drop(store);
    admin
        .query(
            &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
            &[],
        )
        .await
        .unwrap();
}
