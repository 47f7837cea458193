//! PostgreSQL store on `tokio-postgres`, pooled by `bb8` with our own connection manager.
//!
//! # Layout
//! - [`PgStore`] (here, with its pooled connection [`PgConn`] and [`PgManager`]) and [`PgTx`]
//!   (`tx`): the [`Store`](crate::Store) port.
//! - `migrate`: the core migrations ([`MIGRATIONS`]) and how a set of them is applied.
//! - `statements`: the per-connection cache of prepared statements (every statement a
//!   transaction runs, the handler's included, is prepared once per connection).
//! - `pipeline`: several statements in one round trip.
//! - `bounds`: statement and lock timeouts, TCP keepalive. `tls`: `sslmode` and certificates.
//!
//! # Round trips
//! A transaction costs what the database needs and nothing more: checking a connection out of
//! the pool sends nothing (a connection is known broken when the driver has seen its socket
//! close, or a statement on it failed with a connection error; such a connection is evicted);
//! `BEGIN` travels with the inbox insert; every statement is bound to a cached prepared
//! statement; [`PgTx::pipeline`] sends independent statements together; the commit is one
//! message. The reference consumer's transaction for a 2-line order takes 4 round trips
//! (`pgbench -M prepared` needs 9 for the same statements).
//!
//! The manager also evicts a connection that was returned inside a transaction (a handler
//! cancelled mid-statement), so the pool never hands out a connection in an unknown state.
//! Connections are plain TCP, a Unix socket, or TLS with verification (`sslmode`,
//! `sslrootcert`: see `tls`).

mod bounds;
mod classify;
mod migrate;
mod outbox;
mod pipeline;
mod statements;
mod tls;
mod tx;

use bb8::{ManageConnection, Pool, PooledConnection};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

pub use bounds::{LOCK_TIMEOUT, STATEMENT_TIMEOUT};
pub use classify::classify;
pub use migrate::MIGRATIONS;
pub use tx::PgTx;

use crate::ports::{ErrorKind, StoreError};
use statements::StatementCache;

/// A pooled connection with its prepared statements.
#[derive(Debug)]
pub struct PgConn {
    client: Client,
    statements: StatementCache,
    in_tx: bool,
    /// A statement failed with a connection error: the pool drops this connection.
    broken: bool,
}

impl PgConn {
    /// Classifies `error`, marking the connection broken on a connection error.
    fn fail(&mut self, error: tokio_postgres::Error) -> StoreError {
        let error = classify(error);
        if error.kind() == ErrorKind::Connection {
            self.broken = true;
        }
        error
    }

    /// The prepared statements for `sqls`, in order; those not cached yet are prepared
    /// together in one round trip and cached.
    async fn prepare_all(&mut self, sqls: &[&str]) -> Result<Vec<Statement>, StoreError> {
        let mut found: Vec<Option<Statement>> =
            sqls.iter().map(|sql| self.statements.get(sql)).collect();
        let mut missing: Vec<&str> = Vec::new();
        for (sql, statement) in sqls.iter().zip(&found) {
            if statement.is_none() && !missing.contains(sql) {
                missing.push(sql);
            }
        }
        if !missing.is_empty() {
            let client = &self.client;
            let prepared = pipeline::in_order(missing.iter().map(|sql| client.prepare(sql))).await;
            let mut fresh = Vec::with_capacity(missing.len());
            for (sql, result) in missing.iter().zip(prepared) {
                let statement = result.map_err(|error| self.fail(error))?;
                self.statements.insert(sql, statement.clone());
                fresh.push((*sql, statement));
            }
            for (sql, slot) in sqls.iter().zip(found.iter_mut()) {
                if slot.is_none() {
                    *slot = fresh
                        .iter()
                        .find(|(text, _)| text == sql)
                        .map(|(_, statement)| statement.clone());
                }
            }
        }
        Ok(found.into_iter().flatten().collect())
    }

    /// The prepared statement for `sql` (cached, or prepared now and cached).
    async fn prepared(&mut self, sql: &str) -> Result<Statement, StoreError> {
        self.prepare_all(&[sql])
            .await?
            .pop()
            .ok_or_else(|| StoreError::of_kind(ErrorKind::Unknown, "no statement"))
    }

