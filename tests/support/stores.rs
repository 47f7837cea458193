//! Real stores for tests, each with resources of its own (a PostgreSQL schema, a SQL Server
//! database, an in-memory SQLite), and the provider-specific SQL tests read and age rows with.

use std::future::Future;
use std::path::PathBuf;

use sb_inbox::store::MssqlConfig;
use sb_inbox::{MssqlStore, PgStore, SqliteStore, Store, StoreError};
use sb_inbox_cli::inventory::InventoryStore;

/// The PostgreSQL server tests use: `DATABASE_URL`, defaulting to the local one.
pub fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema name unique to `test`, so tests running at once never share tables.
pub fn schema_for(test: &str) -> String {
    let clean: String = test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("t_{}_{}", clean.to_lowercase(), std::process::id())
}

/// A migrated PostgreSQL store (core and inventory tables) in a fresh schema of its own.
pub async fn pg_store(test: &str, pool: u32) -> PgStore {
    let url = fresh_pg_schema(test).await;
    let store = PgStore::connect(&url, pool).await.expect("connect");
    store.migrate().await.expect("migrate");
    store.migrate_inventory().await.expect("migrate inventory");
    store
}

/// The URL of an empty schema of `test`'s own (dropped first if a run left it behind).
pub async fn fresh_pg_schema(test: &str) -> String {
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
    with_search_path(&pg_url(), &schema)
}

/// `url` with `options=-c search_path=SCHEMA` added.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// The SQL Server tests use: `SB_INBOX_MSSQL` (an ADO.NET connection string or `mssql://`
/// URL). There is no SQL Server on the CI machine, so unset means skipped.
pub fn mssql_url() -> Option<String> {
    std::env::var("SB_INBOX_MSSQL")
        .ok()
        .filter(|url| !url.trim().is_empty())
}

/// A migrated SQL Server store in a fresh database of its own (`SQL Server has no per-session
/// search path, so a database is the unit of isolation), or `None` when `SB_INBOX_MSSQL` is
/// not set (then the test fails under CI unless `SB_INBOX_TEST_SKIP` lists `mssql`, and says
/// `skipped` elsewhere: see `sb_testkit`).
pub async fn mssql_store(test: &str, pool: u32) -> Option<MssqlStore> {
    let Some(url) = mssql_url() else {
        sb_testkit::missing(sb_testkit::MSSQL);
        return None;
    };
    let database = schema_for(test);
    let admin = MssqlStore::connect(&url, 1)
        .await
        .expect("SQL Server reachable at SB_INBOX_MSSQL");
    admin
        .batch(&format!(
            "IF DB_ID(N'{database}') IS NOT NULL
             BEGIN
                 ALTER DATABASE [{database}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE;
                 DROP DATABASE [{database}];
             END"
        ))
        .await
        .expect("drop database");
    // Tests run in parallel; concurrent CREATE DATABASE can briefly fail on the lock of
    // `model` (1807), so retry a few times.
    let mut attempt = 0;
    loop {
        match admin.batch(&format!("CREATE DATABASE [{database}]")).await {
            Ok(_) => break,
            Err(error) if attempt < 10 && error.kind().is_transient() => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
            }
            Err(error) => panic!("create database {database}: {error}"),
        }
    }
    let mut config: MssqlConfig = url.parse().expect("SB_INBOX_MSSQL parses");
    config.set_database(&database);
    let store = MssqlStore::connect_with(config, pool)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    store.migrate_inventory().await.expect("migrate inventory");
    Some(store)
}

/// A migrated in-memory SQLite store.
pub async fn sqlite_store(_test: &str, _pool: u32) -> SqliteStore {
    let store = SqliteStore::open_in_memory().expect("open");
    store.migrate().await.expect("migrate");
    store.migrate_inventory().await.expect("migrate inventory");
    store
}

