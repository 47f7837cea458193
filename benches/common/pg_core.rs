//! A fresh PostgreSQL schema per bench run with the core migrations only: every bench's base
//! (`pg_schema.rs` adds the reference consumer's tables; the sqlx bench needs sb-inbox alone).

use sb_inbox::PgStore;

/// `DATABASE_URL`, defaulting to the local server.
pub(crate) fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// [`pg_url`] with `schema` as the search path.
pub(crate) fn schema_url(schema: &str) -> String {
    let sep = if pg_url().contains('?') { '&' } else { '?' };
    format!("{}{sep}options=-csearch_path%3D{schema}", pg_url())
}

/// Drops and recreates `schema` with the core migrations.
pub(crate) async fn fresh_core_schema(schema: &str, pool: u32) -> PgStore {
    drop_schema(schema).await;
    let admin = PgStore::connect(&pg_url(), 1).await.unwrap();
    admin
        .query(&format!("CREATE SCHEMA {schema}"), &[])
        .await
        .unwrap();
    let store = PgStore::connect(&schema_url(schema), pool).await.unwrap();
    store.migrate().await.unwrap();
    store
}

/// Drops `schema` and everything in it.
pub(crate) async fn drop_schema(schema: &str) {
    let admin = PgStore::connect(&pg_url(), 1).await.unwrap();
    admin
        .query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"), &[])
        .await
        .unwrap();
}
