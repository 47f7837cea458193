//! PostgreSQL store on `tokio-postgres`, pooled by `bb8` with our own connection manager.
//!
//! # Layout
//! - [`PgStore`] / [`PgTx`]: the [`Store`] port.
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
mod outbox;
mod pipeline;
mod statements;
mod tls;

use std::future::Future;
use std::pin::Pin;

use bb8::{ManageConnection, Pool, PooledConnection};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

pub use bounds::{LOCK_TIMEOUT, STATEMENT_TIMEOUT};
pub use classify::classify;

use super::Migration;
use super::tx_state::{TxState, rollback_to_sql};
use crate::ports::{ErrorKind, OutboxMessage, Savepoint, Store, StoreError, Tx, VersionCheck};
use statements::StatementCache;

/// The PostgreSQL core migrations, in order: inbox, business keys, aggregate versions,
/// outbox. Version 2 is the reference consumer's (`crate::inventory`), kept out of the core;
/// versions below 1000 are reserved for sb-inbox, a user's own start at 1000.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_inbox.sql",
        sql: include_str!("../../../sql/postgres/0001_inbox.sql"),
    },
    Migration {
        version: 3,
        name: "0003_outbox_relay.sql",
        sql: include_str!("../../../sql/postgres/0003_outbox_relay.sql"),
    },
];

/// Serialises concurrent `migrate` calls across processes.
const MIGRATION_LOCK: i64 = 0x5b1_0b0c;

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
    /// peer that vanished without closing is caught by TCP keepalive ([`bounds`]). bb8 drops a
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
/// use sb_inbox::{PgStore, Store, Tx};
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
        self.pool.get_owned().await.map_err(|error| match error {
            bb8::RunError::User(error) => error,
            bb8::RunError::TimedOut => StoreError::of_kind(
                ErrorKind::Unavailable,
                "timed out waiting for a pooled connection",
            ),
        })
    }

    /// Applies the core migrations not applied yet; returns how many ran.
    ///
    /// # Errors
    /// As [`Self::apply_migrations`].
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        self.apply_migrations(MIGRATIONS).await
    }

    /// Applies the migrations of `set` not applied yet (the hook for a consumer's own schema:
    /// the same bookkeeping table, one version space), under an advisory lock; returns how many ran.
    ///
    /// # Errors
    /// A [`StoreError`] from the first failing script (its transaction rolls back).
    pub async fn apply_migrations(&self, set: &[Migration]) -> Result<usize, StoreError> {
        let mut conn = self.connection().await?;
        let client = &mut conn.client;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS sb_inbox_schema_migrations (
                     version bigint NOT NULL CONSTRAINT pk_sb_inbox_schema_migrations PRIMARY KEY,
                     name text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now())",
            )
            .await
            .map_err(classify)?;
        let mut applied = 0;
        for migration in set {
            let tx = client.transaction().await.map_err(classify)?;
            // A migration may build an index on a large table or wait for another `migrate`.
            tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
                .await
                .map_err(classify)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(classify)?;
            let done = tx
                .query_opt(
                    "SELECT 1 FROM sb_inbox_schema_migrations WHERE version = $1",
                    &[&migration.version],
                )
                .await
                .map_err(classify)?;
            if done.is_none() {
                tx.batch_execute(migration.sql).await.map_err(classify)?;
                tx.execute(
                    "INSERT INTO sb_inbox_schema_migrations (version, name) VALUES ($1, $2)",
                    &[&migration.version, &migration.name],
                )
                .await
                .map_err(classify)?;
                applied += 1;
                tracing::info!(migration = migration.name, "Migration applied.");
            }
            tx.commit().await.map_err(classify)?;
        }
        Ok(applied)
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

#[cfg(feature = "test-util")]
impl PgStore {
    /// Test hook: runs the transaction's guarded inbox insert with no transaction block open,
    /// as it would run if its pipelined `BEGIN` had failed on a connection that stayed open;
    /// returns the rows it wrote (none, or that `BEGIN` could let an insert commit alone).
    ///
    /// # Errors
    /// The classified [`StoreError`].
    pub async fn inbox_insert_without_begin(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> Result<u64, StoreError> {
        let mut conn = self.connection().await?;
        conn.execute_cached(INBOX_INSERT, &[&consumer, &message_id])
            .await
    }
}

impl Store for PgStore {
    type Tx = PgTx;

