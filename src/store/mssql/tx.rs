//! The SQL Server transaction ([`MssqlTx`]): begun on checkout (trying the next pooled
//! connection when one died idle), every statement guarded by `@@TRANCOUNT`, the first-error
//! rule, savepoints (which turn `XACT_ABORT` off) and a commit that checks nothing stays open.

use bb8::PooledConnection;
use tiberius::{Row, ToSql};

use super::{MssqlManager, MssqlStore, classify};
use crate::ports::{
    ErrorKind, InboxEntry, OutboxMessage, Savepoint, Store, StoreError, StoreTx, Tx, Verdict,
    VersionCheck,
};
use crate::store::tx_state::{TxState, version_verdict};

impl Store for MssqlStore {
    type Tx = MssqlTx;

    /// Checks a connection out and begins. With no health query at checkout, a connection
    /// that died idle in the pool (a failover, a dropped NAT entry) is found out here; `BEGIN`
    /// has no effect, so the next connection is tried, as many times as there were idle ones
    /// and once more (a new connection): after a failover they are all gone.
    async fn begin(&self) -> Result<MssqlTx, StoreError> {
        let mut attempts = self.pool.state().idle_connections + 1;
        loop {
            let mut conn = self.connection().await?;
            // Marked first: if BEGIN is cancelled half-way the pool discards the connection.
            conn.in_tx = true;
            match conn.batch("BEGIN TRANSACTION").await {
                Ok(_) => {
                    return Ok(MssqlTx {
                        conn,
                        state: TxState::default(),
                        xact_abort_off: false,
                        lock_waits_bounded: false,
                    });
                }
                Err(error) if error.kind() == ErrorKind::Connection && attempts > 1 => {
                    attempts -= 1;
                    tracing::debug!(%error, "A pooled SQL Server connection is gone; trying the next.");
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// An open SQL Server transaction. Dropping it without commit or rollback discards the
/// connection, which ends the transaction on the server.
///
/// With `XACT_ABORT ON` an error rolls the whole transaction back on the server, and a later
/// statement would run outside any transaction and autocommit. This type refuses every
/// statement and the commit after the first error ([`Tx`]'s rule), and each statement checks
/// `@@TRANCOUNT` on the server first ([`TX_ENDED`](super::TX_ENDED)). A savepoint turns
/// `XACT_ABORT` off for the rest of the transaction, since with it on no error can be rolled
/// back to a savepoint.
#[derive(Debug)]
pub struct MssqlTx {
    conn: PooledConnection<'static, MssqlManager>,
    state: TxState,
    /// `SET XACT_ABORT OFF` was sent (by the first savepoint); the end restores it.
    xact_abort_off: bool,
    /// [`StoreTx::bound_lock_waits`](crate::StoreTx::bound_lock_waits) changed the session's `LOCK_TIMEOUT`; the end restores it.
    lock_waits_bounded: bool,
}

/// Put before every statement of an [`MssqlTx`].
const GUARD: &str = "IF @@TRANCOUNT = 0 THROW 59317, N'sb-inbox: the transaction has ended on the server; statement refused', 1;\n";

impl MssqlTx {
    /// Executes one parameterised statement (`@P1`, `@P2`, …), classifying its error; returns
    /// the rows affected. Refused after an earlier failure, and on the server when the
    /// transaction has ended there.
    ///
    /// # Errors
    /// The classified [`StoreError`]; [`StoreError::refused`] after an earlier failure. An
    /// I/O, TLS or timeout error also marks the connection broken so the pool evicts it.
    pub async fn execute(&mut self, sql: &str, params: &[&dyn ToSql]) -> Result<u64, StoreError> {
        let guarded = format!("{GUARD}{sql}");
        let conn = &mut self.conn;
        self.state
            .run(async { conn.execute(&guarded, params).await })
            .await
    }

    /// Runs one parameterised query, reading every result set to the end.
    ///
    /// # Errors
    /// As [`MssqlTx::execute`].
    pub async fn query(
        &mut self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<Row>, StoreError> {
        let guarded = format!("{GUARD}{sql}");
        let conn = &mut self.conn;
        self.state
            .run(async { conn.query(&guarded, params).await })
            .await
    }

    /// Ends the transaction with `sql`, restoring `XACT_ABORT`; on failure rolls back, so the
    /// connection stays reusable. Returns the batch's rows.
    async fn finish(&mut self, sql: &str) -> Result<Vec<Row>, StoreError> {
        let mut restore = String::new();
        if self.xact_abort_off {
            restore.push_str("; SET XACT_ABORT ON");
        }
        if self.lock_waits_bounded {
            // Our own integer, not input: `SET LOCK_TIMEOUT` takes no parameter.
            restore.push_str(&format!("; SET LOCK_TIMEOUT {}", self.conn.lock_timeout_ms));
        }
        let result = self.conn.batch(&format!("{sql}{restore}")).await;
        let ended = match &result {
            Ok(_) => true,
            Err(_) => self
                .conn
                .batch(&format!("{ROLLBACK}{restore}"))
                .await
                .is_ok(),
        };
        if ended {
            self.conn.in_tx = false;
        }
        result
    }
}

/// Commits and reads `@@TRANCOUNT` in the same batch, which must be 0: a `BEGIN TRANSACTION`
/// run by a handler nests, so `COMMIT` only decremented the count and nothing is durable yet.
/// (This was the health query each checkout ran before; here it costs no round trip.)
const COMMIT: &str = "COMMIT TRANSACTION; SELECT @@TRANCOUNT";

/// Tolerant of a transaction that is already gone: `XACT_ABORT` rolls back on any error.
const ROLLBACK: &str = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION";

impl Tx for MssqlTx {
    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES (@P1, @P2, @P3)",
            &[&consumer, &key, &logical_id],
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
        // UPDLOCK + HOLDLOCK (serializable) on the key range: two transactions for a new
        // aggregate cannot both take the insert branch. `aggregate_bytes` because `=` ignores
        // trailing spaces (sql/mssql/0004_exact_keys.sql).
        let rows = self
            .query(
                "DECLARE @written int;
                 UPDATE sb_inbox_aggregate_version WITH (UPDLOCK, HOLDLOCK)
                    SET version = @P3, updated_at = SYSUTCDATETIME()
                  WHERE consumer = @P1 AND aggregate = @P2 AND aggregate_bytes = DATALENGTH(@P2) AND version < @P3;
                 SET @written = @@ROWCOUNT;
                 IF @written = 0
                    AND NOT EXISTS (SELECT 1 FROM sb_inbox_aggregate_version WITH (UPDLOCK, HOLDLOCK)
                                     WHERE consumer = @P1 AND aggregate = @P2 AND aggregate_bytes = DATALENGTH(@P2))
                 BEGIN
                     INSERT INTO sb_inbox_aggregate_version (consumer, aggregate, version)
                     VALUES (@P1, @P2, @P3);
                     SET @written = @@ROWCOUNT;
                 END;
                 SELECT @written, version FROM sb_inbox_aggregate_version
                  WHERE consumer = @P1 AND aggregate = @P2 AND aggregate_bytes = DATALENGTH(@P2);",
                &[&consumer, &aggregate, &version],
            )
            .await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::of_kind(
                ErrorKind::Unknown,
                "aggregate version row missing after upsert",
            )
        })?;
        let written = row.try_get::<i32, _>(0).map_err(classify)?.unwrap_or(0);
        let current = row
            .try_get::<i64, _>(1)
            .map_err(classify)?
            .unwrap_or(version);
        version_verdict(written > 0, std::future::ready(Ok(Some(current)))).await
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        let columns = self.state.record(crate::store::outbox_columns(message))?;
        let scheduled = message
            .scheduled_enqueue_time
            .map(crate::store::unix_millis);
        // The scheduled time travels as Unix milliseconds, turned into datetime2(3) in SQL as
        // the relay's times are (src/store/mssql/outbox.rs).
        self.execute(
            "INSERT INTO sb_outbox (message_id, destination, subject, correlation_id, content_type,
                 application_properties, body, session_id, partition_key, scheduled_enqueue_time,
                 time_to_live_ms, to_address, reply_to)
             VALUES (@P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9,
                     DATEADD(millisecond, CAST(@P10 % 86400000 AS int),
                         DATEADD(day, CAST(@P10 / 86400000 AS int), CAST('19700101' AS datetime2(3)))),
                     @P11, @P12, @P13)",
            &[
                &message.message_id.as_str(),
                &message.destination.as_str(),
                &message.subject,
                &message.correlation_id,
                &message.content_type,
                &columns.properties.as_str(),
                &message.body.as_slice(),
                &message.session_id,
                &message.partition_key,
                &scheduled,
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
        let save = format!("SAVE TRANSACTION {}", savepoint.name());
        let sql = if self.xact_abort_off {
            save
        } else {
            format!("SET XACT_ABORT OFF; {save}")
        };
        self.xact_abort_off = true;
        let conn = &mut self.conn;
        self.state
            .run(async { conn.batch(&sql).await.map(drop) })
            .await?;
        self.state.marked(&savepoint);
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.rollback_target(&savepoint)?;
        // Undoes the work, not every lock: "A ROLLBACK TRANSACTION statement specifying a
        // savepoint_name releases any locks that are acquired beyond the savepoint, with the
        // exception of escalations and conversions" (learn.microsoft.com, SAVE TRANSACTION
        // (Transact-SQL)). A lock escalated to the table, or a row lock converted (an update
        // lock made exclusive), stays until the transaction ends: a batched delivery that gave
        // way can still block the other transaction until this one commits.
        // Fails (3903, 3931) when the error ended or doomed the whole transaction.
        let sql = format!("ROLLBACK TRANSACTION {}", savepoint.name());
        let result = self.conn.batch(&sql).await.map(drop);
        self.state.rolled_back(&savepoint, result)
    }

    async fn release(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        // SQL Server has no RELEASE: a savepoint just stays until the transaction ends.
        self.state.release(&savepoint, false)
    }
}

impl StoreTx for MssqlTx {
    async fn insert_inbox(&mut self, consumer: &str, logical_id: &str) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sb_inbox (consumer, message_id) VALUES (@P1, @P2)",
            &[&consumer, &logical_id],
        )
        .await
        .map(drop)
    }

    async fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sb_inbox (consumer, message_id, verdict, verdict_resubmission) VALUES (@P1, @P2, @P3, @P4)",
            &[&consumer, &logical_id, &verdict.reason.as_str(), &verdict.resubmission],
        )
        .await
        .map(drop)
    }

