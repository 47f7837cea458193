//! Stores: the [`crate::Store`] port on real databases.
//!
//! # Layout
//! - `mssql` (feature `mssql`): SQL Server and Azure SQL through `tiberius` and `bb8`
//!   (`MssqlStore`).
//! - `postgres` (feature `postgres`): PostgreSQL through `tokio-postgres` and `bb8` (`PgStore`).
//! - `sqlx_pg` (feature `sqlx-postgres`): PostgreSQL through sqlx and its pool (`SqlxPgStore`),
//!   for handlers whose own SQL is sqlx. `pg_codes`: the SQLSTATE table both share.
//! - `sqlite` (feature `sqlite`): SQLite through `rusqlite`, the embedded default
//!   (`SqliteStore`).
//! - `pool`: checking a connection out of a `bb8` pool (PostgreSQL, SQL Server).
//! - [`StoreUrl`]: which store a URL names, printable without its secrets; a URL of a store this
//!   build does not include is refused with the cargo feature to turn on.
//!
//! Each store classifies its provider's errors from the error code and, for unique violations,
//! the constraint name: only [`INBOX_CONSTRAINT`] and [`BUSINESS_KEY_CONSTRAINT`] are duplicates.
//! Migrations live in `sql/<provider>/` and are compiled in. Every store's transaction keeps
//! its first error and refuses what follows it (`tx_state`); savepoints are the way past an
//! expected error.

// A build with no store (a user bringing their own `Store`), or with only `sqlx-postgres` (which
// reads no outbox rows), keeps `StoreUrl`, `Migration` and the constraint names; the helpers the
// other stores share go unused there.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mssql")),
    allow(dead_code)
)]

#[cfg(feature = "mssql")]
pub mod mssql;
#[cfg(any(feature = "postgres", feature = "sqlx-postgres"))]
mod pg_codes;
#[cfg(any(feature = "postgres", feature = "mssql"))]
mod pool;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "sqlx-postgres")]
pub mod sqlx_pg;
pub(crate) mod tx_state;
mod url;

#[cfg(feature = "mssql")]
pub use mssql::{MssqlConfig, MssqlStore, MssqlTx};
#[cfg(feature = "postgres")]
pub use postgres::{PgStore, PgTx};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteTx};
#[cfg(feature = "sqlx-postgres")]
pub use sqlx_pg::{SqlxPgStore, SqlxPgTx};
pub use url::{StoreUrl, StoreUrlError};

use crate::ports::{DuplicateScope, StoreError};

/// The inbox primary key `(consumer, message_id)`.
pub const INBOX_CONSTRAINT: &str = "pk_sb_inbox";
/// The business idempotency key `(consumer, business_key)`.
pub const BUSINESS_KEY_CONSTRAINT: &str = "pk_sb_inbox_business_key";

/// One schema migration, applied once in version order.
///
/// One version space for every store: the core migrations are 1, 3, 4, …; version 2 is the
/// reference consumer's (the `inventory` tables), kept out of the core; versions below 1000 are
/// reserved for sb-inbox, a user's own start at 1000. A user's migrations go through the same
/// bookkeeping table with each store's `apply_migrations`.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in increasing order.
    pub version: i64,
    /// File name, for logs.
    pub name: &'static str,
    /// The SQL script.
    pub sql: &'static str,
}

/// The core migrations of one provider, each `version => "file"` of `sql/<provider>/`, compiled
/// in: the one way every store lists its schema.
#[cfg(any(
    feature = "postgres",
    feature = "sqlx-postgres",
    feature = "sqlite",
    feature = "mssql"
))]
macro_rules! migrations {
    ($provider:literal: $($version:literal => $file:literal),+ $(,)?) => {
        &[$($crate::store::Migration {
            version: $version,
            name: $file,
            sql: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/", $provider, "/", $file)),
        }),+]
    };
}
#[cfg(any(feature = "sqlite", feature = "mssql"))]
pub(crate) use migrations;

