//! PostgreSQL store on `tokio-postgres`, pooled by `bb8` with our own connection manager.
//!
//! The manager evicts a connection that broke or that was returned inside a transaction (a
//! handler cancelled mid-statement), so the pool never hands out a connection in an unknown
//! state. Statements are prepared once per connection. Connections are plain TCP, a Unix
//! socket, or TLS with verification (`sslmode`, `sslrootcert`: see `tls`).

mod bounds;
mod classify;
mod outbox;
mod tls;

use std::collections::HashMap;

use bb8::{ManageConnection, Pool, PooledConnection};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

pub use bounds::{LOCK_TIMEOUT, STATEMENT_TIMEOUT};
pub use classify::classify;

use super::Migration;
use super::tx_state::{TxState, rollback_to_sql};
use crate::ports::{ErrorKind, OutboxMessage, Savepoint, Store, StoreError, Tx, VersionCheck};

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
    statements: HashMap<&'static str, Statement>,
    in_tx: bool,
}

impl PgConn {
    async fn prepared(&mut self, sql: &'static str) -> Result<Statement, StoreError> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await.map_err(classify)?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
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
            statements: HashMap::new(),
            in_tx: false,
        })
    }

    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), StoreError> {
        conn.client
            .simple_query("")
            .await
            .map(drop)
            .map_err(classify)
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.in_tx || conn.client.is_closed()
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
    /// [`ErrorKind::Schema`] for an unparseable URL or `sslrootcert`; the classified error of a
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
            bb8::RunError::TimedOut => StoreError::new(
                ErrorKind::Unavailable,
                None,
                None,
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
        let conn = self.connection().await?;
        conn.client.query(sql, params).await.map_err(classify)
    }
}

impl Store for PgStore {
    type Tx = PgTx;

    async fn begin(&self) -> Result<PgTx, StoreError> {
        let mut conn = self.connection().await?;
        // Marked first: if BEGIN is cancelled half-way the pool discards the connection.
        conn.in_tx = true;
        conn.client.batch_execute("BEGIN").await.map_err(classify)?;
        Ok(PgTx {
            conn,
            state: TxState::default(),
        })
    }
}

/// An open PostgreSQL transaction. Dropping it without commit or rollback discards the
/// connection, which ends the transaction on the server.
///
/// After a failed statement PostgreSQL aborts the transaction; this one then refuses every
/// statement and the commit ([`Tx`]'s first-error rule). Use [`Tx::savepoint`] to go on after
/// an expected error.
#[derive(Debug)]
pub struct PgTx {
    conn: PooledConnection<'static, PgManager>,
    state: TxState,
}

/// Commits, after a statement that fails in an aborted transaction: PostgreSQL answers a
/// `COMMIT` there with `ROLLBACK` and no error, and `tokio-postgres` does not show the command
/// tag. In an aborted transaction the probe fails (25P02) and the rest of the batch is skipped;
/// otherwise it costs nothing, sent in the same message.
const COMMIT: &str = "SELECT 1; COMMIT";

impl PgTx {
    /// The client, for statements this type has no method for. Statements run through it
    /// bypass the first-error rule: prefer [`PgTx::execute`] and [`PgTx::query`]. The commit
    /// still fails when such a statement aborted the transaction.
    pub fn client(&self) -> &Client {
        &self.conn.client
    }

    /// Executes one statement, classifying its error; refused after an earlier failure.
    ///
    /// # Errors
    /// The classified [`StoreError`]; [`StoreError::refused`] after an earlier failure.
    pub async fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = &self.conn.client;
        self.state
            .run(async { client.execute(sql, params).await.map_err(classify) })
            .await
    }

    /// Runs one query, classifying its error; refused after an earlier failure.
    ///
    /// # Errors
    /// As [`PgTx::execute`].
    pub async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = &self.conn.client;
        self.state
            .run(async { client.query(sql, params).await.map_err(classify) })
            .await
    }

    async fn run(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let conn = &mut self.conn;
        self.state
            .run(async {
                let statement = conn.prepared(sql).await?;
                conn.client
                    .execute(&statement, params)
                    .await
                    .map_err(classify)
            })
            .await
    }

    /// Ends the transaction with `sql`; on failure rolls back, so the connection stays
    /// reusable (outside a transaction `ROLLBACK` only warns).
    async fn finish(mut self, sql: &str) -> Result<(), StoreError> {
        let result = self.conn.client.batch_execute(sql).await.map_err(classify);
        let ended = match &result {
            Ok(()) => true,
            Err(_) => self.conn.client.batch_execute("ROLLBACK").await.is_ok(),
        };
        if ended {
            self.conn.in_tx = false;
        }
        result
    }
}

impl Tx for PgTx {
    async fn insert_inbox(&mut self, consumer: &str, message_id: &str) -> Result<(), StoreError> {
        self.run(
            "INSERT INTO sb_inbox (consumer, message_id) VALUES ($1, $2)",
            &[&consumer, &message_id],
        )
        .await
        .map(drop)
    }

    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        message_id: &str,
    ) -> Result<(), StoreError> {
        self.run(
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
            .run(
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
        let conn = &mut self.conn;
        let row = self
            .state
            .run(async {
                let statement = conn
                    .prepared("SELECT version FROM sb_inbox_aggregate_version WHERE consumer = $1 AND aggregate = $2")
                    .await?;
                conn.client
                    .query_one(&statement, &[&consumer, &aggregate])
                    .await
                    .map_err(classify)
            })
            .await?;
        Ok(VersionCheck::Stale {
            current: row.get(0),
        })
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        let properties = super::properties_json(message);
        self.run(
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
        let sql = self.state.savepoint_sql(&savepoint);
        let client = &self.conn.client;
        self.state
            .run(async { client.batch_execute(&sql).await.map_err(classify) })
            .await?;
        self.state.marked(&savepoint);
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.rollback_target(&savepoint)?;
        let result = self
            .conn
            .client
            .batch_execute(&rollback_to_sql(&savepoint))
            .await
            .map_err(classify);
        self.state.rolled_back(&savepoint, result)
    }

    async fn release(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.release(&savepoint, true)
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
