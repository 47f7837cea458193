//! A SQL Server connection for the pool ([`MssqlConn`]) and its manager ([`MssqlManager`]):
//! TCP with keepalive, TLS, Azure gateway redirects, Entra ID tokens, the session's `SET`s, and
//! requests bounded by the command timeout.

use std::time::Duration;

use bb8::ManageConnection;
use tiberius::{Client, Row, ToSql};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::{MssqlConfig, breaks_connection, classify};
use crate::ports::{ErrorKind, StoreError};

/// Run on every new session, followed by `SET LOCK_TIMEOUT` ([`MssqlConfig::command_timeout`]).
/// `XACT_ABORT` makes any error roll the transaction back instead of
/// leaving it open with half its statements applied; `us_english` keeps the messages the
/// classifier parses in their documented form; the ANSI options are those filtered indexes
/// (`ix_sb_outbox_pending`) and truncation errors (`ANSI_WARNINGS`) require, whatever the login
/// defaults are.
const SESSION_SETUP: &str = "SET XACT_ABORT ON; SET LANGUAGE us_english; SET ANSI_NULLS ON; \
     SET ANSI_PADDING ON; SET ANSI_WARNINGS ON; SET ARITHABORT ON; SET CONCAT_NULL_YIELDS_NULL ON; \
     SET QUOTED_IDENTIFIER ON; SET NUMERIC_ROUNDABORT OFF;";

/// How long the TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// TCP keepalive: idle time, probe interval, probes.
const KEEPALIVE: (Duration, Duration, u32) = (Duration::from_secs(30), Duration::from_secs(10), 3);

/// How many gateway redirects one connect follows (Azure SQL sends one at most).
const MAX_REDIRECTS: usize = 3;

/// The transport tiberius runs on.
pub type MssqlClient = Client<Compat<TcpStream>>;

/// A pooled connection.
pub struct MssqlConn {
    client: MssqlClient,
    /// A request failed so that the connection cannot be reused: the pool drops it.
    pub(super) broken: bool,
    /// A transaction is open on it: returned like this, the pool drops it.
    pub(super) in_tx: bool,
    /// [`MssqlConfig::command_timeout`]; `None` while migrating.
    pub(super) command_timeout: Option<Duration>,
    /// The session's `SET LOCK_TIMEOUT`, restored after a transaction bounded its lock waits.
    pub(super) lock_timeout_ms: i64,
}

impl std::fmt::Debug for MssqlConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MssqlConn")
            .field("broken", &self.broken)
            .field("in_tx", &self.in_tx)
            .finish_non_exhaustive()
    }
}

impl MssqlConn {
    /// Classifies `error` and marks the connection broken when it cannot be reused.
    fn fail(&mut self, error: tiberius::error::Error) -> StoreError {
        if breaks_connection(&error) {
            self.broken = true;
        }
        let error = classify(error);
        if error.kind() == ErrorKind::Connection {
            self.broken = true;
        }
        error
    }

