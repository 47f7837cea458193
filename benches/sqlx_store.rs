//! The two PostgreSQL stores side by side in one run (issue 45): `PgStore` (tokio-postgres) and
//! `SqlxPgStore` (sqlx), each running the same inbox transaction a handler with its own SQL
//! runs: begin, inbox row, business key, the handler's own `UPDATE` (through `PgTx::execute`,
//! and through a sqlx query on `SqlxPgTx::conn`), commit. No broker: the store's cost alone.
//!
//! `cargo bench -p sb-inbox-cli --bench sqlx_store` (PostgreSQL at `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). Concurrency 1 and 8; the two stores alternate
//! `ROUNDS` times on fresh schemas, each round `MESSAGES` transactions; the best round of each
//! is printed with the ratio sqlx ÷ tokio-postgres. A third column runs `SqlxPgStore` on a pool
//! with sqlx's default options (`SqlxPgStore::from_pool`), which pings every connection it
//! hands out: the round trip `SqlxPgStore::connect` turns off.
//!
//! It needs sb-inbox alone (`postgres`, `sqlx-postgres`), so a release build can skip the
//! workspace's dev-dependencies: a scratch crate outside the workspace with this file as its
//! bench, `sb-inbox = { path = …, features = ["postgres", "sqlx-postgres"] }` and tokio with
//! `rt-multi-thread`, then `cargo bench` there.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use sb_inbox::{PgStore, SqlxPgStore, Store, StoreTx, Tx, sqlx};

const ROUNDS: usize = 3;
const MESSAGES: usize = 2000;
const CONSUMER: &str = "bench.sqlx";

/// The bench's schemas: the core migrations only (no reference-consumer tables).
#[path = "common/pg_core.rs"]
mod pg_schema;

/// One inbox transaction of message `i`, on either store.
trait Bench: Clone + Send + Sync + 'static {
    fn one(&self, i: usize) -> impl Future<Output = ()> + Send;
}

impl Bench for PgStore {
    async fn one(&self, i: usize) {
        let id = format!("m-{i}");
        let mut tx = self.begin().await.unwrap();
        tx.insert_inbox(CONSUMER, &id).await.unwrap();
        tx.claim_business_key(CONSUMER, &format!("order:{i}"), &id)
            .await
            .unwrap();
        let sku = format!("SKU-{}", i % 64);
        tx.execute("UPDATE bench_stock SET n = n + 1 WHERE sku = $1", &[&sku])
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
}

impl Bench for SqlxPgStore {
    async fn one(&self, i: usize) {
        let id = format!("m-{i}");
        let mut tx = self.begin().await.unwrap();
        tx.insert_inbox(CONSUMER, &id).await.unwrap();
        tx.claim_business_key(CONSUMER, &format!("order:{i}"), &id)
            .await
            .unwrap();
        sqlx::query("UPDATE bench_stock SET n = n + 1 WHERE sku = $1")
            .bind(format!("SKU-{}", i % 64))
            .execute(tx.conn().await.unwrap())
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
}

/// A fresh schema `bench_sqlx_<pid>_<tag>` with the core migrations and 64 stock rows; its URL.
async fn schema(tag: &str) -> String {
    let schema = format!("bench_sqlx_{}_{tag}", std::process::id());
    let store = pg_schema::fresh_core_schema(&schema, 2).await;
    store
        .query(
            "CREATE TABLE bench_stock (sku text PRIMARY KEY, n bigint NOT NULL)",
            &[],
        )
        .await
        .unwrap();
    store
        .query(
            "INSERT INTO bench_stock SELECT 'SKU-' || g, 0 FROM generate_series(0, 63) g",
            &[],
        )
        .await
        .unwrap();
    pg_schema::schema_url(&schema)
}

/// Transactions per second of `concurrency` tasks taking message numbers until `MESSAGES`.
async fn rate<S: Bench>(store: S, concurrency: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (store, next) = (store.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= MESSAGES {
                        return;
                    }
                    store.one(i).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    MESSAGES as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!(
            "inbox transaction with the handler's own UPDATE, {MESSAGES} per round, best of {ROUNDS} (PostgreSQL at {})",
            pg_schema::pg_url()
        );
        println!(
            "{:>11} | {:>18} | {:>12} | {:>11} | {:>22}",
            "concurrency", "tokio-postgres tx/s", "sqlx tx/s", "sqlx/tokio", "sqlx, pool pinging tx/s"
        );
        for concurrency in [1usize, 8] {
            let pool = concurrency as u32 + 1;
            let (mut pg_best, mut sqlx_best, mut ping_best) = (0f64, 0f64, 0f64);
            for round in 0..ROUNDS {
                let url = schema(&format!("pg{concurrency}_{round}")).await;
                let pg = PgStore::connect(&url, pool).await.unwrap();
                pg_best = pg_best.max(rate(pg, concurrency).await);
                let url = schema(&format!("sqlx{concurrency}_{round}")).await;
                let sqlx = SqlxPgStore::connect(&url, pool).await.unwrap();
                sqlx_best = sqlx_best.max(rate(sqlx, concurrency).await);
                let url = schema(&format!("ping{concurrency}_{round}")).await;
                let pinging = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(pool)
                    .connect(&url)
                    .await
                    .unwrap();
                let pinging = SqlxPgStore::from_pool(pinging);
                ping_best = ping_best.max(rate(pinging, concurrency).await);
            }
            println!(
                "{concurrency:>11} | {pg_best:>18.0} | {sqlx_best:>12.0} | {:>10.2}x | {ping_best:>22.0}",
                sqlx_best / pg_best
            );
        }
        for concurrency in [1usize, 8] {
            for round in 0..ROUNDS {
                for kind in ["pg", "sqlx", "ping"] {
                    let schema = format!("bench_sqlx_{}_{kind}{concurrency}_{round}", std::process::id());
                    pg_schema::drop_schema(&schema).await;
                }
            }
        }
    });
}
