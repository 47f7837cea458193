//! Stores: the [`crate::Store`] port on real databases.
//!
//! # Layout
//! - [`mssql`]: SQL Server and Azure SQL through `tiberius` and `bb8` ([`MssqlStore`]).
//! - [`postgres`]: PostgreSQL through `tokio-postgres` and `bb8` ([`PgStore`]).
//! - [`sqlite`]: SQLite through `rusqlite`, the embedded default ([`SqliteStore`]).
//! - [`StoreUrl`]: which store a URL names, printable without its secrets.
//!
//! Each store classifies its provider's errors from the error code and, for unique violations,
//! the constraint name: only [`INBOX_CONSTRAINT`] and [`BUSINESS_KEY_CONSTRAINT`] are duplicates.
//! Migrations live in `sql/<provider>/` and are compiled in.

pub mod mssql;
pub mod postgres;
pub mod sqlite;
mod url;

pub use mssql::{MssqlConfig, MssqlStore, MssqlTx};
pub use postgres::{PgStore, PgTx};
pub use sqlite::{SqliteStore, SqliteTx};
pub use url::{StoreUrl, StoreUrlError};

use crate::ports::DuplicateScope;

/// The inbox primary key `(consumer, message_id)`.
pub const INBOX_CONSTRAINT: &str = "pk_sb_inbox";
/// The business idempotency key `(consumer, business_key)`.
pub const BUSINESS_KEY_CONSTRAINT: &str = "pk_sb_inbox_business_key";

/// One schema migration, applied once in version order.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in increasing order.
    pub version: i64,
    /// File name, for logs.
    pub name: &'static str,
    /// The SQL script.
    pub sql: &'static str,
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

/// Serialises application properties for the outbox's text column.
pub(crate) fn properties_json(message: &crate::ports::OutboxMessage) -> String {
    use crate::ports::PropertyValue;
    let map: serde_json::Map<String, serde_json::Value> = message
        .application_properties
        .iter()
        .map(|(key, value)| {
            let value = match value {
                PropertyValue::String(s) => serde_json::Value::from(s.as_str()),
                PropertyValue::Long(n) => serde_json::Value::from(*n),
                PropertyValue::Double(d) => serde_json::Value::from(*d),
                PropertyValue::Bool(b) => serde_json::Value::from(*b),
            };
            (key.clone(), value)
        })
        .collect();
    serde_json::Value::Object(map).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

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
