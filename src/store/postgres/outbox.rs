//! The outbox relay's claims and retention's deletes on PostgreSQL. Each statement commits on
//! its own; claims and deletes pick their rows `FOR UPDATE SKIP LOCKED`, so they never wait
//! for a consumer's or another relay's transaction.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use super::{PgStore, classify};
use crate::ports::{
    OutboxBacklog, OutboxClaim, OutboxLease, OutboxMessage, OutboxRow, OutboxStore, RetentionStore,
    StoreError, UnreadableRow,
};
use crate::store::{
    attempts, count, failure_text, in_id_order, limit, properties_from_json, time_to_live,
    unreadable,
};

/// A session row is skipped while an earlier row of its (destination, session id) waits: leased
/// by a relay (in flight) or backing off after a failure (its `lease_until` is its due time).
/// The session's rows thus go out in id order across relays, passes and restarts.
const CLAIM: &str = "UPDATE sb_outbox AS o
    SET lease_until = $1, lease_token = $2, attempts = o.attempts + 1
   FROM (SELECT id FROM sb_outbox AS r
          WHERE dispatched_at IS NULL AND (lease_until IS NULL OR lease_until <= $3)
            AND (session_id IS NULL OR NOT EXISTS (
                 SELECT e.id FROM sb_outbox AS e
                  WHERE e.destination = r.destination AND e.session_id = r.session_id
                    AND e.id < r.id AND e.dispatched_at IS NULL AND e.lease_until > $3))
          ORDER BY id
          LIMIT $4
          FOR UPDATE SKIP LOCKED) AS due
  WHERE o.id = due.id
  RETURNING o.id, o.message_id, o.destination, o.subject, o.correlation_id, o.content_type,
            o.application_properties, o.body, o.created_at, o.attempts, o.session_id,
            o.partition_key, o.scheduled_enqueue_time, o.time_to_live_ms, o.to_address,
            o.reply_to";

const MARK: &str = "UPDATE sb_outbox SET dispatched_at = $1, last_error = NULL
  WHERE id = ANY($2) AND lease_token = $3 AND dispatched_at IS NULL";

const RELEASE: &str = "UPDATE sb_outbox
    SET lease_until = $1,
        attempts = CASE WHEN $4::varchar IS NULL THEN greatest(attempts - 1, 0) ELSE attempts END,
        last_error = coalesce($4::varchar, last_error)
  WHERE id = ANY($2) AND lease_token = $3 AND dispatched_at IS NULL";

const BACKLOG: &str = "SELECT count(*), min(created_at) FROM sb_outbox WHERE dispatched_at IS NULL";

// ctid: the batch is found through the age index and deleted by physical row address, with no
// second index lookup. Ordered by age so the planner walks the index rather than scanning the
// table past the dead rows of earlier batches.
const DELETE_INBOX: &str = "DELETE FROM sb_inbox WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM sb_inbox WHERE processed_at < now() - $1::bigint * interval '1 millisecond'
     ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED))";

const DELETE_OUTBOX: &str = "DELETE FROM sb_outbox WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM sb_outbox WHERE dispatched_at < $1
     ORDER BY dispatched_at LIMIT $2 FOR UPDATE SKIP LOCKED))";

/// Reads one claimed row: a message, or why it does not read (its lease stays written).
fn outbox_row(row: &Row) -> Result<OutboxRow, UnreadableRow> {
    // id is the primary key (never NULL); the rest is read knowing which row it is.
    let id: i64 = row.try_get(0).unwrap_or_default();
    let attempts = attempts(i64::from(row.try_get::<_, i32>(9).unwrap_or(0)));
    read_row(id, attempts, row).map_err(|error| {
        let key = match (row.try_get(2), row.try_get(10)) {
            (Ok(destination), Ok(session)) => Some((destination, session)),
            _ => None,
        };
        unreadable(id, key, attempts, &error)
    })
}

fn read_row(id: i64, attempts: u32, row: &Row) -> Result<OutboxRow, StoreError> {
    let properties: String = row.try_get(6).map_err(classify)?;
    let mut message = OutboxMessage::new(
        row.try_get::<_, String>(2).map_err(classify)?,
        String::new(),
        row.try_get(7).map_err(classify)?,
    );
    message.message_id = row.try_get(1).map_err(classify)?;
    message.subject = row.try_get(3).map_err(classify)?;
    message.correlation_id = row.try_get(4).map_err(classify)?;
    message.content_type = row.try_get(5).map_err(classify)?;
    message.application_properties = properties_from_json(&properties, id)?;
    message.session_id = row.try_get(10).map_err(classify)?;
    message.partition_key = row.try_get(11).map_err(classify)?;
    message.scheduled_enqueue_time = row.try_get(12).map_err(classify)?;
    message.time_to_live = time_to_live(row.try_get(13).map_err(classify)?);
    message.to = row.try_get(14).map_err(classify)?;
    message.reply_to = row.try_get(15).map_err(classify)?;
    Ok(OutboxRow {
        id,
        message,
        created_at: row.try_get(8).map_err(classify)?,
        attempts,
    })
}

impl PgStore {
    async fn execute_prepared(
        &self,
        sql: &'static str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let mut conn = self.connection().await?;
        conn.execute_cached(sql, params).await
    }
}

impl OutboxStore for PgStore {
    async fn claim_outbox(
        &self,
        now: SystemTime,
        lease: &OutboxLease,
        limit_to: usize,
    ) -> Result<OutboxClaim, StoreError> {
        let mut conn = self.connection().await?;
        let rows = conn
            .query_cached(
                CLAIM,
                &[&lease.until(), &lease.token(), &now, &limit(limit_to)],
            )
            .await?;
        Ok(in_id_order(&rows, outbox_row))
    }

    async fn mark_dispatched(
        &self,
        lease: &OutboxLease,
        ids: &[i64],
        at: SystemTime,
    ) -> Result<u64, StoreError> {
        self.execute_prepared(MARK, &[&at, &ids, &lease.token()])
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
        self.execute_prepared(RELEASE, &[&due, &ids, &lease.token(), &failure])
            .await
    }

    async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
        let rows = self.query(BACKLOG, &[]).await?;
        let Some(row) = rows.first() else {
            return Ok(OutboxBacklog::default());
        };
        Ok(OutboxBacklog {
            pending: count(row.try_get(0).map_err(classify)?),
            oldest: row.try_get(1).map_err(classify)?,
        })
    }
}

impl RetentionStore for PgStore {
    async fn delete_inbox_batch(
        &self,
        older_than: Duration,
        limit_to: usize,
    ) -> Result<u64, StoreError> {
        let millis = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        self.execute_prepared(DELETE_INBOX, &[&millis, &limit(limit_to)])
            .await
    }

    async fn delete_dispatched_outbox_batch(
        &self,
        before: SystemTime,
        limit_to: usize,
    ) -> Result<u64, StoreError> {
        self.execute_prepared(DELETE_OUTBOX, &[&before, &limit(limit_to)])
            .await
    }
}
