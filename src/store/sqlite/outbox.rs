//! The outbox relay's claims and retention's deletes on SQLite. SQLite has one writer: each
//! call is one short `BEGIN IMMEDIATE` transaction that takes its turn with consumer
//! transactions. Times travel as Unix milliseconds and are formatted in SQL like the columns'
//! defaults, so text comparison orders them.

use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{SqliteStore, classify};
use crate::ports::{
    OutboxBacklog, OutboxClaim, OutboxLease, OutboxMessage, OutboxRow, OutboxStore, RetentionStore,
    StoreError, UnreadableRow,
};
use crate::store::{
    attempts, count, failure_text, from_unix_millis, id_list, in_id_order, limit,
    properties_from_json, time_to_live, unix_millis, unreadable,
};

/// A session row waits while an earlier row of its session is leased or backing off, as on
/// PostgreSQL (`src/store/postgres/outbox.rs`).
const CLAIM: &str = "UPDATE sb_outbox
    SET lease_until = strftime('%Y-%m-%dT%H:%M:%fZ', ?1 / 1000.0, 'unixepoch'),
        lease_token = ?2,
        attempts = attempts + 1
  WHERE id IN (SELECT id FROM sb_outbox AS r
                WHERE dispatched_at IS NULL
                  AND (lease_until IS NULL
                       OR lease_until <= strftime('%Y-%m-%dT%H:%M:%fZ', ?3 / 1000.0, 'unixepoch'))
                  AND (session_id IS NULL OR NOT EXISTS (
                       SELECT e.id FROM sb_outbox AS e
                        WHERE e.destination = r.destination AND e.session_id = r.session_id
                          AND e.id < r.id AND e.dispatched_at IS NULL
                          AND e.lease_until
                              > strftime('%Y-%m-%dT%H:%M:%fZ', ?3 / 1000.0, 'unixepoch')))
                ORDER BY id
                LIMIT ?4)
  RETURNING id, message_id, destination, subject, correlation_id, content_type,
            application_properties, body,
            CAST(round(unixepoch(created_at, 'subsec') * 1000) AS INTEGER), attempts, session_id,
            partition_key,
            CAST(round(unixepoch(scheduled_enqueue_time, 'subsec') * 1000) AS INTEGER),
            time_to_live_ms, to_address, reply_to";

const MARK: &str = "UPDATE sb_outbox
    SET dispatched_at = strftime('%Y-%m-%dT%H:%M:%fZ', ?1 / 1000.0, 'unixepoch'),
        last_error = NULL
  WHERE id IN (SELECT value FROM json_each(?2)) AND lease_token = ?3 AND dispatched_at IS NULL";

const RELEASE: &str = "UPDATE sb_outbox
    SET lease_until = strftime('%Y-%m-%dT%H:%M:%fZ', ?1 / 1000.0, 'unixepoch'),
        attempts = CASE WHEN ?4 IS NULL THEN max(attempts - 1, 0) ELSE attempts END,
        last_error = coalesce(?4, last_error)
  WHERE id IN (SELECT value FROM json_each(?2)) AND lease_token = ?3 AND dispatched_at IS NULL";

const BACKLOG: &str = "SELECT count(*),
    CAST(round(unixepoch(min(created_at), 'subsec') * 1000) AS INTEGER)
  FROM sb_outbox WHERE dispatched_at IS NULL";

const DELETE_INBOX: &str = "DELETE FROM sb_inbox WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM sb_inbox
     WHERE processed_at < strftime('%Y-%m-%dT%H:%M:%fZ',
                                   unixepoch('now', 'subsec') - ?1 / 1000.0, 'unixepoch')
     ORDER BY processed_at LIMIT ?2)";

const DELETE_OUTBOX: &str = "DELETE FROM sb_outbox WHERE id IN (
    SELECT id FROM sb_outbox
     WHERE dispatched_at < strftime('%Y-%m-%dT%H:%M:%fZ', ?1 / 1000.0, 'unixepoch')
     ORDER BY dispatched_at LIMIT ?2)";

/// The raw columns of a claimed row; the properties are decoded after the transaction.
struct Claimed {
    id: i64,
    message_id: String,
    destination: String,
    subject: Option<String>,
    correlation_id: Option<String>,
    content_type: Option<String>,
    properties: String,
    body: Vec<u8>,
    created_at: i64,
    attempts: i64,
    session_id: Option<String>,
    partition_key: Option<String>,
    scheduled_enqueue_time: Option<i64>,
    time_to_live_ms: Option<i64>,
    to: Option<String>,
    reply_to: Option<String>,
}

