//! SQL Server error classification by error number and, for constraint errors, the constraint
//! or index name parsed from the message.
//!
//! SQL Server names the violated constraint only inside its message text. The messages are the
//! engine's fixed templates (every session runs `SET LANGUAGE us_english`, so they are never
//! localised), and the names sit in quotes, which are parsed exactly:
//!
//! - 2627: `Violation of UNIQUE KEY constraint 'NAME'. Cannot insert duplicate key in object
//!   'dbo.t'. The duplicate key value is (…).` (also `PRIMARY KEY constraint`)
//! - 2601: `Cannot insert duplicate key row in object 'dbo.t' with unique index 'NAME'. The
//!   duplicate key value is (…).`
//! - 547: `The INSERT statement conflicted with the FOREIGN KEY constraint "NAME". …` (also
//!   `CHECK constraint`, `REFERENCE constraint` and `SAME TABLE REFERENCE constraint`)
//!
//! The first marker wins: the name comes before the duplicate key value, which is row data and
//! may contain anything. A name is the whole quoted text, so `pk_sb_inbox` and
//! `pk_sb_inbox_business_key` never match each other; [`crate::store::duplicate_scope`] then
//! compares it exactly.
//!
//! # Transient error numbers
//!
//! [`TRANSIENT`] is the union of the lists Microsoft maintains for its own clients, read in
//! December 2026:
//!
//! - **EF Core** `SqlServerTransientExceptionDetector.ShouldRetryOn`
//!   (`src/EFCore.SqlServer/Storage/Internal/SqlServerTransientExceptionDetector.cs` in
//!   dotnet/efcore, used by `SqlServerRetryingExecutionStrategy` and the Azure SQL strategy);
//! - **Microsoft.Data.SqlClient** `SqlConfigurableRetryFactory.s_defaultTransientErrors`
//!   (`src/Microsoft.Data.SqlClient/src/Microsoft/Data/SqlClient/Reliability/
//!   SqlConfigurableRetryFactory.cs` in dotnet/SqlClient): 1204, 1205, 1222, 49918, 49919, 49920,
//!   4060, 4221, 40143, 40613, 40501, 40540, 40197, 42108, 42109, 10929, 10928, 10060, 997, 233;
//! - **Azure SQL resource governance** (the Transient Fault Handling block's
//!   `SqlDatabaseTransientErrorDetectionStrategy` and the Azure SQL "resource limit" error
//!   docs): 40544, 40549, 40550, 40551, 40552, 40553 — the session was ended for exceeding a
//!   limit (long transaction, locks, tempdb, log, memory, size quota). Retrying the message later
//!   is right: dead-lettering every message because the database is full would be worse, and the
//!   broker's max delivery count still bounds the retries.
//!
//! EF Core leaves out the client's `-2` (command timeout) because the command may have
//! completed; here a timeout is a client-side I/O error: the transaction was never committed by
//! us, the connection is evicted and the message abandoned, which is safe because the inbox row
//! makes a repeat a duplicate.
//!
//! Each number maps to [`ErrorKind::Contention`] (locks, deadlocks, version conflicts, plan or
//! schema races), [`ErrorKind::Connection`] (transport and login handshake; the connection is
//! evicted) or [`ErrorKind::Unavailable`] (failover, throttling, resource limits, database not
//! open).
//!
//! # Permanent error numbers
//!
//! | numbers | kind |
//! |---|---|
//! | 2627, 2601 on `pk_sb_inbox` / `pk_sb_inbox_business_key` | `Duplicate` |
//! | 2627, 2601 on anything else | `UniqueViolation` |
//! | 547 with `FOREIGN KEY` / `REFERENCE` | `ForeignKeyViolation` |
//! | 547 with `CHECK` | `CheckViolation` |
//! | 515 | `NotNullViolation` |
//! | 8152, 2628 | `Truncation` |
//! | 245, 8114, 8115, 220, 241, 242, 248, 295 | `Conversion` |
//! | 2714, 102, 156 | `Schema` |
//!
//! 207, 208 (invalid column or object name: code rolled out before `migrate`) and 229, 230,
//! 262 (permission denied: a missing grant) are [`ErrorKind::Deployment`]: transient, since
//! they are not the message's fault. 3906 (the database is read-only: a failover to a
//! secondary) is [`ErrorKind::Unavailable`].
//!
//! # Systemic numbers
//!
//! [`ErrorKind::is_systemic`] kinds fail every message alike and trip the runtime's kill
//! switch: `Deployment` (207, 208, 229, 230, 262), `Unavailable` (3906, throttling 40501,
//! 10928, 10929, failover 40613, 40197, 49918–49920, 4060, …) and `Connection` (233, 10053,
//! 10054, …, severity 20 and above). Contention (1205, 1222, 3960, …) and the permanent
//! numbers are tied to the message and never trip it. Resource exhaustion (9002 log full, 1105
//! filegroup full, 701 out of memory) is `Unavailable`; 1222 (lock timeout) is
//! [`ErrorKind::TimedOut`], which the kill switch counts only as a run. [`crate::store::mssql::TX_ENDED`] from the transaction's
//! statement guard is [`ErrorKind::Unknown`] (transient).
//! | ≥ 50000 (user `RAISERROR`/`THROW`) | `CheckViolation`: a rule the database enforces on the data |
//!
//! Anything else is [`ErrorKind::Unknown`] (transient), except that an error of severity 20 or
//! more, after which the server closes the connection, is [`ErrorKind::Connection`].

