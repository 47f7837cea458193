//! Shared test support: real stores with their own resources.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;

use sb_inbox::{PgStore, SqliteStore, Store, StoreError};

/// The PostgreSQL server tests use: `DATABASE_URL`, defaulting to the local one.
pub fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema name unique to `test`, so tests running at once never share tables.
fn schema_for(test: &str) -> String {
    let clean: String = test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("t_{}_{}", clean.to_lowercase(), std::process::id())
}

/// A migrated PostgreSQL store in a fresh schema of its own.
pub async fn pg_store(test: &str, pool: u32) -> PgStore {
    let schema = schema_for(test);
    let admin = PgStore::connect(&pg_url(), 1)
        .await
        .expect("PostgreSQL reachable at DATABASE_URL");
    admin
        .query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"), &[])
        .await
        .expect("drop schema");
    admin
        .query(&format!("CREATE SCHEMA {schema}"), &[])
        .await
        .expect("create schema");
    let url = with_search_path(&pg_url(), &schema);
    let store = PgStore::connect(&url, pool).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// `url` with `options=-c search_path=SCHEMA` added.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// A migrated in-memory SQLite store.
pub async fn sqlite_store(_test: &str, _pool: u32) -> SqliteStore {
    let store = SqliteStore::open_in_memory().expect("open");
    store.migrate().await.expect("migrate");
    store
}

/// Row counts a test can read from any store.
pub trait Count: Store {
    /// `SELECT count(*) FROM table` (table names are test constants).
    fn count(&self, table: &str) -> impl Future<Output = Result<i64, StoreError>> + Send;
}

impl Count for PgStore {
    async fn count(&self, table: &str) -> Result<i64, StoreError> {
        let rows = self
            .query(&format!("SELECT count(*) FROM {table}"), &[])
            .await?;
        Ok(rows[0].get(0))
    }
}

impl Count for SqliteStore {
    async fn count(&self, table: &str) -> Result<i64, StoreError> {
        let sql = format!("SELECT count(*) FROM {table}");
        self.with_connection(move |conn| conn.query_row(&sql, [], |row| row.get(0)))
            .await
    }
}

/// Installs a test-writer tracing subscriber once.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}
