//! The per-connection cache of prepared statements: every statement a [`super::PgTx`] runs,
//! the handler's included, is parsed and planned once per connection and then only bound and
//! executed (one round trip instead of two, and no parse each time).
//!
//! The cache is bounded ([`CAPACITY`], sqlx's default): a handler that builds SQL text with
//! literals in it evicts the least recently used statement, and dropping the last handle to a
//! `tokio_postgres::Statement` closes it on the server, so nothing piles up there either.
//!
//! A cached statement can go stale when the schema changes under it: PostgreSQL re-plans it by
//! itself, except when its result columns changed ("cached plan must not change result type",
//! 0A000) or the server no longer knows the statement (26000, after `DISCARD ALL` or a pooler
//! handing the session on). Like the drivers that cache (pgx invalidates the statement of a
//! failed query, npgsql re-prepares after 0A000), the store forgets that statement and reports
//! the error, which is transient ([`crate::ErrorKind::Unknown`]): the transaction is aborted
//! either way, and the retry prepares it afresh.

use std::collections::HashMap;

use tokio_postgres::Statement;

use crate::ports::StoreError;

/// Statements kept per connection (sqlx's `statement_cache_capacity` default).
pub(crate) const CAPACITY: usize = 100;

/// SQLSTATEs that mean a cached statement must be prepared again: 0A000
/// (feature_not_supported: "cached plan must not change result type") and 26000
/// (invalid_sql_statement_name: "prepared statement … does not exist").
const STALE: [&str; 2] = ["0A000", "26000"];

/// Prepared statements by SQL text, least recently used evicted first. (Generic only so the
/// eviction can be tested without a server.)
#[derive(Debug)]
pub(crate) struct StatementCache<S = Statement> {
    entries: HashMap<String, (S, u64)>,
    /// A counter, not a clock: the last use of each entry.
    tick: u64,
}

impl<S> Default for StatementCache<S> {
    fn default() -> Self {
        StatementCache {
            entries: HashMap::new(),
            tick: 0,
        }
    }
}

impl<S: Clone> StatementCache<S> {
    /// The cached statement for `sql`, marked as just used.
    pub(crate) fn get(&mut self, sql: &str) -> Option<S> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(sql).map(|(statement, used)| {
            *used = tick;
            statement.clone()
        })
    }

    /// Keeps `statement` for `sql`, evicting the least recently used one when full.
    pub(crate) fn insert(&mut self, sql: &str, statement: S) {
        if self.entries.len() >= CAPACITY
            && !self.entries.contains_key(sql)
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(sql, _)| sql.clone())
        {
            self.entries.remove(&oldest);
        }
        self.tick += 1;
        self.entries.insert(sql.to_owned(), (statement, self.tick));
    }

    /// Forgets the statement for `sql` when `error` says it is stale; true if it did.
    pub(crate) fn invalidate(&mut self, sql: &str, error: &StoreError) -> bool {
        let stale = error.code().is_some_and(|code| STALE.contains(&code));
        if stale && self.entries.remove(sql).is_some() {
            tracing::info!(
                code = error.code(),
                "A cached statement went stale; it is prepared again on its next use."
            );
            return true;
        }
        false
    }

    /// How many statements are cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ErrorKind;

    fn error(code: &str) -> StoreError {
        StoreError::new(ErrorKind::Unknown, Some(code.into()), None, "x")
    }

    #[test]
    fn bounded_least_recently_used_goes_first() {
        let mut cache = StatementCache::<usize>::default();
        for i in 0..CAPACITY {
            cache.insert(&format!("SELECT {i}"), i);
        }
        // Used again: now the most recent.
        assert_eq!(cache.get("SELECT 0"), Some(0));
        cache.insert("SELECT new", CAPACITY);
        assert_eq!(cache.len(), CAPACITY, "bounded");
        assert_eq!(cache.get("SELECT 0"), Some(0), "recently used, kept");
        assert_eq!(cache.get("SELECT 1"), None, "least recently used, evicted");
        assert_eq!(cache.get("SELECT new"), Some(CAPACITY));
        // Replacing an entry evicts nothing.
        cache.insert("SELECT 2", 2);
        assert_eq!(cache.len(), CAPACITY);
    }

    #[test]
    fn only_stale_statement_errors_invalidate() {
        let mut cache = StatementCache::<usize>::default();
        cache.insert("SELECT 1", 1);
        for code in ["23505", "25P02", "40P01", "57014"] {
            assert!(!cache.invalidate("SELECT 1", &error(code)), "{code}");
        }
        assert_eq!(cache.get("SELECT 1"), Some(1));
        assert!(cache.invalidate("SELECT 1", &error("0A000")));
        assert_eq!(cache.get("SELECT 1"), None);
        cache.insert("SELECT 1", 1);
        assert!(cache.invalidate("SELECT 1", &error("26000")));
        assert!(
            !cache.invalidate("SELECT 1", &error("26000")),
            "gone already"
        );
    }
}