/// The PostgreSQL core migrations, in order: inbox, business keys, aggregate versions, outbox
/// (versions: see [`Migration`]). One list for both PostgreSQL stores: a database migrated by
/// one serves the other.
#[cfg(any(feature = "postgres", feature = "sqlx-postgres"))]
pub(crate) const PG_MIGRATIONS: &[Migration] = migrations!("postgres": 1 => "0001_inbox.sql", 3 => "0003_outbox_relay.sql", 5 => "0005_outbox_publishing.sql", 6 => "0006_inbox_verdict.sql");

/// The dead-letter verdict's statements, one text for both PostgreSQL stores
/// (sql/postgres/0006_inbox_verdict.sql): insert, read, and take over an earlier
/// resubmission's.
#[cfg(any(feature = "postgres", feature = "sqlx-postgres"))]
pub(crate) mod pg_verdict {
    pub(crate) const INSERT: &str = "INSERT INTO sb_inbox (consumer, message_id, verdict, verdict_resubmission) VALUES ($1, $2, $3, $4)";
    pub(crate) const READ: &str = "SELECT verdict, verdict_resubmission FROM sb_inbox WHERE consumer = $1 AND message_id = $2";
    pub(crate) const TAKE_OVER: &str =
        "DELETE FROM sb_inbox WHERE consumer = $1 AND message_id = $2
                AND verdict IS NOT NULL AND coalesce(verdict_resubmission, 0) < $3";
}

/// What an inbox row's verdict columns say (sql/*/0006_inbox_verdict.sql): no verdict, a
/// processed message.
#[cfg(any(
    feature = "postgres",
    feature = "sqlx-postgres",
    feature = "sqlite",
    feature = "mssql"
))]
pub(crate) fn inbox_entry(
    verdict: Option<String>,
    resubmission: Option<i64>,
) -> crate::ports::InboxEntry {
    use crate::ports::{InboxEntry, Verdict};
    match verdict {
        None => InboxEntry::Processed,
        Some(reason) => InboxEntry::DeadLettered(Verdict {
            reason,
            resubmission: resubmission.unwrap_or(0),
        }),
    }
}

/// Which dedupe constraint a unique violation names, matched exactly (a constraint whose name
/// merely starts like ours is not ours).
pub(crate) fn duplicate_scope(constraint: &str) -> Option<DuplicateScope> {
    match constraint {
        INBOX_CONSTRAINT => Some(DuplicateScope::Inbox),
        BUSINESS_KEY_CONSTRAINT => Some(DuplicateScope::BusinessKey),
        _ => None,
    }
}

/// Serialises application properties for the outbox's text column. A non-finite double is
/// refused ([`ErrorKind::Conversion`](crate::ports::ErrorKind::Conversion), permanent): JSON has
/// no spelling for it, and the `null` written in its place once made every claim that took the
/// row fail.
pub(crate) fn properties_json(message: &crate::ports::OutboxMessage) -> Result<String, StoreError> {
    use crate::ports::{ErrorKind, PropertyValue};
    let mut map = serde_json::Map::new();
    for (key, value) in &message.application_properties {
        let value = match value {
            PropertyValue::String(s) => serde_json::Value::from(s.as_str()),
            PropertyValue::Long(n) => serde_json::Value::from(*n),
            PropertyValue::Double(d) => serde_json::Number::from_f64(*d)
                .map(serde_json::Value::Number)
                .ok_or_else(|| {
                    StoreError::of_kind(
                        ErrorKind::Conversion,
                        format!(
                            "outbox message {}: application property {key:?} is not a finite number",
                            message.message_id
                        ),
                    )
                })?,
            PropertyValue::Bool(b) => serde_json::Value::from(*b),
        };
        map.insert(key.clone(), value);
    }
    Ok(serde_json::Value::Object(map).to_string())
}

/// The columns of an outbox row that are not the message's text fields, checked: what every
/// store's `append_outbox` binds.
pub(crate) struct OutboxColumns {
    /// The application properties as JSON.
    pub(crate) properties: String,
    /// The time-to-live in milliseconds.
    pub(crate) time_to_live_ms: Option<i64>,
}

