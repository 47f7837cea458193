//! A fresh PostgreSQL schema per bench run, migrated for the reference consumer: the e2e and
//! throughput benches share it.

use sb_inbox::PgStore;
use sb_inbox_cli::inventory::InventoryStore;

#[path = "pg_core.rs"]
mod pg_core;

#[allow(unused_imports)]
pub(crate) use pg_core::{drop_schema, pg_url, schema_url};

/// Drops and recreates `schema`, then applies the core and inventory migrations in it.
pub(crate) async fn fresh_schema(schema: &str, pool: u32) -> PgStore {
    let store = pg_core::fresh_core_schema(schema, pool).await;
    store.migrate_inventory().await.unwrap();
    store
}
