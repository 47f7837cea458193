//! SQL Server and Azure SQL store on `tiberius`, pooled by `bb8` with our own connection
//! manager.
//!
//! # Layout
//! - [`MssqlStore`] / [`MssqlTx`] (`tx`): the [`Store`](crate::Store) port.
//! - `migrate`: the core migrations ([`MIGRATIONS`]) and how a set of them is applied.
//! - [`MssqlManager`] (`conn`): connects (TCP, TLS through rustls on ring, Azure gateway redirects,
//!   Entra ID tokens), prepares each session (`SET XACT_ABORT ON`, `SET LANGUAGE us_english`,
//!   the ANSI options filtered indexes need) and evicts connections marked broken. Checking a
//!   connection out sends nothing: a connection is broken when a request on it failed with a
//!   connection error or timed out, or when it went back inside a transaction; the commit
//!   itself checks that `@@TRANCOUNT` went to 0 (no health query per transaction).
//! - [`MssqlConfig`]: ADO.NET connection strings and `mssql://` URLs, printable without secrets.
//! - [`TokenSource`] / [`AzureTokenSource`]: Entra ID access tokens for Azure SQL.
//! - [`classify`]: error numbers and constraint names to [`ErrorKind`](crate::ErrorKind); its
//!   docs list the transient numbers and where they come from.
//!
//! Every result stream is read to its end, so a connection never goes back to the pool with
//! unread tokens. With `XACT_ABORT ON` any error inside a transaction rolls it back on the
//! server; [`StoreTx::rollback`](crate::StoreTx::rollback) is therefore tolerant of a transaction that is already gone.

mod classify;
mod config;
mod conn;
mod migrate;
mod outbox;
mod token;
mod tx;

use bb8::{ManageConnection, Pool, PooledConnection};
use tiberius::{Row, ToSql};

pub use classify::{TRANSIENT, TX_ENDED, breaks_connection, classify};
pub use config::{DEFAULT_COMMAND_TIMEOUT, MssqlConfig};
pub use conn::{MssqlClient, MssqlConn, MssqlManager};
pub use migrate::MIGRATIONS;
pub use token::{
    AZURE_SQL_SCOPE, AzureTokenSource, StaticToken, TokenFuture, TokenSource, parse_authentication,
};
pub use tx::MssqlTx;

pub(crate) use config::{is_ado, is_url};

use crate::ports::StoreError;

/// Logs the connection errors bb8 does not hand to a caller (background connects).
#[derive(Debug, Clone, Copy)]
struct LogErrors;

impl bb8::ErrorSink<StoreError> for LogErrors {
    fn sink(&self, error: StoreError) {
        tracing::warn!(%error, "SQL Server connection failed.");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<StoreError>> {
        Box::new(*self)
    }
}

/// A SQL Server or Azure SQL store.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example() -> Result<(), sb_inbox::StoreError> {
/// use sb_inbox::{MssqlStore, Store, StoreTx};
/// let store = MssqlStore::connect(
///     "Server=tcp:myserver.database.windows.net,1433;Database=app;\
///      Authentication=Active Directory Default;Encrypt=true",
///     16,
/// )
/// .await?;
/// store.migrate().await?;
/// let mut tx = store.begin().await?;
/// tx.insert_inbox("inventory", "m-1").await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MssqlStore {
    pool: Pool<MssqlManager>,
}

impl MssqlStore {
    /// Connects a pool of at most `max_size` connections from an ADO.NET connection string or
    /// an `mssql://` URL (see [`MssqlConfig`]).
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](crate::ErrorKind::Schema) for an unparseable string; a classified error when the first
    /// connection fails.
    pub async fn connect(connection: &str, max_size: u32) -> Result<Self, StoreError> {
        Self::connect_with(connection.parse()?, max_size).await
    }

    /// Connects a pool from a parsed [`MssqlConfig`].
    ///
    /// # Errors
    /// A classified error when the first connection fails.
    pub async fn connect_with(config: MssqlConfig, max_size: u32) -> Result<Self, StoreError> {
        let manager = MssqlManager::new(config);
        // The first connection is made here, not by the pool: bb8 reports a failed connect only
        // to its error sink and lets `get` time out 30 s later, which would hide a wrong
        // address or login behind "timed out".
        let first = manager.connect().await?;
        let pool = Pool::builder()
            .max_size(max_size.max(1))
            .error_sink(Box::new(LogErrors))
            .build(manager)
            .await?;
        if pool.add(first).is_err() {
            tracing::debug!("The pool was full already; the first connection was dropped.");
        }
        Ok(MssqlStore { pool })
    }

    async fn connection(&self) -> Result<PooledConnection<'static, MssqlManager>, StoreError> {
        super::pool::checkout(&self.pool).await
    }

    /// Connections the pool holds now (idle and in use).
    pub fn connections(&self) -> u32 {
        self.pool.state().connections
    }

    /// Runs a query outside any inbox transaction (reports, tests), reading all result sets.
    ///
    /// # Errors
    /// The classified [`StoreError`].
    pub async fn query(&self, sql: &str, params: &[&dyn ToSql]) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.connection().await?;
        conn.query(sql, params).await
    }

    /// Runs a statement outside any inbox transaction (administration, tests); returns the rows
    /// affected.
    ///
    /// # Errors
    /// The classified [`StoreError`].
    pub async fn execute(&self, sql: &str, params: &[&dyn ToSql]) -> Result<u64, StoreError> {
        let mut conn = self.connection().await?;
        conn.execute(sql, params).await
    }

    /// Runs a batch without parameters outside any transaction (`CREATE DATABASE` cannot run
    /// inside `sp_executesql`'s transaction-free batch either way; this sends it as is).
    ///
    /// # Errors
    /// The classified [`StoreError`].
    pub async fn batch(&self, sql: &str) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.connection().await?;
        conn.batch(sql).await
    }
}