use tiberius::error::Error;

use crate::ports::{ErrorKind, StoreError};
use crate::store::duplicate_scope;

/// The error number the statement guard raises when the transaction has ended on the server
/// (`@@TRANCOUNT` is 0): the statement does not run. Defined here, with the other numbers this
/// module classifies, so that the transaction (which raises it) imports the classifier and not
/// the other way round.
pub const TX_ENDED: u32 = 59_317;

/// Error numbers after which retrying the same work later may succeed; see the module docs for
/// the sources. Sorted, for the binary search.
pub const TRANSIENT: &[u32] = &[
    20, 64, 121, 203, 233, 539, 601, 615, 617, 669, 921, 926, 927, 941, 952, 982, 988, 997, 1203,
    1204, 1205, 1215, 1216, 1221, 1222, 1232, 1404, 1413, 1421, 1438, 1532, 1533, 1534, 1535, 1807,
    2021, 2816, 3429, 3635, 3935, 3941, 3947, 3948, 3950, 3953, 3957, 3960, 3966, 3980, 4060, 4117,
    4184, 4221, 5280, 5529, 6292, 7951, 8628, 8645, 8651, 9020, 9515, 9985, 10053, 10054, 10060,
    10922, 10928, 10929, 10930, 10936, 11001, 11539, 14355, 14817, 14868, 14906, 16528, 16554,
    16555, 17065, 17066, 17067, 17197, 17889, 18401, 18858, 19413, 19416, 19494, 20041, 21503,
    22225, 22226, 22335, 22353, 22355, 22358, 22427, 22430, 22491, 22493, 22498, 22754, 22758,
    22759, 22760, 22984, 25003, 25738, 25740, 30080, 30085, 33123, 35216, 35218, 35256, 35293,
    37202, 37327, 39025, 39108, 39110, 39151, 39152, 40106, 40143, 40189, 40197, 40501, 40540,
    40544, 40549, 40550, 40551, 40552, 40553, 40613, 40623, 40642, 40648, 40671, 40675, 40890,
    40903, 40918, 40938, 41301, 41302, 41305, 41325, 41339, 41383, 41614, 41619, 41640, 41700,
    41701, 41823, 41839, 41840, 42029, 42108, 42109, 45153, 45156, 45157, 45161, 45179, 45182,
    45319, 45547, 47132, 47137, 47139, 49510, 49802, 49918, 49919, 49920, 49977, 49983,
];