    /// Checks a connection out; sends nothing. `BEGIN` goes with the first statement.
    async fn begin(&self) -> Result<PgTx, StoreError> {
        let mut conn = self.connection().await?;
        // Marked first: if the transaction is dropped half-way the pool discards the
        // connection.
        conn.in_tx = true;
        Ok(PgTx {
            conn,
            state: TxState::default(),
            begun: false,
        })
    }
}

/// An open PostgreSQL transaction. Dropping it without commit or rollback discards the
/// connection, which ends the transaction on the server.
///
/// After a failed statement PostgreSQL aborts the transaction; this one then refuses every
/// statement and the commit ([`Tx`]'s first-error rule). Use [`Tx::savepoint`] to go on after
/// an expected error.
///
/// `BEGIN` is sent with the transaction's first statement, in the same round trip when that
/// is the inbox insert ([`Tx::insert_inbox`], which the runtime always runs first); a
/// transaction that runs nothing sends nothing, its commit included.
#[derive(Debug)]
pub struct PgTx {
    conn: PooledConnection<'static, PgManager>,
    state: TxState,
    /// `BEGIN` was sent.
    begun: bool,
}

/// Commits, after a statement that fails in an aborted transaction: PostgreSQL answers a
/// `COMMIT` there with `ROLLBACK` and no error, and `tokio-postgres` does not show the command
/// tag. In an aborted transaction the probe fails (25P02) and the rest of the batch is skipped;
/// otherwise it costs nothing, sent in the same message.
const COMMIT: &str = "SELECT 1; COMMIT";

/// `BEGIN`, marking the transaction block. It is pipelined with the inbox insert as two
/// requests, and if `BEGIN` failed on a connection that stays open (a cancelled query) the
/// insert would run and commit on its own; [`INBOX_INSERT`] therefore writes its row only where
/// the `SET LOCAL` mark is set, which is inside this block and nowhere else (after a failed
/// `BEGIN` the rest of the message is skipped; the mark ends with the transaction).
const BEGIN: &str = "BEGIN; SET LOCAL sb_inbox.tx = 'on'";

/// The inbox insert, guarded by [`BEGIN`]'s mark: it inserts no row outside the
/// transaction block that mark belongs to.
const INBOX_INSERT: &str = "INSERT INTO sb_inbox (consumer, message_id)
     SELECT $1::varchar, $2::varchar WHERE current_setting('sb_inbox.tx', true) = 'on'";

/// A pipelined request's future: the statements of one round trip differ in type.
type Request<'a> = Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a>>;

impl PgTx {
    /// The client, for what this type has no method for (a `COPY`, a row stream). Statements
    /// run through it bypass the first-error rule and the statement cache: prefer
    /// [`PgTx::execute`], [`PgTx::query`] and [`PgTx::pipeline`]. The commit still fails when
    /// such a statement aborted the transaction. Sends `BEGIN` first if no statement has yet.
    ///
    /// # Errors
    /// The classified error of `BEGIN`.
    pub async fn client(&mut self) -> Result<&Client, StoreError> {
        if self.state.check().is_ok() {
            self.ensure_begun().await?;
        }
        Ok(&self.conn.client)
    }

    /// Sends `BEGIN` unless it was sent.
    async fn ensure_begun(&mut self) -> Result<(), StoreError> {
        if self.begun {
            return Ok(());
        }
        self.begun = true;
        let conn = &mut self.conn;
        self.state.run(conn.batch(BEGIN)).await
    }

    /// Executes one statement, prepared once per connection and cached, classifying its
    /// error; refused after an earlier failure.
    ///
    /// # Errors
    /// The classified [`StoreError`]; [`StoreError::refused`] after an earlier failure.
    pub async fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        self.state.check()?;
        self.ensure_begun().await?;
        let conn = &mut self.conn;
        self.state.run(conn.execute_cached(sql, params)).await
    }