/// Checks `message` and computes its [`OutboxColumns`]. Refused, permanently
/// ([`ErrorKind::Conversion`](crate::ports::ErrorKind::Conversion)): a non-finite double, a
/// partition key that differs from the session id (the SDKs refuse it too: .NET
/// `ServiceBusMessage.PartitionKey`'s setter), and a time-to-live under one millisecond.
pub(crate) fn outbox_columns(
    message: &crate::ports::OutboxMessage,
) -> Result<OutboxColumns, StoreError> {
    use crate::ports::ErrorKind;
    let refuse = |what: String| {
        StoreError::of_kind(
            ErrorKind::Conversion,
            format!("outbox message {}: {what}", message.message_id),
        )
    };
    if let (Some(session), Some(partition)) = (&message.session_id, &message.partition_key)
        && session != partition
    {
        return Err(refuse(format!(
            "partition key {partition:?} differs from session id {session:?}"
        )));
    }
    let time_to_live_ms = match message.time_to_live {
        None => None,
        Some(ttl) if ttl.as_millis() == 0 => {
            return Err(refuse("a time-to-live must be at least 1 ms".to_owned()));
        }
        Some(ttl) => Some(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
    };
    Ok(OutboxColumns {
        properties: properties_json(message)?,
        time_to_live_ms,
    })
}

/// A time-to-live from its column.
pub(crate) fn time_to_live(ms: Option<i64>) -> Option<std::time::Duration> {
    ms.map(|ms| std::time::Duration::from_millis(ms.unsigned_abs()))
}

/// Reads application properties back from the outbox's text column (the inverse of
/// [`properties_json`]). Row and message id go into the error: a row edited by hand into
/// something else stops the relay at that row, loudly, instead of publishing it altered.
pub(crate) fn properties_from_json(
    text: &str,
    row: i64,
) -> Result<std::collections::BTreeMap<String, crate::ports::PropertyValue>, StoreError> {
    use crate::ports::{ErrorKind, PropertyValue};
    let invalid = |what: &str| {
        StoreError::of_kind(
            ErrorKind::Conversion,
            format!("sb_outbox row {row}: application_properties {what}"),
        )
    };
    let serde_json::Value::Object(map) =
        serde_json::from_str(text).map_err(|_| invalid("is not JSON"))?
    else {
        return Err(invalid("is not a JSON object"));
    };
    map.into_iter()
        .map(|(key, value)| {
            let value = match value {
                serde_json::Value::String(s) => PropertyValue::String(s),
                serde_json::Value::Bool(b) => PropertyValue::Bool(b),
                serde_json::Value::Number(n) => match n.as_i64() {
                    Some(i) => PropertyValue::Long(i),
                    None => PropertyValue::Double(
                        n.as_f64()
                            .ok_or_else(|| invalid("holds a number out of range"))?,
                    ),
                },
                _ => {
                    return Err(invalid(
                        "holds a value that is no string, number or boolean",
                    ));
                }
            };
            Ok((key, value))
        })
        .collect()
}

/// Milliseconds since the Unix epoch (negative before it): how SQLite and SQL Server receive
/// times, converted to their column types in SQL.
#[cfg(any(feature = "sqlite", feature = "mssql"))]
pub(crate) fn unix_millis(time: std::time::SystemTime) -> i64 {
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis())
            .map(|ms| -ms)
            .unwrap_or(i64::MIN),
    }
}

/// The inverse of [`unix_millis`].
#[cfg(any(feature = "sqlite", feature = "mssql"))]
pub(crate) fn from_unix_millis(ms: i64) -> std::time::SystemTime {
    let offset = std::time::Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        std::time::UNIX_EPOCH + offset
    } else {
        std::time::UNIX_EPOCH - offset
    }
}

