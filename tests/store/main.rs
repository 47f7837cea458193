//! Store tests: one conformance suite run unchanged against each store, and the
//! classification of real provider errors (SQL Server: a mock TDS server here, the real one
//! when `SB_INBOX_MSSQL` is set).
#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod entra_identity;
mod inventory_locks;
mod mssql_errors;
mod mssql_mock;
mod outbox;
mod postgres_errors;
mod postgres_tls;
mod round_trips;
mod sqlite_errors;
mod sqlx_postgres;
