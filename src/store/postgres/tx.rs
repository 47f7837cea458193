//! The PostgreSQL transaction ([`PgTx`]): `BEGIN` sent with the first statement, statements
//! through the connection's prepared-statement cache, the first-error rule, savepoints, and a
//! commit that notices an aborted transaction.

use std::future::Future;
use std::pin::Pin;

use bb8::PooledConnection;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use super::{PgManager, PgStore, classify, pipeline};
use crate::ports::{
    ErrorKind, InboxEntry, OutboxMessage, Savepoint, Store, StoreError, StoreTx, Tx, Verdict,
    VersionCheck,
};
use crate::store::tx_state::{TxState, rollback_to_sql, version_verdict};

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
/// is the inbox insert ([`StoreTx::insert_inbox`], which the runtime always runs first); a
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

/// A business key's claim ([`Tx::claim_business_key`], [`PgTx::claim_business_key_then`]).
const CLAIM_BUSINESS_KEY: &str =
    "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ($1, $2, $3)";

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

    /// Claims a business key as [`Tx::claim_business_key`] does and runs `statements` behind
    /// it in the same round trip ([`PgTx::pipeline`]); returns the rows each of `statements`
    /// affected. For a handler whose statements need nothing from the claim but that it
    /// succeeds: a round trip less per message than claiming first (issue 42).
    ///
    /// A key claimed before fails with [`ErrorKind::Duplicate`]`(`[`DuplicateScope::BusinessKey`]`)`
    /// as the claim alone does; PostgreSQL then aborts the transaction at the claim and runs
    /// none of `statements`.
    ///
    /// # Errors
    /// As [`PgTx::pipeline`], the claim being the first statement.
    ///
    /// [`DuplicateScope::BusinessKey`]: crate::DuplicateScope::BusinessKey
    pub async fn claim_business_key_then(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
        statements: &[(&str, &[&(dyn ToSql + Sync)])],
    ) -> Result<Vec<u64>, StoreError> {
        let claim: [&(dyn ToSql + Sync); 3] = [&consumer, &key, &logical_id];
        let mut all: Vec<(&str, &[&(dyn ToSql + Sync)])> = Vec::with_capacity(1 + statements.len());
        all.push((CLAIM_BUSINESS_KEY, &claim));
        all.extend_from_slice(statements);
        let mut counts = self.pipeline(&all).await?;
        counts.remove(0);
        Ok(counts)
    }

    /// The inbox insert; on a transaction's first statement, pipelined with `BEGIN`.
    async fn insert_inbox_row(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> Result<(), StoreError> {
        let params: [&(dyn ToSql + Sync); 2] = [&consumer, &logical_id];
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
    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> Result<(), StoreError> {
        self.execute(CLAIM_BUSINESS_KEY, &[&consumer, &key, &logical_id])
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
        let verdict = version_verdict(changed == 1, async {
            let rows = self
                .query(
                    "SELECT version FROM sb_inbox_aggregate_version WHERE consumer = $1 AND aggregate = $2",
                    &[&consumer, &aggregate],
                )
                .await?;
            rows.first()
                .map(|row| row.try_get(0).map_err(classify))
                .transpose()
        })
        .await;
        // A contradiction fails the transaction as a failed statement does.
        self.state.record(verdict)
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        let columns = self.state.record(crate::store::outbox_columns(message))?;
        self.execute(
            "INSERT INTO sb_outbox (message_id, destination, subject, correlation_id, content_type,
                 application_properties, body, session_id, partition_key, scheduled_enqueue_time,
                 time_to_live_ms, to_address, reply_to)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            &[
                &message.message_id,
                &message.destination,
                &message.subject,
                &message.correlation_id,
                &message.content_type,
                &columns.properties,
                &message.body,
                &message.session_id,
                &message.partition_key,
                &message.scheduled_enqueue_time,
                &columns.time_to_live_ms,
                &message.to,
                &message.reply_to,
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
}

impl StoreTx for PgTx {
    async fn insert_inbox(&mut self, consumer: &str, logical_id: &str) -> Result<(), StoreError> {
        self.insert_inbox_row(consumer, logical_id).await
    }

    async fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> Result<(), StoreError> {
        self.execute(
            crate::store::pg_verdict::INSERT,
            &[
                &consumer,
                &logical_id,
                &verdict.reason,
                &verdict.resubmission,
            ],
        )
        .await
        .map(drop)
    }

    async fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        // A lone read needs no transaction block: one statement sees the same committed rows
        // before `BEGIN` as it would as the block's first. The runtime asks this alone (is a
        // duplicate's row a twin's verdict?): one round trip instead of three.
        let sql = crate::store::pg_verdict::READ;
        let rows = if self.begun {
            self.query(sql, &[&consumer, &logical_id]).await?
        } else {
            self.state.check()?;
            let conn = &mut self.conn;
            self.state
                .run(conn.query_cached(sql, &[&consumer, &logical_id]))
                .await?
        };
        let entry = rows
            .first()
            .map(|row| {
                Ok(crate::store::inbox_entry(
                    row.try_get(0).map_err(classify)?,
                    row.try_get(1).map_err(classify)?,
                ))
            })
            .transpose();
        self.state.record(entry)
    }

    async fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> Result<bool, StoreError> {
        self.execute(
            crate::store::pg_verdict::TAKE_OVER,
            &[&consumer, &logical_id, &resubmission],
        )
        .await
        .map(|deleted| deleted > 0)
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
