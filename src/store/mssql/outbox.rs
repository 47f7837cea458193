//! The outbox relay's claims and retention's deletes on SQL Server. Each statement commits on
//! its own. Claims read `UPDLOCK, ROWLOCK, READPAST` and deletes `ROWLOCK, READPAST`: rows
//! another transaction holds are skipped, never waited for, and a batch stays below the 5 000
//! locks at which SQL Server escalates to a table lock. Times travel as Unix milliseconds and
//! are turned into `datetime2(3)` in SQL (no date types in the parameters).

use std::time::{Duration, SystemTime};

use tiberius::Row;

use super::{MssqlStore, classify};
use crate::ports::{
    ErrorKind, MAX_ROWS_PER_STATEMENT, OutboxBacklog, OutboxClaim, OutboxLease, OutboxMessage,
    OutboxRow, OutboxStore, RetentionStore, StoreError, UnreadableRow,
};
use crate::store::{
    attempts, count, failure_text, from_unix_millis, id_list, in_id_order, limit,
    properties_from_json, time_to_live, unix_millis, unreadable,
};

/// `datetime2(3)` from a parameter holding Unix milliseconds (days and the rest apart, as
/// `DATEADD` takes an `int`).
macro_rules! at {
    ($param:literal) => {
        concat!(
            "DATEADD(millisecond, CAST(",
            $param,
            " % 86400000 AS int), DATEADD(day, CAST(",
            $param,
            " / 86400000 AS int), CAST('19700101' AS datetime2(3))))"
        )
    };
}

/// Unix milliseconds of a `datetime2` column.
macro_rules! millis {
    ($column:expr) => {
        concat!(
            "DATEDIFF_BIG(millisecond, CAST('19700101' AS datetime2(3)), ",
            $column,
            ")"
        )
    };
}

