//! The PostgreSQL schema: the core migrations and how any set of them is applied (once each,
//! in version order, serialised across processes by an advisory lock).

use super::{PgStore, classify};
use crate::ports::StoreError;
use crate::store::Migration;

/// The PostgreSQL core migrations, in order: inbox, business keys, aggregate versions, outbox
/// (versions: see [`Migration`]).
pub const MIGRATIONS: &[Migration] = crate::store::PG_MIGRATIONS;

/// Serialises concurrent `migrate` calls across processes.
const MIGRATION_LOCK: i64 = 0x5b1_0b0c;

impl PgStore {
    /// Applies the core migrations not applied yet; returns how many ran.
    ///
    /// # Errors
    /// As [`Self::apply_migrations`].
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        self.apply_migrations(MIGRATIONS).await
    }

    /// Applies the migrations of `set` not applied yet (the hook for a consumer's own schema:
    /// the same bookkeeping table, one version space), under an advisory lock; returns how many ran.
    ///
    /// # Errors
    /// A [`StoreError`] from the first failing script (its transaction rolls back).
    pub async fn apply_migrations(&self, set: &[Migration]) -> Result<usize, StoreError> {
        let mut conn = self.connection().await?;
        let client = &mut conn.client;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS sb_inbox_schema_migrations (
                     version bigint NOT NULL CONSTRAINT pk_sb_inbox_schema_migrations PRIMARY KEY,
                     name text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now())",
            )
            .await
            .map_err(classify)?;
        let mut applied = 0;
        for migration in set {
            let tx = client.transaction().await.map_err(classify)?;
            // A migration may build an index on a large table or wait for another `migrate`.
            tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
                .await
                .map_err(classify)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(classify)?;
            let done = tx
                .query_opt(
                    "SELECT 1 FROM sb_inbox_schema_migrations WHERE version = $1",
                    &[&migration.version],
                )
                .await
                .map_err(classify)?;
            if done.is_none() {
                tx.batch_execute(migration.sql).await.map_err(classify)?;
                tx.execute(
                    "INSERT INTO sb_inbox_schema_migrations (version, name) VALUES ($1, $2)",
                    &[&migration.version, &migration.name],
                )
                .await
                .map_err(classify)?;
                applied += 1;
                tracing::info!(migration = migration.name, "Migration applied.");
            }
            tx.commit().await.map_err(classify)?;
        }
        Ok(applied)
    }
}
