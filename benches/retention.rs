//! Retention beside consumers: consumer throughput on PostgreSQL without cleanup, then while the
//! retention task deletes millions of expired inbox rows in batches, then without cleanup again.
//!
//! `cargo bench --bench retention` (PostgreSQL at `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). Set-up (not timed): a fresh schema with
//! `RETENTION_BENCH_ROWS` (default 2 000 000) inbox rows of another consumer processed 60 days
//! ago (`generate_series`), then `VACUUM ANALYZE`. The consumer is the inventory consumer's
//! transaction (begin, inbox row, business key, reservation, stock increment, commit) run by
//! `CONCURRENCY` tasks, all the time; the retention task deletes rows older than 30 days in
//! batches of `RETENTION_BENCH_BATCH` (default 1000). Windows of `RETENTION_BENCH_SECS` (default
//! 5) seconds alternate: without cleanup, then with the sweep running (stopped at the window's
//! end and resumed in the next cleanup window), until every expired row is gone, and a last
//! window without. Alternating keeps slow drifts (the consumer's tables growing, other load on
//! the machine, autovacuum after the deletes) out of the ratio: it compares the consumer's
//! msg/s over all cleanup windows with its msg/s over all windows without.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sb_inbox::PgStore;
use sb_inbox::retention::{RetentionConfig, RetentionTask};
use sb_inbox_cli::inventory::{OrderLine, OrderPlaced};
use tokio_util::sync::CancellationToken;

#[path = "common/inventory_tx.rs"]
mod inventory_tx;
const CONCURRENCY: usize = 8;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn schema() -> String {
    format!("bench_retention_{}", std::process::id())
}

async fn admin(sql: &str) {
    let admin = PgStore::connect(&pg_url(), 1).await.unwrap();
    admin.query(sql, &[]).await.unwrap();
}

async fn store(rows: u64) -> PgStore {
    let schema = schema();
    admin(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
    admin(&format!("CREATE SCHEMA {schema}")).await;
    let sep = if pg_url().contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-csearch_path%3D{schema}", pg_url());
    let store = PgStore::connect(&url, CONCURRENCY as u32 + 4)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    sb_inbox_cli::inventory::InventoryStore::migrate_inventory(&store)
        .await
        .unwrap();
    let started = Instant::now();
    store
        .query(
            "INSERT INTO sb_inbox (consumer, message_id, processed_at)
             SELECT 'billing.order-placed.v1', 'old-' || g,
                    now() - interval '60 days' + g * interval '1 millisecond'
               FROM generate_series(1, $1::bigint) AS g",
            &[&i64::try_from(rows).unwrap()],
        )
        .await
        .unwrap();
    store.query("VACUUM ANALYZE sb_inbox", &[]).await.unwrap();
    eprintln!(
        "set-up: {rows} expired inbox rows in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    store
}

/// `CONCURRENCY` tasks running the inventory consumer's transaction until `stop`; returns the
/// shared commit counter.
fn consumers(
    store: &PgStore,
    stop: &CancellationToken,
    next: &Arc<AtomicU64>,
) -> (Arc<AtomicU64>, Vec<tokio::task::JoinHandle<()>>) {
    let commits = Arc::new(AtomicU64::new(0));
    let tasks = (0..CONCURRENCY)
        .map(|_| {
            let (store, stop, next, commits) =
                (store.clone(), stop.clone(), next.clone(), commits.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let id = format!("m-{i}");
                    let order = OrderPlaced {
                        order_id: format!("o-{i}"),
                        lines: vec![OrderLine {
                            sku: format!("SKU-{}", i % 64),
                            quantity: 2,
                        }],
                    };
                    inventory_tx::apply(&store, &id, &order).await;
                    commits.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    (commits, tasks)
}

#[derive(Default)]
struct Phase {
    commits: u64,
    seconds: f64,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.commits as f64 / self.seconds
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let rows = env_number("RETENTION_BENCH_ROWS", 2_000_000);
    let window = Duration::from_secs(env_number("RETENTION_BENCH_SECS", 5));
    let batch = usize::try_from(env_number("RETENTION_BENCH_BATCH", 1000)).unwrap();
    let store = store(rows).await;
    let next = Arc::new(AtomicU64::new(0));
    let mut config = RetentionConfig::new(Duration::from_secs(30 * 86_400));
    config.batch_size = batch;
    let task = RetentionTask::new(store.clone(), config);

    let stop = CancellationToken::new();
    let (commits, tasks) = consumers(&store, &stop, &next);
    let (mut without, mut with) = (Phase::default(), Phase::default());
    let (mut deleted, mut batches, mut windows) = (0, 0, 0);
    let mut finished = false;
    loop {
        let (before, started) = (commits.load(Ordering::Relaxed), Instant::now());
        tokio::time::sleep(window).await;
        without.commits += commits.load(Ordering::Relaxed) - before;
        without.seconds += started.elapsed().as_secs_f64();
        if finished {
            break;
        }
        let (before, started) = (commits.load(Ordering::Relaxed), Instant::now());
        let end = CancellationToken::new();
        let timer = tokio::spawn({
            let end = end.clone();
            async move {
                tokio::time::sleep(window).await;
                end.cancel();
            }
        });
        let sweep = task.sweep(&end).await.unwrap();
        // A sweep that returns before its window ends found nothing more to delete.
        finished = !end.is_cancelled();
        timer.abort();
        with.commits += commits.load(Ordering::Relaxed) - before;
        with.seconds += started.elapsed().as_secs_f64();
        deleted += sweep.inbox_deleted;
        batches += sweep.batches;
        windows += 1;
    }
    stop.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    let left: i64 = store
        .query(
            "SELECT count(*) FROM sb_inbox WHERE consumer = 'billing.order-placed.v1'",
            &[],
        )
        .await
        .unwrap()[0]
        .get(0);
    assert_eq!((left, deleted), (0, rows), "every expired row deleted");

    println!(
        "retention beside {CONCURRENCY} consumers on PostgreSQL, {rows} expired rows, batches of {batch}, {windows} cleanup windows of {} s:",
        window.as_secs()
    );
    println!(
        "  consumer without cleanup: {:.0} msg/s ({:.0} s)",
        without.rate(),
        without.seconds
    );
    println!(
        "  consumer during cleanup:  {:.0} msg/s ({:.0} s): {:.2}x",
        with.rate(),
        with.seconds,
        with.rate() / without.rate()
    );
    println!(
        "  deleted {deleted} rows in {batches} batches: {:.0} rows/s while consumers ran",
        deleted as f64 / with.seconds
    );
    admin(&format!("DROP SCHEMA IF EXISTS {} CASCADE", schema())).await;
}