/// A session row waits while an earlier row of its session is leased or backing off, as on
/// PostgreSQL (`src/store/postgres/outbox.rs`); rows a consumer is still writing are read past.
const CLAIM: &str = concat!(
    "WITH due AS (
        SELECT TOP (@P4) * FROM sb_outbox AS r WITH (UPDLOCK, ROWLOCK, READPAST)
         WHERE dispatched_at IS NULL AND (lease_until IS NULL OR lease_until <= ",
    at!("@P3"),
    ")
           AND (session_id IS NULL OR NOT EXISTS (
                SELECT e.id FROM sb_outbox AS e WITH (READPAST)
                 WHERE e.destination = r.destination AND e.session_id = r.session_id
                   AND e.id < r.id AND e.dispatched_at IS NULL AND e.lease_until > ",
    at!("@P3"),
    "))
         ORDER BY id)
     UPDATE due SET lease_until = ",
    at!("@P1"),
    ", lease_token = @P2, attempts = attempts + 1
     OUTPUT inserted.id, inserted.message_id, inserted.destination, inserted.subject,
            inserted.correlation_id, inserted.content_type, inserted.application_properties,
            inserted.body, ",
    millis!("inserted.created_at"),
    ", inserted.attempts, inserted.session_id, inserted.partition_key, ",
    millis!("inserted.scheduled_enqueue_time"),
    ", inserted.time_to_live_ms, inserted.to_address, inserted.reply_to;"
);

const MARK: &str = concat!(
    "UPDATE sb_outbox WITH (ROWLOCK) SET dispatched_at = ",
    at!("@P1"),
    ", last_error = NULL
      WHERE id IN (SELECT CAST(value AS bigint) FROM OPENJSON(@P2))
        AND lease_token = @P3 AND dispatched_at IS NULL"
);

const RELEASE: &str = concat!(
    "UPDATE sb_outbox WITH (ROWLOCK) SET lease_until = ",
    at!("@P1"),
    ",
            attempts = CASE WHEN @P4 IS NULL AND attempts > 0 THEN attempts - 1 ELSE attempts END,
            last_error = COALESCE(@P4, last_error)
      WHERE id IN (SELECT CAST(value AS bigint) FROM OPENJSON(@P2))
        AND lease_token = @P3 AND dispatched_at IS NULL"
);

const BACKLOG: &str = concat!(
    "SELECT CAST(COUNT(*) AS bigint), ",
    millis!("MIN(created_at)"),
    " FROM sb_outbox WHERE dispatched_at IS NULL"
);

// Whole seconds: DATEADD takes an int, and a retention in milliseconds overflows it.
const DELETE_INBOX: &str = "DELETE TOP (@P2) FROM sb_inbox WITH (ROWLOCK, READPAST) \
    WHERE processed_at < DATEADD(second, -@P1, SYSUTCDATETIME())";

const DELETE_OUTBOX: &str = concat!(
    "DELETE TOP (@P2) FROM sb_outbox WITH (ROWLOCK, READPAST) WHERE dispatched_at < ",
    at!("@P1")
);

fn missing(column: &str) -> StoreError {
    StoreError::of_kind(ErrorKind::Conversion, format!("sb_outbox.{column} is NULL"))
}

fn text(row: &Row, index: usize) -> Result<Option<String>, StoreError> {
    Ok(row
        .try_get::<&str, _>(index)
        .map_err(classify)?
        .map(str::to_owned))
}

/// Reads one claimed row: a message, or why it does not read (its lease stays written).
fn outbox_row(row: &Row) -> Result<OutboxRow, UnreadableRow> {
    // id is the primary key (never NULL); the rest is read knowing which row it is.
    let id = row.try_get::<i64, _>(0).ok().flatten().unwrap_or_default();
    let attempts = attempts(i64::from(
        row.try_get::<i32, _>(9).ok().flatten().unwrap_or(0),
    ));
    read_row(id, attempts, row).map_err(|error| {
        let key = match (text(row, 2), text(row, 10)) {
            (Ok(Some(destination)), Ok(session)) => Some((destination, session)),
            _ => None,
        };
        unreadable(id, key, attempts, &error)
    })
}

fn read_row(id: i64, attempts: u32, row: &Row) -> Result<OutboxRow, StoreError> {
    let properties = text(row, 6)?.ok_or_else(|| missing("application_properties"))?;
    let body = row
        .try_get::<&[u8], _>(7)
        .map_err(classify)?
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    let destination = text(row, 2)?.ok_or_else(|| missing("destination"))?;
    let mut message = OutboxMessage::new(destination, String::new(), body);
    message.message_id = text(row, 1)?.ok_or_else(|| missing("message_id"))?;
    message.subject = text(row, 3)?;
    message.correlation_id = text(row, 4)?;
    message.content_type = text(row, 5)?;
    message.application_properties = properties_from_json(&properties, id)?;
    message.session_id = text(row, 10)?;
    message.partition_key = text(row, 11)?;
    message.scheduled_enqueue_time = row
        .try_get::<i64, _>(12)
        .map_err(classify)?
        .map(from_unix_millis);
    message.time_to_live = time_to_live(row.try_get::<i64, _>(13).map_err(classify)?);
    message.to = text(row, 14)?;
    message.reply_to = text(row, 15)?;
    Ok(OutboxRow {
        id,
        message,
        created_at: from_unix_millis(
            row.try_get::<i64, _>(8)
                .map_err(classify)?
                .ok_or_else(|| missing("created_at"))?,
        ),
        attempts,
    })
}

impl OutboxStore for MssqlStore {
    async fn claim_outbox(
        &self,
        now: SystemTime,
        lease: &OutboxLease,
        limit_to: usize,
    ) -> Result<OutboxClaim, StoreError> {
        let rows = self
            .query(
                CLAIM,
                &[
                    &unix_millis(lease.until()),
                    &lease.token(),
                    &unix_millis(now),
                    &limit(limit_to),
                ],
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
        self.execute(
            MARK,
            &[&unix_millis(at), &id_list(ids).as_str(), &lease.token()],
        )
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
        self.execute(
            RELEASE,
            &[
                &unix_millis(due),
                &id_list(ids).as_str(),
                &lease.token(),
                &failure,
            ],
        )
        .await
    }

    async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
        let rows = self.query(BACKLOG, &[]).await?;
        let Some(row) = rows.first() else {
            return Ok(OutboxBacklog::default());
        };
        Ok(OutboxBacklog {
            pending: count(row.try_get::<i64, _>(0).map_err(classify)?.unwrap_or(0)),
            oldest: row
                .try_get::<i64, _>(1)
                .map_err(classify)?
                .map(from_unix_millis),
        })
    }
}

impl RetentionStore for MssqlStore {
    async fn delete_inbox_batch(
        &self,
        older_than: Duration,
        limit_to: usize,
    ) -> Result<u64, StoreError> {
        let batch = limit(limit_to.min(MAX_ROWS_PER_STATEMENT));
        let secs = i32::try_from(older_than.as_secs()).unwrap_or(i32::MAX);
        self.execute(DELETE_INBOX, &[&secs, &batch]).await
    }

    async fn delete_dispatched_outbox_batch(
        &self,
        before: SystemTime,
        limit_to: usize,
    ) -> Result<u64, StoreError> {
        let batch = limit(limit_to.min(MAX_ROWS_PER_STATEMENT));
        self.execute(DELETE_OUTBOX, &[&unix_millis(before), &batch])
            .await
    }
}