    /// Classifies the outcome of running the cached statement for `sql`, forgetting the
    /// statement when the error says it went stale.
    fn settle<T>(
        &mut self,
        sql: &str,
        result: Result<T, tokio_postgres::Error>,
    ) -> Result<T, StoreError> {
        result.map_err(|error| {
            let error = self.fail(error);
            self.statements.invalidate(sql, &error);
            error
        })
    }

    /// Executes `sql` through the statement cache.
    async fn execute_cached(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let statement = self.prepared(sql).await?;
        let result = self.client.execute(&statement, params).await;
        self.settle(sql, result)
    }

    /// Runs the query `sql` through the statement cache.
    async fn query_cached(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepared(sql).await?;
        let result = self.client.query(&statement, params).await;
        self.settle(sql, result)
    }

    /// A simple-protocol batch (no parameters), classifying its error.
    async fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        let result = self.client.batch_execute(sql).await;
        result.map_err(|error| self.fail(error))
    }
}

/// Connects `tokio-postgres` clients for the pool.
#[derive(Debug, Clone)]
pub struct PgManager {
    config: tokio_postgres::Config,
    tls: tls::PgTls,
    /// The `SET`s each new session runs ([`bounds`]).
    session_setup: String,
}

impl ManageConnection for PgManager {
    type Connection = PgConn;
    type Error = StoreError;

    async fn connect(&self) -> Result<PgConn, StoreError> {
        let (client, connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(classify)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "PostgreSQL connection ended.");
            }
        });
        if !self.session_setup.is_empty() {
            client
                .batch_execute(&self.session_setup)
                .await
                .map_err(classify)?;
        }
        Ok(PgConn {
            client,
            statements: StatementCache::default(),
            in_tx: false,
            broken: false,
        })
    }

    /// No round trip: the driver's connection task ends when the socket closes (a server
    /// restart, a terminated backend), and a failed statement marks the connection broken. A
    /// peer that vanished without closing is caught by TCP keepalive (`bounds`). bb8 drops a
    /// connection that fails this check and hands out the next one.
    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), StoreError> {
        if conn.broken || conn.client.is_closed() {
            return Err(StoreError::connection(
                "the pooled PostgreSQL connection is closed",
            ));
        }
        Ok(())
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.in_tx || conn.broken || conn.client.is_closed()
    }
}

/// A PostgreSQL store.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example() -> Result<(), sb_inbox::StoreError> {
/// use sb_inbox::{PgStore, Store, StoreTx};
/// let store = PgStore::connect("postgres://postgres@127.0.0.1/test", 16).await?;
/// store.migrate().await?;
/// let mut tx = store.begin().await?;
/// tx.insert_inbox("inventory", "m-1").await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: Pool<PgManager>,
}

impl PgStore {
    /// Connects a pool of at most `max_size` connections to a `postgres://` URL (libpq key/value
    /// strings work too). The URL's `options` can set `-c search_path=…`. Sessions get a
    /// statement timeout ([`STATEMENT_TIMEOUT`]), a lock timeout ([`LOCK_TIMEOUT`]) and TCP
    /// keepalive unless the URL sets them (`options=-c lock_timeout=5s`, `keepalives_idle=…`). TLS: `sslmode=require`
    /// (or `verify-full`) with the server's certificate verified against the webpki roots and
    /// `sslrootcert=PATH`; no `sslmode` means plain TCP.
    ///
    /// # Errors
    /// [`ErrorKind::Configuration`] for an unparseable URL or `sslrootcert`; the classified error of a
    /// first connection, made before returning.
    pub async fn connect(url: &str, max_size: u32) -> Result<Self, StoreError> {
        let (mut config, tls) = tls::parse(url)?;
        let session_setup = bounds::apply(&mut config, url);
        let manager = PgManager {
            config,
            tls,
            session_setup,
        };
        // One connection up front, so that a wrong host, password or certificate fails here with
        // its cause; the pool would retry it silently until its timeout.
        drop(manager.connect().await?);
        let pool = Pool::builder()
            .max_size(max_size.max(1))
            .build(manager)
            .await?;
        Ok(PgStore { pool })
    }

    async fn connection(&self) -> Result<PooledConnection<'static, PgManager>, StoreError> {
        super::pool::checkout(&self.pool).await
    }

    /// Runs a query outside any inbox transaction (reports, tests).
    ///
    /// # Errors
    /// The classified [`StoreError`].
    pub async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.connection().await?;
        conn.query_cached(sql, params).await
    }
}
