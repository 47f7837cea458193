//! The SQL Server schema: the core migrations and how any set of them is applied (once each,
//! in version order, each in a transaction under an application lock).

use super::MssqlStore;
use crate::ports::StoreError;
use crate::store::Migration;

/// The SQL Server core migrations, in order: inbox, business keys, aggregate versions, outbox,
/// then exact (binary, length-checked) keys (versions: see [`Migration`]).
pub const MIGRATIONS: &[Migration] = crate::store::migrations!("mssql": 1 => "0001_inbox.sql", 3 => "0003_outbox_relay.sql", 4 => "0004_exact_keys.sql", 5 => "0005_outbox_publishing.sql", 6 => "0006_inbox_verdict.sql");

impl MssqlStore {
    /// Applies the core migrations not applied yet; returns how many ran.
    ///
    /// # Errors
    /// As [`Self::apply_migrations`].
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        self.apply_migrations(MIGRATIONS).await
    }

    /// Applies the migrations of `set` not applied yet (the hook for a consumer's own schema:
    /// the same bookkeeping table, one version space), each in a transaction under an application lock
    /// (so concurrent `migrate` calls serialise); returns how many ran.
    ///
    /// # Errors
    /// A [`StoreError`] from the first failing script (its transaction rolls back).
    pub async fn apply_migrations(&self, set: &[Migration]) -> Result<usize, StoreError> {
        let mut conn = self.connection().await?;
        // A migration may rebuild a key on a large table: no command timeout (the connection
        // is dropped afterwards, so the pool never sees it unbounded).
        conn.command_timeout = None;
        conn.broken = true;
        let mut applied = 0;
        for migration in set {
            conn.in_tx = true;
            conn.batch(
                "BEGIN TRANSACTION;
                 EXEC sp_getapplock @Resource = N'sb_inbox_migrate', @LockMode = N'Exclusive',
                      @LockOwner = N'Transaction', @LockTimeout = 60000;
                 IF OBJECT_ID(N'sb_inbox_schema_migrations', N'U') IS NULL
                     CREATE TABLE sb_inbox_schema_migrations (
                         version    bigint        NOT NULL CONSTRAINT pk_sb_inbox_schema_migrations PRIMARY KEY,
                         name       nvarchar(256) NOT NULL,
                         applied_at datetime2(3)  NOT NULL
                             CONSTRAINT df_sb_inbox_schema_migrations_applied_at DEFAULT SYSUTCDATETIME());",
            )
            .await?;
            let done = conn
                .query(
                    "SELECT version FROM sb_inbox_schema_migrations WHERE version = @P1",
                    &[&migration.version],
                )
                .await?;
            if done.is_empty() {
                conn.batch(migration.sql).await?;
                conn.execute(
                    "INSERT INTO sb_inbox_schema_migrations (version, name) VALUES (@P1, @P2)",
                    &[&migration.version, &migration.name],
                )
                .await?;
                applied += 1;
                tracing::info!(migration = migration.name, "Migration applied.");
            }
            conn.batch("COMMIT TRANSACTION").await?;
            conn.in_tx = false;
        }
        Ok(applied)
    }
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    /// Issue 14, finding 1. SQL Server cannot run here (and the mock TDS server cannot take a
    /// migration script); the real server runs `keys_compare_exactly` in GitHub Actions. This
    /// checks the scripts themselves: after all migrations, every key column is binary-collated
    /// and every dedupe key also holds the key's length (`=` ignores trailing spaces).
    #[test]
    fn migrations_make_every_key_exact() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
        let all: String = MIGRATIONS
            .iter()
            .map(|m| m.sql.to_ascii_lowercase())
            .collect::<Vec<_>>()
            .join("\n");
        let columns = [
            ("sb_inbox", "consumer"),
            ("sb_inbox", "message_id"),
            ("sb_inbox_business_key", "consumer"),
            ("sb_inbox_business_key", "business_key"),
            ("sb_inbox_aggregate_version", "consumer"),
            ("sb_inbox_aggregate_version", "aggregate"),
            ("sb_outbox", "message_id"),
        ];
        for (table, column) in columns {
            let altered = format!("alter table {table} alter column {column} nvarchar(");
            let line = all
                .lines()
                .find(|line| line.starts_with(&altered))
                .unwrap_or_else(|| panic!("{table}.{column} is never re-collated"));
            assert!(
                line.contains(" collate latin1_general_100_bin2 not null"),
                "{line}"
            );
        }
        // The last definition of each dedupe key (constraint names unchanged).
        for (constraint, columns) in [
            ("pk_sb_inbox", "(consumer, message_id, message_id_bytes)"),
            (
                "pk_sb_inbox_business_key",
                "(consumer, business_key, business_key_bytes)",
            ),
            (
                "pk_sb_inbox_aggregate_version",
                "(consumer, aggregate, aggregate_bytes)",
            ),
            ("uq_sb_outbox_message_id", "(message_id, message_id_bytes)"),
        ] {
            let defined = format!("constraint {constraint}\n");
            let at = all
                .rfind(&defined)
                .unwrap_or_else(|| panic!("{constraint} is never re-created"));
            let definition = &all[at..all[at..].find(')').map_or(all.len(), |end| at + end + 1)];
            assert!(definition.ends_with(columns), "{definition}");
        }
    }
}