    /// Waits for `request` at most the command timeout. Past it the response is half read, so
    /// the connection is marked broken (the pool drops it and the server rolls back).
    async fn bounded<T>(
        &mut self,
        request: impl AsyncFnOnce(&mut MssqlClient) -> tiberius::Result<T>,
    ) -> Result<T, StoreError> {
        let limit = self.command_timeout;
        let result = match limit {
            Some(limit) => tokio::time::timeout(limit, request(&mut self.client)).await,
            None => Ok(request(&mut self.client).await),
        };
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.fail(error)),
            Err(_) => {
                self.broken = true;
                Err(StoreError::connection(format!(
                    "statement timed out after {} s (Command Timeout); the connection is dropped",
                    limit.unwrap_or_default().as_secs()
                )))
            }
        }
    }

    /// Runs a parameterised statement (`@P1`, `@P2`, …); returns the rows affected.
    pub(super) async fn execute(
        &mut self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<u64, StoreError> {
        self.bounded(async |client| Ok(client.execute(sql, params).await?.total()))
            .await
    }

    /// Runs a parameterised query and reads every result set to the end.
    pub(super) async fn query(
        &mut self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<Row>, StoreError> {
        self.bounded(async |client| {
            let sets = client.query(sql, params).await?.into_results().await?;
            Ok(sets.into_iter().flatten().collect())
        })
        .await
    }

    /// Runs a batch without parameters and reads it to the end.
    pub(super) async fn batch(&mut self, sql: &str) -> Result<Vec<Row>, StoreError> {
        self.bounded(async |client| {
            let sets = client.simple_query(sql).await?.into_results().await?;
            Ok(sets.into_iter().flatten().collect())
        })
        .await
    }
}

/// Connects tiberius clients for the pool.
#[derive(Debug, Clone)]
pub struct MssqlManager {
    config: MssqlConfig,
}

impl MssqlManager {
    /// A manager for `config`.
    pub fn new(config: MssqlConfig) -> Self {
        MssqlManager { config }
    }

    async fn tcp(addr: &str) -> Result<TcpStream, StoreError> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| StoreError::connection(format!("timed out connecting to {addr}")))?
            .map_err(|error| classify(error.into()))?;
        tcp.set_nodelay(true)
            .map_err(|error| classify(error.into()))?;
        // A peer that vanished (failover, a dropped NAT entry) is noticed within a minute
        // instead of never: tiberius itself has no read timeout.
        let (idle, interval, probes) = KEEPALIVE;
        socket2::SockRef::from(&tcp)
            .set_tcp_keepalive(
                &socket2::TcpKeepalive::new()
                    .with_time(idle)
                    .with_interval(interval)
                    .with_retries(probes),
            )
            .map_err(|error| classify(error.into()))?;
        Ok(tcp)
    }
}

impl ManageConnection for MssqlManager {
    type Connection = MssqlConn;
    type Error = StoreError;

    async fn connect(&self) -> Result<MssqlConn, StoreError> {
        let mut config = self.config.tiberius.clone();
        if let Some(source) = &self.config.token {
            // A token per new connection: the credential refreshes it before it expires.
            let token = source.token().await?;
            config.authentication(tiberius::AuthMethod::aad_token(token));
        }
        let mut redirects = 0;
        let client = loop {
            let tcp = Self::tcp(&config.get_addr()).await?;
            match Client::connect(config.clone(), tcp.compat_write()).await {
                Ok(client) => break client,
                // The Azure SQL gateway hands the session to the node that hosts the database
                // (redirect connection policy): log in again there.
                Err(tiberius::error::Error::Routing { host, port })
                    if redirects < MAX_REDIRECTS =>
                {
                    tracing::debug!(%host, port, "Gateway redirected the SQL Server connection.");
                    config.host(&host);
                    config.port(port);
                    redirects += 1;
                }
                Err(error) => return Err(classify(error)),
            }
        };
        let mut conn = MssqlConn {
            client,
            broken: false,
            in_tx: false,
            command_timeout: self.config.command_timeout,
            lock_timeout_ms: self.config.lock_timeout_ms(),
        };
        let lock_timeout = conn.lock_timeout_ms;
        let execute_as = self.config.execute_as_statement();
        conn.batch(&format!(
            "{SESSION_SETUP} SET LOCK_TIMEOUT {lock_timeout};{execute_as}"
        ))
        .await?;
        Ok(conn)
    }

    /// No round trip: tiberius has no closed state to read, so a connection counts as valid
    /// until a request on it fails with a connection error or times out (then it is marked
    /// broken and evicted). A connection never goes back to the pool inside a transaction: it
    /// is marked while one is open, and the commit checks `@@TRANCOUNT` in its own batch.
    async fn is_valid(&self, conn: &mut MssqlConn) -> Result<(), StoreError> {
        if conn.broken {
            return Err(StoreError::connection(
                "the pooled SQL Server connection is broken",
            ));
        }
        Ok(())
    }

    fn has_broken(&self, conn: &mut MssqlConn) -> bool {
        conn.broken || conn.in_tx
    }
}