impl Claimed {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Claimed {
            id: row.get(0)?,
            message_id: row.get(1)?,
            destination: row.get(2)?,
            subject: row.get(3)?,
            correlation_id: row.get(4)?,
            content_type: row.get(5)?,
            properties: row.get(6)?,
            body: row.get(7)?,
            created_at: row.get(8)?,
            attempts: row.get(9)?,
            session_id: row.get(10)?,
            partition_key: row.get(11)?,
            scheduled_enqueue_time: row.get(12)?,
            time_to_live_ms: row.get(13)?,
            to: row.get(14)?,
            reply_to: row.get(15)?,
        })
    }

    /// The row as a message, or why it does not read (its lease stays written).
    fn into_row(self) -> Result<OutboxRow, UnreadableRow> {
        let properties = match properties_from_json(&self.properties, self.id) {
            Ok(properties) => properties,
            Err(error) => {
                let key = Some((self.destination, self.session_id));
                return Err(unreadable(self.id, key, attempts(self.attempts), &error));
            }
        };
        let mut message = OutboxMessage::new(self.destination, String::new(), self.body);
        message.message_id = self.message_id;
        message.subject = self.subject;
        message.correlation_id = self.correlation_id;
        message.content_type = self.content_type;
        message.application_properties = properties;
        message.session_id = self.session_id;
        message.partition_key = self.partition_key;
        message.scheduled_enqueue_time = self.scheduled_enqueue_time.map(from_unix_millis);
        message.time_to_live = time_to_live(self.time_to_live_ms);
        message.to = self.to;
        message.reply_to = self.reply_to;
        Ok(OutboxRow {
            id: self.id,
            message,
            attempts: attempts(self.attempts),
            created_at: from_unix_millis(self.created_at),
        })
    }
}

impl SqliteStore {
    /// Runs `f` in a write transaction of its own, after the consumers' writers queued before
    /// it.
    async fn write<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let _writer = self.writer.lock().await;
        let mut conn = self.conn.lock().await;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(classify)?;
        let value = f(&tx).map_err(classify)?;
        tx.commit().map_err(classify)?;
        Ok(value)
    }

    /// Runs one statement in a write transaction of its own; returns the rows it changed. The
    /// parameters are built inside `params`, on the connection's side of the await.
    async fn update<P: rusqlite::Params>(
        &self,
        sql: &'static str,
        params: impl FnOnce() -> P + Send,
    ) -> Result<u64, StoreError> {
        self.write(|conn| conn.prepare_cached(sql)?.execute(params()))
            .await
            .map(|n| n as u64)
    }
}

impl OutboxStore for SqliteStore {
    async fn claim_outbox(
        &self,
        now: SystemTime,
        lease: &OutboxLease,
        limit_to: usize,
    ) -> Result<OutboxClaim, StoreError> {
        let claimed = self
            .write(|conn| {
                let mut statement = conn.prepare_cached(CLAIM)?;
                let rows = statement.query_map(
                    params![
                        unix_millis(lease.until()),
                        lease.token(),
                        unix_millis(now),
                        limit(limit_to)
                    ],
                    Claimed::read,
                )?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await?;
        Ok(in_id_order(claimed, Claimed::into_row))
    }

    async fn mark_dispatched(
        &self,
        lease: &OutboxLease,
        ids: &[i64],
        at: SystemTime,
    ) -> Result<u64, StoreError> {
        self.update(MARK, || (unix_millis(at), id_list(ids), lease.token()))
            .await
    }

    async fn release_outbox(
        &self,
        lease: &OutboxLease,
        ids: &[i64],
        due: SystemTime,
        failure: Option<&str>,
    ) -> Result<u64, StoreError> {
        let failure = failure_text(failure);
        self.update(RELEASE, || {
            (unix_millis(due), id_list(ids), lease.token(), failure)
        })
        .await
    }

    async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
        let (pending, oldest) = self
            .with_connection(|conn| {
                conn.query_row(BACKLOG, [], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, Option<i64>>(1)?))
                })
                .optional()
            })
            .await?
            .unwrap_or((0, None));
        Ok(OutboxBacklog {
            pending: count(pending),
            oldest: oldest.map(from_unix_millis),
        })
    }
}

impl RetentionStore for SqliteStore {
    async fn delete_inbox_batch(
        &self,
        older_than: Duration,
        limit_to: usize,
    ) -> Result<u64, StoreError> {
        let millis = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        self.update(DELETE_INBOX, || (millis, limit(limit_to)))
            .await
    }

    async fn delete_dispatched_outbox_batch(
        &self,
        before: SystemTime,
        limit_to: usize,
    ) -> Result<u64, StoreError> {
        self.update(DELETE_OUTBOX, || (unix_millis(before), limit(limit_to)))
            .await
    }
}