/// `(reservations, inbox rows, reserved units)` of the reference consumer: the three figures
/// a test compares after each step.
pub async fn inventory_totals<S: InventoryStore>(store: &S) -> (i64, i64, i64) {
    let counts = store.inventory_counts().await.expect("inventory counts");
    (
        counts.reservations,
        counts.inbox_rows,
        counts.reserved_units,
    )
}

/// A migrated SQLite database file (core and inventory tables) in a directory of `tag`'s own,
/// created afresh: the directory and the file, for a worker process to open.
pub async fn sqlite_file_store(tag: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("sb-inbox-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the test's directory");
    let db = dir.join("worker.db");
    // A run that stopped early leaves its file behind; this run starts empty.
    let _ = std::fs::remove_file(&db);
    let store = SqliteStore::open(&db).expect("open");
    store.migrate().await.expect("migrate");
    store.migrate_inventory().await.expect("migrate inventory");
    (dir, db)
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

impl Count for MssqlStore {
    async fn count(&self, table: &str) -> Result<i64, StoreError> {
        let rows = self
            .query(
                &format!("SELECT CAST(count(*) AS bigint) FROM {table}"),
                &[],
            )
            .await?;
        Ok(rows[0].get::<i64, _>(0).unwrap_or_default())
    }
}

impl Count for SqliteStore {
    async fn count(&self, table: &str) -> Result<i64, StoreError> {
        let sql = format!("SELECT count(*) FROM {table}");
        self.with_connection(move |conn| conn.query_row(&sql, [], |row| row.get(0)))
            .await
    }
}

/// Moves timestamps into the past, in each provider's SQL (tests make rows old this way rather
/// than by waiting).
pub trait Backdate: Store {
    /// `UPDATE table SET column = column - days WHERE filter` (test constants only).
    fn backdate(
        &self,
        table: &str,
        column: &str,
        days: u32,
        filter: &str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl Backdate for PgStore {
    async fn backdate(
        &self,
        table: &str,
        column: &str,
        days: u32,
        filter: &str,
    ) -> Result<u64, StoreError> {
        let sql = format!(
            "UPDATE {table} SET {column} = {column} - interval '{days} days' WHERE {filter}"
        );
        let mut tx = self.begin().await?;
        let n = tx.execute(&sql, &[]).await?;
        sb_inbox::StoreTx::commit(tx).await?;
        Ok(n)
    }
}

impl Backdate for MssqlStore {
    async fn backdate(
        &self,
        table: &str,
        column: &str,
        days: u32,
        filter: &str,
    ) -> Result<u64, StoreError> {
        self.execute(
            &format!(
                "UPDATE {table} SET {column} = DATEADD(day, -{days}, {column}) WHERE {filter}"
            ),
            &[],
        )
        .await
    }
}

impl Backdate for SqliteStore {
    async fn backdate(
        &self,
        table: &str,
        column: &str,
        days: u32,
        filter: &str,
    ) -> Result<u64, StoreError> {
        let sql = format!(
            "UPDATE {table} SET {column} = strftime('%Y-%m-%dT%H:%M:%fZ', {column}, '-{days} days') WHERE {filter}"
        );
        self.with_connection(move |conn| conn.execute(&sql, []))
            .await
            .map(|n| n as u64)
    }
}

/// Runs one statement of the test's own (test constants only), in its own transaction.
pub trait RawSql: Store {
    /// Runs `sql`; returns the rows it changed.
    fn run_sql(&self, sql: &str) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl RawSql for PgStore {
    async fn run_sql(&self, sql: &str) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let n = tx.execute(sql, &[]).await?;
        sb_inbox::StoreTx::commit(tx).await?;
        Ok(n)
    }
}

impl RawSql for MssqlStore {
    async fn run_sql(&self, sql: &str) -> Result<u64, StoreError> {
        self.execute(sql, &[]).await
    }
}

impl RawSql for SqliteStore {
    async fn run_sql(&self, sql: &str) -> Result<u64, StoreError> {
        let sql = sql.to_owned();
        self.with_connection(move |conn| conn.execute(&sql, []))
            .await
            .map(|n| n as u64)
    }
}