    async fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        // `message_id_bytes` because `=` ignores trailing spaces (sql/mssql/0004_exact_keys.sql).
        let rows = self
            .query(
                "SELECT verdict, verdict_resubmission FROM sb_inbox
                  WHERE consumer = @P1 AND message_id = @P2 AND message_id_bytes = DATALENGTH(@P2)",
                &[&consumer, &logical_id],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let verdict = row
            .try_get::<&str, _>(0)
            .map_err(classify)?
            .map(str::to_owned);
        let resubmission = row.try_get::<i64, _>(1).map_err(classify)?;
        Ok(Some(crate::store::inbox_entry(verdict, resubmission)))
    }

    async fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> Result<bool, StoreError> {
        self.execute(
            "DELETE FROM sb_inbox
              WHERE consumer = @P1 AND message_id = @P2 AND message_id_bytes = DATALENGTH(@P2)
                AND verdict IS NOT NULL AND COALESCE(verdict_resubmission, 0) < @P3",
            &[&consumer, &logical_id, &resubmission],
        )
        .await
        .map(|deleted| deleted > 0)
    }

    async fn bound_lock_waits(&mut self, limit: std::time::Duration) -> Result<(), StoreError> {
        // A plain SQL batch (tiberius `simple_query`), never `execute`/`query`: those are RPC
        // calls of `sp_executesql`, and "if a SET statement is specified in a dynamic SQL string
        // that is run by using either sp_executesql or EXECUTE, the value of the SET option is
        // restored after control is returned from the batch" (learn.microsoft.com, SET
        // Statements (Transact-SQL)): the bound would end with its own statement. It lasts for
        // the session, not the transaction, and takes no parameter (the number is ours): the
        // transaction's end restores the session's value, in a plain batch too (`finish`).
        let millis = limit.as_millis().clamp(1, i32::MAX as u128);
        let sql = format!("{GUARD}SET LOCK_TIMEOUT {millis}");
        let conn = &mut self.conn;
        self.state
            .run(async { conn.batch(&sql).await.map(drop) })
            .await?;
        self.lock_waits_bounded = true;
        Ok(())
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        if let Err(refused) = self.state.check() {
            if let Err(error) = self.finish(ROLLBACK).await {
                tracing::warn!(%error, "Rollback failed; the connection is discarded.");
            }
            return Err(refused);
        }
        let rows = self.finish(COMMIT).await?;
        let open = rows
            .first()
            .and_then(|row| row.try_get::<i32, _>(0).ok().flatten());
        match open {
            Some(0) => Ok(()),
            open => {
                // Dropped by the pool: closing the session rolls the outer transaction back.
                self.conn.broken = true;
                Err(StoreError::of_kind(
                    ErrorKind::Unknown,
                    match open {
                        Some(n) => format!(
                            "{n} transaction(s) still open after COMMIT (a nested BEGIN TRANSACTION): nothing is committed"
                        ),
                        None => "the commit did not report @@TRANCOUNT: the outcome is unknown"
                            .to_owned(),
                    },
                ))
            }
        }
    }

    async fn rollback(mut self) -> Result<(), StoreError> {
        self.finish(ROLLBACK).await.map(drop)
    }
}