    /// Runs one query, prepared once per connection and cached, classifying its error;
    /// refused after an earlier failure.
    ///
    /// # Errors
    /// As [`PgTx::execute`].
    pub async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.state.check()?;
        self.ensure_begun().await?;
        let conn = &mut self.conn;
        self.state.run(conn.query_cached(sql, params)).await
    }

    /// Executes several statements in one round trip (prepared and cached like
    /// [`PgTx::execute`]); returns the rows each affected. For statements that need nothing
    /// from one another, such as the lines of an order and their stock upserts.
    ///
    /// They run in the order given. When one fails PostgreSQL aborts the transaction and runs
    /// none of the rest (each answers 25P02): the error returned is the first failure, kept as
    /// the transaction's first error like any other. One that fails before it is sent (a
    /// parameter that does not serialise) leaves the later ones to run inside the aborted-to-be
    /// transaction, whose commit is refused.
    ///
    /// # Errors
    /// The first statement's error in order, classified; [`StoreError::refused`] after an
    /// earlier failure.
    ///
    /// # Examples
    /// ```no_run
    /// # #[allow(dead_code)]
    /// # async fn example(tx: &mut sb_inbox::PgTx) -> Result<(), sb_inbox::StoreError> {
    /// let rows = tx
    ///     .pipeline(&[
    ///         ("UPDATE stock SET n = n - $1 WHERE sku = $2", &[&1i32, &"A"]),
    ///         ("UPDATE stock SET n = n - $1 WHERE sku = $2", &[&2i32, &"B"]),
    ///     ])
    ///     .await?;
    /// assert_eq!(rows.len(), 2);
    /// # Ok(()) }
    /// ```
    pub async fn pipeline(
        &mut self,
        statements: &[(&str, &[&(dyn ToSql + Sync)])],
    ) -> Result<Vec<u64>, StoreError> {
        self.state.check()?;
        self.ensure_begun().await?;
        let conn = &mut self.conn;
        self.state
            .run(async {
                let sqls: Vec<&str> = statements.iter().map(|(sql, _)| *sql).collect();
                let prepared = conn.prepare_all(&sqls).await?;
                let client = &conn.client;
                let results = pipeline::in_order(
                    prepared
                        .iter()
                        .zip(statements)
                        .map(|(statement, (_, params))| client.execute(statement, params)),
                )
                .await;
                let mut counts = Vec::with_capacity(results.len());
                for (sql, result) in sqls.iter().zip(results) {
                    counts.push(conn.settle(sql, result)?);
                }
                Ok(counts)
            })
            .await
    }

    /// The inbox insert; on a transaction's first statement, pipelined with `BEGIN`.
    async fn insert_inbox_row(
        &mut self,
        consumer: &str,
        message_id: &str,
    ) -> Result<(), StoreError> {
        let params: [&(dyn ToSql + Sync); 2] = [&consumer, &message_id];
        let inserted = if self.begun {
            self.execute(INBOX_INSERT, &params).await?
        } else {
            self.state.check()?;
            self.begun = true;
            let conn = &mut self.conn;
            self.state
                .run(async {
                    let statement = conn.prepared(INBOX_INSERT).await?;
                    let client = &conn.client;
                    let begin: Request<'_> =
                        Box::pin(async { client.batch_execute(BEGIN).await.map(|()| 0) });
                    let insert: Request<'_> = Box::pin(client.execute(&statement, &params));
                    let mut results = pipeline::in_order([begin, insert]).await.into_iter();
                    let begun = results.next().unwrap_or(Ok(0));
                    conn.settle("BEGIN", begun)?;
                    let inserted = results.next().unwrap_or(Ok(0));
                    conn.settle(INBOX_INSERT, inserted)
                })
                .await?
        };
        if inserted != 1 {
            // Only when the transaction block was not there: never on a healthy connection.
            return self.state.record(Err(StoreError::of_kind(
                ErrorKind::Unknown,
                "the inbox row was not written: no transaction block was open",
            )));
        }
        Ok(())
    }

    /// Ends the transaction with `sql`; on failure rolls back, so the connection stays
    /// reusable (outside a transaction `ROLLBACK` only warns). Nothing to send when `BEGIN`
    /// never was.
    async fn finish(mut self, sql: &str) -> Result<(), StoreError> {
        if !self.begun {
            self.conn.in_tx = false;
            return Ok(());
        }
        let result = self.conn.batch(sql).await;
        let ended = match &result {
            Ok(()) => true,
            Err(_) => self.conn.batch("ROLLBACK").await.is_ok(),
        };
        if ended {
            self.conn.in_tx = false;
        }
        result
    }
}