/// A row count from a store (never negative) as `u64`.
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Attempts from the store's integer column.
pub(crate) fn attempts(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A send failure as kept on an outbox row: cut to the `last_error` column (1024).
pub(crate) fn failure_text(failure: Option<&str>) -> Option<String> {
    failure.map(|text| crate::runtime::truncate(text, 1024))
}

/// A batch size as the `LIMIT`/`TOP` parameter every store binds (`i64`).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mssql"))]
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Outbox ids as one JSON array: one parameter however many ids (SQL Server takes at most
/// 2 100 parameters), for the stores without array parameters (SQLite's
/// `json_each`, SQL Server's `OPENJSON`).
#[cfg(any(feature = "sqlite", feature = "mssql"))]
pub(crate) fn id_list(ids: &[i64]) -> String {
    serde_json::Value::from(ids).to_string()
}

/// The rows a claim returned, each read on its own with `read`, in id (write) order:
/// `RETURNING` and `OUTPUT` follow no order, and the relay sends in the order the messages
/// were written. A row that does not read goes to [`OutboxClaim::unreadable`]; it never fails
/// the claim (its lease is already written).
///
/// [`OutboxClaim::unreadable`]: crate::ports::OutboxClaim::unreadable
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mssql"))]
pub(crate) fn in_id_order<T>(
    rows: impl IntoIterator<Item = T>,
    read: impl FnMut(T) -> Result<crate::ports::OutboxRow, crate::ports::UnreadableRow>,
) -> crate::ports::OutboxClaim {
    let mut claim = crate::ports::OutboxClaim::default();
    for row in rows.into_iter().map(read) {
        match row {
            Ok(row) => claim.rows.push(row),
            Err(unreadable) => {
                tracing::error!(
                    row = unreadable.id,
                    reason = %unreadable.reason,
                    "An outbox row does not read as a message; it is quarantined until fixed."
                );
                claim.unreadable.push(unreadable);
            }
        }
    }
    claim.rows.sort_by_key(|row| row.id);
    claim.unreadable.sort_by_key(|row| row.id);
    claim
}

/// The [`UnreadableRow`](crate::ports::UnreadableRow) for row `id`, with what of its key and
/// attempts could be read.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mssql"))]
pub(crate) fn unreadable(
    id: i64,
    key: Option<(String, Option<String>)>,
    attempts: u32,
    error: &StoreError,
) -> crate::ports::UnreadableRow {
    crate::ports::UnreadableRow {
        id,
        key,
        attempts,
        reason: error.message().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_round_trip_through_json() {
        use crate::ports::{OutboxMessage, PropertyValue};
        let mut message = OutboxMessage::new("d", "s.v1", Vec::new());
        message.application_properties.extend([
            ("s".to_owned(), PropertyValue::from("text")),
            ("n".to_owned(), PropertyValue::Long(-7)),
            ("f".to_owned(), PropertyValue::Double(1.5)),
            ("b".to_owned(), PropertyValue::Bool(true)),
        ]);
        let json = properties_json(&message).unwrap();
        assert_eq!(
            properties_from_json(&json, 1).unwrap(),
            message.application_properties
        );
        for bad in ["", "[]", r#"{"a":null}"#, r#"{"a":[1]}"#] {
            let error = properties_from_json(bad, 42).unwrap_err();
            assert!(error.message().contains("row 42"), "{error}");
        }
    }

    #[test]
    #[cfg(any(feature = "sqlite", feature = "mssql"))]
    fn unix_millis_round_trip() {
        use std::time::{Duration, UNIX_EPOCH};
        for time in [
            UNIX_EPOCH,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            UNIX_EPOCH - Duration::from_millis(86_400_001),
        ] {
            assert_eq!(from_unix_millis(unix_millis(time)), time);
        }
    }

    #[test]
    fn only_exact_constraint_names_are_duplicates() {
        assert_eq!(duplicate_scope("pk_sb_inbox"), Some(DuplicateScope::Inbox));
        assert_eq!(
            duplicate_scope("pk_sb_inbox_business_key"),
            Some(DuplicateScope::BusinessKey)
        );
        for other in [
            "pk_sb_inbox_aggregate_version",
            "pk_sb_inbox2",
            "PK_SB_INBOX",
            "pk_sb_inbo",
            "",
        ] {
            assert_eq!(duplicate_scope(other), None, "{other}");
        }
    }
}
