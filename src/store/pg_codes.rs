//! PostgreSQL SQLSTATE codes to [`ErrorKind`], shared by the two PostgreSQL stores (`postgres` on
//! tokio-postgres, `sqlx-postgres` on sqlx): one table, whichever driver reports the code.
//!
//! Codes: <https://www.postgresql.org/docs/current/errcodes-appendix.html>.

use crate::ports::ErrorKind;
use crate::store::duplicate_scope;

/// The kind of the SQLSTATE `code` (with the constraint for unique violations).
pub(crate) fn kind_of_code(code: &str, constraint: Option<&str>) -> ErrorKind {
    match code {
        // unique_violation
        "23505" => constraint
            .and_then(duplicate_scope)
            .map_or(ErrorKind::UniqueViolation, ErrorKind::Duplicate),
        "23503" => ErrorKind::ForeignKeyViolation,
        // check_violation, exclusion_violation
        "23514" | "23P01" => ErrorKind::CheckViolation,
        "23502" => ErrorKind::NotNullViolation,
        // string_data_right_truncation
        "22001" => ErrorKind::Truncation,
        // serialization_failure, deadlock_detected
        "40001" | "40P01" => ErrorKind::Contention,
        // `lock_timeout` (55P03, a migration's `ACCESS EXCLUSIVE` lock) and `statement_timeout`
        // (57014, an overloaded server): one is contention, a run of them an outage (the kill
        // switch tells them apart).
        "55P03" | "57014" => ErrorKind::TimedOut,
        // The deployment, not the message: code rolled out before `migrate`, a missing grant
        // (42501 insufficient_privilege; 42P01, 42703, 42883, 42704: undefined table, column,
        // function, object; 3F000 invalid_schema_name). Also code rolled out before the
        // migration it needs: an `ON CONFLICT` whose unique index is not there yet (42P10), a
        // column whose type the migration changes (42804). Every message meets them alike until
        // `migrate` runs, so they are the deployment's (the kill switch pauses), not each
        // message's (dead-lettered one by one).
        "42501" | "42P01" | "42703" | "42883" | "42704" | "3F000" | "42P10" | "42804" => {
            ErrorKind::Deployment
        }
        // admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections,
        // read_only_sql_transaction
        "57P01" | "57P02" | "57P03" | "53300" | "25006" => ErrorKind::Unavailable,
        // Class 22: data exceptions (bad text representation, numeric out of range, …).
        _ if code.starts_with("22") => ErrorKind::Conversion,
        // Class 08: connection exceptions; 40: rollbacks.
        _ if code.starts_with("08") => ErrorKind::Connection,
        _ if code.starts_with("40") => ErrorKind::Contention,
        // Class 53, insufficient resources (53100 disk full, 53200 out of memory, 53400
        // configuration limit exceeded), and class 58, system errors outside PostgreSQL
        // (58030 I/O error): the server's, and every message meets them alike.
        _ if code.starts_with("53") || code.starts_with("58") => ErrorKind::Unavailable,
        // Class 42 otherwise: syntax and other statement errors; 23: other integrity violations.
        _ if code.starts_with("42") => ErrorKind::Schema,
        _ if code.starts_with("23") => ErrorKind::CheckViolation,
        _ => ErrorKind::Unknown,
    }
}