/// Transient numbers that mean lock or version contention, or a race with a concurrent schema
/// or plan change: retry the transaction.
const CONTENTION: &[u32] = &[
    539, 601, 617, 669, 1203, 1204, 1205, 1215, 1216, 1221, 1222, 1232, 1532, 1533, 1534, 1535,
    1807, 2021, 2816, 3635, 3941, 3947, 3948, 3950, 3953, 3957, 3960, 3966, 4117, 4184, 6292, 8628,
    8645, 8651, 9515, 11539, 40106, 41301, 41302, 41305, 41325, 41339, 41383, 41839,
];

/// Transient numbers that mean the transport or login handshake failed: evict the connection.
const CONNECTION: &[u32] = &[
    20, 64, 121, 203, 233, 997, 3980, 10053, 10054, 10060, 11001, 17197, 17889,
];

/// `ErrorKind::Duplicate` and `UniqueViolation` numbers: unique constraint and unique index.
const UNIQUE_CONSTRAINT: u32 = 2627;
const UNIQUE_INDEX: u32 = 2601;
/// FOREIGN KEY, REFERENCE and CHECK constraint conflicts share one number.
const CONSTRAINT_CONFLICT: u32 = 547;
/// The first number of user-defined messages (`RAISERROR`, `THROW`).
const USER_DEFINED: u32 = 50000;
/// The database is read-only (a failover or a readable secondary).
const READ_ONLY: u32 = 3906;
/// The transaction log is full.
const RESOURCE_EXHAUSTED_LOG: u32 = 9002;
/// A filegroup (the data files) is full.
const RESOURCE_EXHAUSTED_FILEGROUP: u32 = 1105;
/// The server is out of memory.
const RESOURCE_EXHAUSTED_MEMORY: u32 = 701;
/// A lock wait ran past the session's `LOCK_TIMEOUT`.
const LOCK_TIMEOUT: u32 = 1222;
/// From this severity on the server closes the connection after the error.
const FATAL_SEVERITY: u8 = 20;

/// Classifies a tiberius error.
pub fn classify(error: Error) -> StoreError {
    let classified = match &error {
        Error::Server(token) => {
            let (kind, constraint) = server_kind(token.code(), token.class(), token.message());
            StoreError::new(
                kind,
                Some(token.code().to_string()),
                constraint,
                token.message().to_owned(),
            )
        }
        _ => StoreError::of_kind(client_kind(&error), error.to_string()),
    };
    classified.with_source(error)
}

/// True when the connection that returned `error` must not be reused: the transport failed or
/// timed out (the response may be half read), the TLS layer failed, the byte stream is out of
/// sync, or the server ended the session (severity 20 and above).
pub fn breaks_connection(error: &Error) -> bool {
    match error {
        Error::Server(token) => {
            token.class() >= FATAL_SEVERITY || CONNECTION.binary_search(&token.code()).is_ok()
        }
        Error::Io { .. } | Error::Tls(_) | Error::Protocol(_) | Error::Encoding(_) => true,
        _ => false,
    }
}

/// The kind of an error the client raised itself.
fn client_kind(error: &Error) -> ErrorKind {
    match error {
        // Reset, refused, timed out (tiberius's command timeout is an I/O `TimedOut`): the
        // connection is gone or out of sync.
        Error::Io { .. } | Error::Tls(_) | Error::Protocol(_) | Error::Encoding(_) => {
            ErrorKind::Connection
        }
        // Handled by the connection manager; one that escapes it means the gateway kept
        // redirecting.
        Error::Routing { .. } => ErrorKind::Unavailable,
        Error::Conversion(_)
        | Error::Utf8
        | Error::Utf16
        | Error::ParseInt(_)
        | Error::BulkInput(_) => ErrorKind::Conversion,
        _ => ErrorKind::Unknown,
    }
}

