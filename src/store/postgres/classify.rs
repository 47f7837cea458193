//! PostgreSQL error classification by SQLSTATE and constraint name.
//!
//! Codes: <https://www.postgresql.org/docs/current/errcodes-appendix.html>.

use tokio_postgres::error::SqlState;

use crate::ports::{ErrorKind, StoreError};

/// Classifies a `tokio-postgres` error.
pub fn classify(error: tokio_postgres::Error) -> StoreError {
    let Some(db) = error.as_db_error() else {
        // No server answer: the socket broke, timed out or was closed.
        let kind = if error.is_closed() || std::error::Error::source(&error).is_some() {
            ErrorKind::Connection
        } else {
            ErrorKind::Unknown
        };
        // The cause (a refused certificate, a reset socket) is in the source chain.
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        return StoreError::of_kind(kind, message).with_source(error);
    };
    let code = db.code();
    let constraint = db.constraint().map(str::to_owned);
    let kind = kind_of(code, constraint.as_deref());
    let message = db.message().to_owned();
    StoreError::new(kind, Some(code.code().to_owned()), constraint, message).with_source(error)
}

/// The kind of a SQLSTATE (with the constraint for unique violations): the table both
/// PostgreSQL stores share (`store::pg_codes`).
pub(crate) fn kind_of(code: &SqlState, constraint: Option<&str>) -> ErrorKind {
    crate::store::pg_codes::kind_of_code(code.code(), constraint)
}

/// A handler's own SQL on [`crate::PgTx`] is classified like the runtime's: a deadlock is
/// transient, a check violation permanent, a unique violation of a business-key constraint a
/// duplicate. Here, beside the classifier, so the runtime never sees the driver's error.
impl From<tokio_postgres::Error> for crate::runtime::HandlerError {
    fn from(error: tokio_postgres::Error) -> Self {
        crate::runtime::HandlerError::Store(classify(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::DuplicateScope;

    /// The kill switch's classes: what fails every message alike (a missing grant or table, a
    /// read-only or starting or shutting-down server, too many connections, a broken
    /// connection), with near-misses tied to the message (contention, constraints, data,
    /// syntax, unknown).
    #[test]
    fn systemic_codes_and_near_misses() {
        let systemic = [
            "42501", "42P01", "42703", "3F000", "25006", "57P01", "57P02", "57P03", "53300",
            "53100", "53200", "53400", "58030", "08006", "08001",
        ];
        for code in systemic {
            let kind = kind_of(&SqlState::from_code(code), None);
            assert!(kind.is_systemic(), "{code} -> {kind}");
        }
        // Timeouts are not systemic one by one: the kill switch counts a run of them.
        for code in ["55P03", "57014"] {
            assert_eq!(
                kind_of(&SqlState::from_code(code), None),
                ErrorKind::TimedOut,
                "{code}"
            );
        }
        let near_misses = [
            "40001", "40P01", "55P03", "57014", "23505", "23503", "22P02", "42601", "XX000",
        ];
        for code in near_misses {
            let kind = kind_of(&SqlState::from_code(code), None);
            assert!(!kind.is_systemic(), "{code} -> {kind}");
        }
    }

    #[test]
    fn codes_and_constraints() {
        let unique = SqlState::UNIQUE_VIOLATION;
        assert_eq!(
            kind_of(&unique, Some("pk_sb_inbox")),
            ErrorKind::Duplicate(DuplicateScope::Inbox)
        );
        assert_eq!(
            kind_of(&unique, Some("pk_sb_inbox_business_key")),
            ErrorKind::Duplicate(DuplicateScope::BusinessKey)
        );
        assert_eq!(
            kind_of(&unique, Some("pk_sb_inbox_x")),
            ErrorKind::UniqueViolation
        );
        assert_eq!(kind_of(&unique, None), ErrorKind::UniqueViolation);
        let cases = [
            ("23503", ErrorKind::ForeignKeyViolation),
            ("23514", ErrorKind::CheckViolation),
            ("23502", ErrorKind::NotNullViolation),
            ("22001", ErrorKind::Truncation),
            ("22P02", ErrorKind::Conversion),
            ("22003", ErrorKind::Conversion),
            ("40001", ErrorKind::Contention),
            ("40P01", ErrorKind::Contention),
            ("55P03", ErrorKind::TimedOut),
            ("57014", ErrorKind::TimedOut),
            ("53100", ErrorKind::Unavailable),
            ("57P01", ErrorKind::Unavailable),
            ("53300", ErrorKind::Unavailable),
            ("08006", ErrorKind::Connection),
            ("42P01", ErrorKind::Deployment),
            ("42703", ErrorKind::Deployment),
            ("42501", ErrorKind::Deployment),
            ("42883", ErrorKind::Deployment),
            ("3F000", ErrorKind::Deployment),
            ("42P10", ErrorKind::Deployment),
            ("42804", ErrorKind::Deployment),
            ("42601", ErrorKind::Schema),
            ("XX000", ErrorKind::Unknown),
        ];
        for (code, kind) in cases {
            assert_eq!(kind_of(&SqlState::from_code(code), None), kind, "{code}");
        }
    }
}