impl Tx for PgTx {
    async fn insert_inbox(&mut self, consumer: &str, message_id: &str) -> Result<(), StoreError> {
        self.insert_inbox_row(consumer, message_id).await
    }

    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        message_id: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ($1, $2, $3)",
            &[&consumer, &key, &message_id],
        )
        .await
        .map(drop)
    }

    async fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> Result<VersionCheck, StoreError> {
        let changed = self
            .execute(
                "INSERT INTO sb_inbox_aggregate_version (consumer, aggregate, version) VALUES ($1, $2, $3)
                 ON CONFLICT (consumer, aggregate) DO UPDATE
                    SET version = excluded.version, updated_at = now()
                  WHERE sb_inbox_aggregate_version.version < excluded.version",
                &[&consumer, &aggregate, &version],
            )
            .await?;
        if changed == 1 {
            return Ok(VersionCheck::Advanced);
        }
        let rows = self
            .query(
                "SELECT version FROM sb_inbox_aggregate_version WHERE consumer = $1 AND aggregate = $2",
                &[&consumer, &aggregate],
            )
            .await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::of_kind(
                ErrorKind::Unknown,
                "aggregate version row missing after upsert",
            )
        });
        let current = self
            .state
            .record(row.and_then(|row| row.try_get(0).map_err(classify)))?;
        Ok(VersionCheck::Stale { current })
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        let properties = super::properties_json(message);
        self.execute(
            "INSERT INTO sb_outbox (message_id, destination, subject, correlation_id, content_type, application_properties, body)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &message.message_id,
                &message.destination,
                &message.subject,
                &message.correlation_id,
                &message.content_type,
                &properties,
                &message.body,
            ],
        )
        .await
        .map(drop)
    }

    async fn savepoint(&mut self) -> Result<Savepoint, StoreError> {
        let savepoint = self.state.next_savepoint()?;
        let mut sql = self.state.savepoint_sql(&savepoint);
        if !self.begun {
            // One simple-protocol message: if BEGIN fails the rest of it is skipped.
            sql.insert_str(0, &format!("{BEGIN}; "));
            self.begun = true;
        }
        let conn = &mut self.conn;
        self.state.run(conn.batch(&sql)).await?;
        self.state.marked(&savepoint);
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.rollback_target(&savepoint)?;
        let result = self.conn.batch(&rollback_to_sql(&savepoint)).await;
        self.state.rolled_back(&savepoint, result)
    }

    async fn release(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.release(&savepoint, true)
    }

    async fn bound_lock_waits(&mut self, limit: std::time::Duration) -> Result<(), StoreError> {
        // `set_config(…, true)` is `SET LOCAL` with a parameter: it ends with the transaction,
        // so the pooled connection goes back with the server's default.
        let limit = format!("{}ms", limit.as_millis().max(1));
        self.execute("SELECT set_config('lock_timeout', $1, true)", &[&limit])
            .await
            .map(drop)
    }

    async fn commit(self) -> Result<(), StoreError> {
        if let Err(refused) = self.state.check() {
            if let Err(error) = self.finish("ROLLBACK").await {
                tracing::warn!(%error, "Rollback failed; the connection is discarded.");
            }
            return Err(refused);
        }
        self.finish(COMMIT).await
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.finish("ROLLBACK").await
    }
}