/// The kind of a server error, with the constraint or index name for constraint errors.
pub(crate) fn server_kind(code: u32, severity: u8, message: &str) -> (ErrorKind, Option<String>) {
    match code {
        UNIQUE_CONSTRAINT | UNIQUE_INDEX => {
            let marker = if code == UNIQUE_CONSTRAINT {
                " constraint '"
            } else {
                " with unique index '"
            };
            let name = quoted_after(message, marker, '\'');
            let kind = name
                .and_then(duplicate_scope)
                .map_or(ErrorKind::UniqueViolation, ErrorKind::Duplicate);
            (kind, name.map(str::to_owned))
        }
        CONSTRAINT_CONFLICT => {
            let name = quoted_after(message, " constraint \"", '"').map(str::to_owned);
            let kind = if message.contains(" CHECK constraint \"") {
                ErrorKind::CheckViolation
            } else if message.contains(" FOREIGN KEY constraint \"")
                || message.contains(" REFERENCE constraint \"")
            {
                ErrorKind::ForeignKeyViolation
            } else {
                // 547 is only ever raised for these constraints; an unparseable message is
                // still a constraint conflict on the data, so it is permanent.
                ErrorKind::CheckViolation
            };
            (kind, name)
        }
        515 => (ErrorKind::NotNullViolation, None),
        8152 | 2628 => (ErrorKind::Truncation, None),
        245 | 8114 | 8115 | 220 | 241 | 242 | 248 | 295 => (ErrorKind::Conversion, None),
        // The transaction ended on the server before this statement (`MssqlTx`'s guard).
        TX_ENDED if message.starts_with("sb-inbox: ") => (ErrorKind::Unknown, None),
        // Invalid object or column name, permission denied: the deployment, not the message.
        207 | 208 | 229 | 230 | 262 => (ErrorKind::Deployment, None),
        // "Failed to update database because the database is read-only": a failover (or a
        // geo-replica) left the connection on a read-only secondary. Not in Microsoft's
        // transient lists (the client cannot tell a replica it chose from one it was moved
        // to), but it fails every message alike until the primary is back.
        READ_ONLY => (ErrorKind::Unavailable, None),
        // Out of a resource the whole database shares: 9002 "The transaction log for database
        // is full", 1105 "Could not allocate space … because the filegroup is full", 701
        // "There is insufficient system memory". In none of Microsoft's transient lists (a
        // retry within the same operation does not help), but every message meets them alike
        // until an operator acts: the kill switch's business, not a dead letter per message.
        RESOURCE_EXHAUSTED_LOG | RESOURCE_EXHAUSTED_FILEGROUP | RESOURCE_EXHAUSTED_MEMORY => {
            (ErrorKind::Unavailable, None)
        }
        // "Lock request time out period exceeded" (`SET LOCK_TIMEOUT`): contention once, an
        // outage when every transaction meets it (a migration's schema lock).
        LOCK_TIMEOUT => (ErrorKind::TimedOut, None),
        2714 | 102 | 156 => (ErrorKind::Schema, None),
        _ if TRANSIENT.binary_search(&code).is_ok() => (transient_kind(code), None),
        _ if code >= USER_DEFINED => (ErrorKind::CheckViolation, None),
        _ if severity >= FATAL_SEVERITY => (ErrorKind::Connection, None),
        _ => (ErrorKind::Unknown, None),
    }
}

/// The kind of a number in [`TRANSIENT`].
fn transient_kind(code: u32) -> ErrorKind {
    if CONTENTION.binary_search(&code).is_ok() {
        ErrorKind::Contention
    } else if CONNECTION.binary_search(&code).is_ok() {
        ErrorKind::Connection
    } else {
        ErrorKind::Unavailable
    }
}

/// The text between `quote`s right after the first `marker` (which ends with the opening quote).
fn quoted_after<'a>(message: &'a str, marker: &str, quote: char) -> Option<&'a str> {
    let start = message.find(marker)? + marker.len();
    let rest = &message[start..];
    let end = rest.find(quote)?;
    let name = &rest[..end];
    (!name.is_empty()).then_some(name)
}

