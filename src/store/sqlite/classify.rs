//! SQLite error classification.
//!
//! SQLite reports the kind of a constraint failure in its extended result code but names no
//! constraint for UNIQUE and PRIMARY KEY failures: its message lists `table.column` pairs
//! instead (a fixed, unlocalised format). The inbox and business-key column lists are mapped
//! back to their constraint names; CHECK failures carry the constraint name itself.

use rusqlite::ffi;

use crate::ports::{ErrorKind, StoreError};
use crate::store::{BUSINESS_KEY_CONSTRAINT, INBOX_CONSTRAINT, duplicate_scope};

/// The column lists SQLite reports for our dedupe keys.
const KEY_COLUMNS: &[(&str, &str)] = &[
    ("sb_inbox.consumer, sb_inbox.message_id", INBOX_CONSTRAINT),
    (
        "sb_inbox_business_key.consumer, sb_inbox_business_key.business_key",
        BUSINESS_KEY_CONSTRAINT,
    ),
];

/// Classifies a rusqlite error by its extended result code.
pub fn classify(error: rusqlite::Error) -> StoreError {
    let message = error.to_string();
    let rusqlite::Error::SqliteFailure(failure, detail) = &error else {
        let kind = match error {
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::ToSqlConversionFailure(..)
            | rusqlite::Error::Utf8Error(..) => ErrorKind::Conversion,
            rusqlite::Error::InvalidColumnName(..)
            | rusqlite::Error::InvalidColumnIndex(..)
            | rusqlite::Error::InvalidParameterName(..)
            | rusqlite::Error::InvalidParameterCount(..) => ErrorKind::Schema,
            _ => ErrorKind::Unknown,
        };
        return StoreError::of_kind(kind, message).with_source(error);
    };
    let detail = detail.as_deref().unwrap_or_default();
    let code = failure.extended_code;
    let (kind, constraint) = match code {
        ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
            let columns = detail.split_once("failed: ").map_or("", |(_, c)| c);
            let constraint = KEY_COLUMNS
                .iter()
                .find(|(cols, _)| *cols == columns)
                .map_or(columns, |(_, name)| name);
            let kind = duplicate_scope(constraint)
                .map_or(ErrorKind::UniqueViolation, ErrorKind::Duplicate);
            (kind, Some(constraint.to_owned()))
        }
        ffi::SQLITE_CONSTRAINT_FOREIGNKEY => (ErrorKind::ForeignKeyViolation, None),
        ffi::SQLITE_CONSTRAINT_CHECK => {
            let name = detail.split_once("failed: ").map(|(_, c)| c.to_owned());
            (ErrorKind::CheckViolation, name)
        }
        ffi::SQLITE_CONSTRAINT_NOTNULL => (ErrorKind::NotNullViolation, None),
        ffi::SQLITE_TOOBIG => (ErrorKind::Truncation, None),
        ffi::SQLITE_MISMATCH | ffi::SQLITE_CONSTRAINT_DATATYPE => (ErrorKind::Conversion, None),
        _ => match failure.code {
            // The busy timeout ran out waiting for another connection's lock: contention once,
            // an outage when every transaction meets it (the kill switch counts a run).
            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked => {
                (ErrorKind::TimedOut, None)
            }
            rusqlite::ErrorCode::SystemIoFailure
            | rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::OutOfMemory
            | rusqlite::ErrorCode::DiskFull => (ErrorKind::Unavailable, None),
            // A read-only file or a missing table: the deployment, not the message.
            rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::PermissionDenied => {
                (ErrorKind::Deployment, None)
            }
            rusqlite::ErrorCode::Unknown if detail.starts_with("no such") => {
                (ErrorKind::Deployment, None)
            }
            rusqlite::ErrorCode::ConstraintViolation => (ErrorKind::CheckViolation, None),
            _ => (ErrorKind::Unknown, None),
        },
    };
    StoreError::new(kind, Some(code.to_string()), constraint, message).with_source(error)
}

/// A handler's own SQL on [`crate::SqliteTx`] is classified like the runtime's (see the
/// PostgreSQL conversion).
impl From<rusqlite::Error> for crate::runtime::HandlerError {
    fn from(error: rusqlite::Error) -> Self {
        crate::runtime::HandlerError::Store(classify(error))
    }
}