/// A handler's own SQL on [`crate::MssqlTx`] is classified like the runtime's (see the
/// PostgreSQL conversion).
impl From<tiberius::error::Error> for crate::runtime::HandlerError {
    fn from(error: tiberius::error::Error) -> Self {
        crate::runtime::HandlerError::Store(classify(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::DuplicateScope;
    use tiberius::error::IoErrorKind;

    fn kind(code: u32, message: &str) -> ErrorKind {
        server_kind(code, 16, message).0
    }

    fn unique_constraint(name: &str) -> String {
        format!(
            "Violation of UNIQUE KEY constraint '{name}'. Cannot insert duplicate key in object \
             'dbo.sb_inbox'. The duplicate key value is (c, m-1)."
        )
    }

    fn unique_index(name: &str) -> String {
        format!(
            "Cannot insert duplicate key row in object 'dbo.sb_inbox' with unique index '{name}'. \
             The duplicate key value is (c, m-1)."
        )
    }

    #[test]
    fn lists_are_sorted_and_consistent() {
        for list in [TRANSIENT, CONTENTION, CONNECTION] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
        for code in CONTENTION {
            assert!(TRANSIENT.contains(code), "{code}");
        }
        for code in CONNECTION {
            assert!(TRANSIENT.contains(code), "{code}");
        }
    }

    #[test]
    fn unique_violations_match_our_names_exactly() {
        let inbox = ErrorKind::Duplicate(DuplicateScope::Inbox);
        let business = ErrorKind::Duplicate(DuplicateScope::BusinessKey);
        assert_eq!(kind(2627, &unique_constraint("pk_sb_inbox")), inbox);
        assert_eq!(
            kind(2627, &unique_constraint("pk_sb_inbox_business_key")),
            business
        );
        assert_eq!(kind(2601, &unique_index("pk_sb_inbox")), inbox);
        assert_eq!(
            kind(2601, &unique_index("pk_sb_inbox_business_key")),
            business
        );
        let primary = "Violation of PRIMARY KEY constraint 'pk_sb_inbox'. Cannot insert duplicate \
                       key in object 'dbo.sb_inbox'. The duplicate key value is (c, m-1).";
        assert_eq!(
            server_kind(2627, 14, primary),
            (inbox, Some("pk_sb_inbox".into()))
        );
        // Prefixes, extensions and case variants are someone else's constraints.
        for other in [
            "pk_sb_inbox_x",
            "pk_sb_inbo",
            "pk_sb_inbox_business",
            "pk_sb_inbox_business_key2",
            "PK_SB_INBOX",
            "pk_sb_inbox_aggregate_version",
            "uq_sb_outbox_message_id",
        ] {
            for (code, message) in [
                (2627, unique_constraint(other)),
                (2601, unique_index(other)),
            ] {
                let (kind, name) = server_kind(code, 14, &message);
                assert_eq!(kind, ErrorKind::UniqueViolation, "{code} {other}");
                assert_eq!(name.as_deref(), Some(other));
                assert!(kind.is_permanent());
            }
        }
    }

    #[test]
    fn the_name_is_parsed_before_the_row_data() {
        // A key value that quotes our constraint name does not make the violation ours.
        let message = "Violation of UNIQUE KEY constraint 'uq_other'. Cannot insert duplicate key \
                       in object 'dbo.t'. The duplicate key value is (x constraint 'pk_sb_inbox').";
        assert_eq!(
            server_kind(2627, 14, message),
            (ErrorKind::UniqueViolation, Some("uq_other".into()))
        );
        let message = "Cannot insert duplicate key row in object 'dbo.t' with unique index \
                       'ix_other'. The duplicate key value is (with unique index 'pk_sb_inbox').";
        assert_eq!(kind(2601, message), ErrorKind::UniqueViolation);
        // No name at all: still a unique violation, never a duplicate.
        assert_eq!(
            server_kind(2627, 14, "Violation of constraint."),
            (ErrorKind::UniqueViolation, None)
        );
        assert_eq!(
            kind(2627, "Violation of UNIQUE KEY constraint ''."),
            ErrorKind::UniqueViolation
        );
    }

    #[test]
    fn constraint_conflicts() {
        let fk = "The INSERT statement conflicted with the FOREIGN KEY constraint \
                  \"fk_inventory_reservation_line_reservation\". The conflict occurred in database \
                  \"t\", table \"dbo.inventory_reservation\", column 'order_id'.";
        assert_eq!(
            server_kind(547, 16, fk),
            (
                ErrorKind::ForeignKeyViolation,
                Some("fk_inventory_reservation_line_reservation".into())
            )
        );
        let reference = "The DELETE statement conflicted with the REFERENCE constraint \
                         \"fk_x\". The conflict occurred in database \"t\", table \"dbo.y\".";
        assert_eq!(kind(547, reference), ErrorKind::ForeignKeyViolation);
        let same = "The UPDATE statement conflicted with the SAME TABLE REFERENCE constraint \
                    \"fk_self\".";
        assert_eq!(kind(547, same), ErrorKind::ForeignKeyViolation);
        let check = "The INSERT statement conflicted with the CHECK constraint \
                     \"ck_inventory_reservation_line_quantity\". The conflict occurred in database \
                     \"t\", table \"dbo.inventory_reservation_line\", column 'quantity'.";
        assert_eq!(
            server_kind(547, 16, check),
            (
                ErrorKind::CheckViolation,
                Some("ck_inventory_reservation_line_quantity".into())
            )
        );
    }

    #[test]
    fn permanent_numbers() {
        let cases = [
            (515, ErrorKind::NotNullViolation),
            (8152, ErrorKind::Truncation),
            (2628, ErrorKind::Truncation),
            (245, ErrorKind::Conversion),
            (8114, ErrorKind::Conversion),
            (8115, ErrorKind::Conversion),
            (220, ErrorKind::Conversion),
            (241, ErrorKind::Conversion),
            (242, ErrorKind::Conversion),
            (248, ErrorKind::Conversion),
            (295, ErrorKind::Conversion),
            (2714, ErrorKind::Schema),
            (102, ErrorKind::Schema),
            (156, ErrorKind::Schema),
            (50000, ErrorKind::CheckViolation),
            (50001, ErrorKind::CheckViolation),
            (2_147_483_647, ErrorKind::CheckViolation),
        ];
        for (code, expected) in cases {
            assert_eq!(kind(code, "x"), expected, "{code}");
            assert!(expected.is_permanent(), "{code}");
        }
    }

    /// The kill switch's classes: what fails every message alike, with near-misses that must
    /// not trip it (contention, constraint and data errors, user rules, unknown numbers).
    #[test]
    fn systemic_numbers_and_near_misses() {
        let systemic = [
            207, 208, 229, 230, 262, 3906, 40501, 40613, 40197, 49918, 49919, 49920, 10928, 10929,
            4060, 233, 10054, 9002, 1105, 701,
        ];
        for code in systemic {
            assert!(
                kind(code, "x").is_systemic(),
                "{code} -> {}",
                kind(code, "x")
            );
        }
        assert!(
            server_kind(596, 21, "session in the kill state")
                .0
                .is_systemic()
        );
        let near_misses = [
            1205, 1222, 3960, 547, 2627, 2601, 515, 8152, 245, 102, 50000, 3907, 3905,
        ];
        for code in near_misses {
            assert!(
                !kind(code, "x").is_systemic(),
                "{code} -> {}",
                kind(code, "x")
            );
        }
        assert_eq!(kind(3906, "x"), ErrorKind::Unavailable);
        // Log full, filegroup full, out of memory: the database's, for every message alike.
        for code in [9002, 1105, 701] {
            assert_eq!(kind(code, "x"), ErrorKind::Unavailable, "{code}");
        }
        // A lock timeout alone is not systemic; the kill switch counts a run of them.
        assert_eq!(kind(1222, "x"), ErrorKind::TimedOut);
    }

    #[test]
    fn deployment_errors_are_transient() {
        for code in [207, 208, 229, 230, 262] {
            let kind = kind(code, "x");
            assert_eq!(kind, ErrorKind::Deployment, "{code}");
            assert!(kind.is_transient(), "{code}");
        }
    }

    #[test]
    fn the_statement_guard_is_transient() {
        let message = "sb-inbox: the transaction has ended on the server; statement refused";
        assert_eq!(kind(TX_ENDED, message), ErrorKind::Unknown);
        // A user's THROW of the same number stays a rule the database enforces.
        assert_eq!(kind(TX_ENDED, "x"), ErrorKind::CheckViolation);
    }

    #[test]
    fn every_listed_transient_number_is_transient() {
        for &code in TRANSIENT {
            let (kind, constraint) = server_kind(code, 16, "x");
            assert!(kind.is_transient(), "{code} -> {kind}");
            assert_ne!(kind, ErrorKind::Unknown, "{code} is classified explicitly");
            assert_eq!(constraint, None);
        }
        // The numbers named in issue 6, each with its kind.
        let named = [
            (1205, ErrorKind::Contention),
            (1222, ErrorKind::TimedOut),
            (1204, ErrorKind::Contention),
            (617, ErrorKind::Contention),
            (669, ErrorKind::Contention),
            (40613, ErrorKind::Unavailable),
            (40197, ErrorKind::Unavailable),
            (40501, ErrorKind::Unavailable),
            (49918, ErrorKind::Unavailable),
            (49919, ErrorKind::Unavailable),
            (49920, ErrorKind::Unavailable),
            (10928, ErrorKind::Unavailable),
            (10929, ErrorKind::Unavailable),
            (4060, ErrorKind::Unavailable),
            (40143, ErrorKind::Unavailable),
            (4221, ErrorKind::Unavailable),
            (18401, ErrorKind::Unavailable),
            (40540, ErrorKind::Unavailable),
            (40544, ErrorKind::Unavailable),
            (40549, ErrorKind::Unavailable),
            (40550, ErrorKind::Unavailable),
            (40551, ErrorKind::Unavailable),
            (40552, ErrorKind::Unavailable),
            (40553, ErrorKind::Unavailable),
            (42108, ErrorKind::Unavailable),
            (42109, ErrorKind::Unavailable),
            (233, ErrorKind::Connection),
            (10053, ErrorKind::Connection),
            (10054, ErrorKind::Connection),
            (10060, ErrorKind::Connection),
            (64, ErrorKind::Connection),
            (20, ErrorKind::Connection),
            (121, ErrorKind::Connection),
        ];
        for (code, expected) in named {
            assert!(TRANSIENT.contains(&code), "{code} is listed");
            assert_eq!(kind(code, "x"), expected, "{code}");
        }
    }

    #[test]
    fn unknown_and_fatal() {
        assert_eq!(kind(3902, "x"), ErrorKind::Unknown);
        assert!(ErrorKind::Unknown.is_transient());
        // Severity 20+: the server ends the session.
        assert_eq!(server_kind(596, 21, "x").0, ErrorKind::Connection);
    }

    #[test]
    fn client_errors() {
        let io = Error::Io {
            kind: IoErrorKind::ConnectionReset,
            message: "reset".into(),
        };
        assert!(breaks_connection(&io));
        let error = classify(io);
        assert_eq!(error.kind(), ErrorKind::Connection);
        assert_eq!(error.code(), None);
        let timeout = Error::Io {
            kind: IoErrorKind::TimedOut,
            message: "command timed out".into(),
        };
        assert!(breaks_connection(&timeout));
        assert_eq!(classify(timeout).kind(), ErrorKind::Connection);
        let tls = Error::Tls("handshake".into());
        assert!(breaks_connection(&tls));
        assert_eq!(classify(tls).kind(), ErrorKind::Connection);
        let protocol = Error::Protocol("bad token".into());
        assert!(breaks_connection(&protocol));
        let conversion = Error::Conversion("not an int".into());
        assert!(!breaks_connection(&conversion));
        assert_eq!(classify(conversion).kind(), ErrorKind::Conversion);
        let routing = Error::Routing {
            host: "h".into(),
            port: 1,
        };
        assert!(!breaks_connection(&routing));
        assert_eq!(classify(routing).kind(), ErrorKind::Unavailable);
    }
}
