use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;

use super::PropertyValue;

/// Which dedupe constraint a unique violation hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuplicateScope {
    /// The inbox key `(consumer, message_id)`: the broker redelivered the same message.
    Inbox,
    /// A business idempotency key `(consumer, key)`: another message for the same request.
    BusinessKey,
}

/// The portable meaning of a store error, derived by each store from its provider's error code
/// and, for unique violations, the constraint name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A unique violation of one of our dedupe constraints: the message was already handled.
    Duplicate(DuplicateScope),
    /// A unique violation of any other constraint. Permanent.
    UniqueViolation,
    /// A foreign-key violation. Permanent.
    ForeignKeyViolation,
    /// A check-constraint violation. Permanent.
    CheckViolation,
    /// A NOT NULL violation. Permanent.
    NotNullViolation,
    /// A value too long for its column. Permanent.
    Truncation,
    /// A value that cannot be converted to the column's type, or out of range. Permanent.
    Conversion,
    /// A statement the schema cannot run (missing table or column, permission). Permanent.
    Schema,
    /// Serialization failure, deadlock, lock timeout, busy database. Transient.
    Contention,
    /// Server shutting down, failover, throttling, too many connections. Transient.
    Unavailable,
    /// The connection broke or timed out. Transient; the connection is discarded.
    Connection,
    /// Anything not classified above. Treated as transient: the broker's max delivery count
    /// bounds the retries, then dead-letters the message with `MaxDeliveryCountExceeded`.
    Unknown,
}

impl ErrorKind {
    /// True when retrying the same message later may succeed.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::Contention
                | ErrorKind::Unavailable
                | ErrorKind::Connection
                | ErrorKind::Unknown
        )
    }

    /// True when no retry can succeed: the message must be dead-lettered.
    pub fn is_permanent(self) -> bool {
        !self.is_transient() && !matches!(self, ErrorKind::Duplicate(_))
    }

    /// A short stable name, used in dead-letter descriptions and telemetry.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Duplicate(DuplicateScope::Inbox) => "duplicate_inbox",
            ErrorKind::Duplicate(DuplicateScope::BusinessKey) => "duplicate_business_key",
            ErrorKind::UniqueViolation => "unique_violation",
            ErrorKind::ForeignKeyViolation => "foreign_key_violation",
            ErrorKind::CheckViolation => "check_violation",
            ErrorKind::NotNullViolation => "not_null_violation",
            ErrorKind::Truncation => "truncation",
            ErrorKind::Conversion => "conversion",
            ErrorKind::Schema => "schema",
            ErrorKind::Contention => "contention",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Connection => "connection",
            ErrorKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A store error: the portable [`ErrorKind`] plus the provider's code and constraint name.
///
/// The message is the provider's text for logs; classification never reads it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind} (code {code}{constraint_note}): {message}", code = self.code.as_deref().unwrap_or("none"), constraint_note = self.constraint.as_deref().map(|c| format!(", constraint {c}")).unwrap_or_default())]
pub struct StoreError {
    kind: ErrorKind,
    code: Option<String>,
    constraint: Option<String>,
    message: String,
}

impl StoreError {
    /// A classified error.
    pub fn new(
        kind: ErrorKind,
        code: Option<String>,
        constraint: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        StoreError {
            kind,
            code,
            constraint,
            message: message.into(),
        }
    }

    /// The portable kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The provider's error code (SQLSTATE, SQLite extended code, SQL Server error number).
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The violated constraint, when the provider names one.
    pub fn constraint(&self) -> Option<&str> {
        self.constraint.as_deref()
    }

    /// The provider's message, for logs only.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A description without the provider's message text (which may echo row values), safe to
    /// put in a dead-letter description.
    pub fn redacted(&self) -> String {
        let mut text = format!(
            "{} (code {}",
            self.kind,
            self.code.as_deref().unwrap_or("none")
        );
        if let Some(constraint) = &self.constraint {
            text.push_str(", constraint ");
            text.push_str(constraint);
        }
        text.push(')');
        text
    }
}

/// The result of checking an aggregate's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionCheck {
    /// The version was newer than the stored one (or the first seen) and is now stored.
    Advanced,
    /// The stored version is the same or newer: the message is stale.
    Stale {
        /// The version already stored.
        current: i64,
    },
}

/// A message written to the local outbox in the consumer's transaction.
///
/// The message id is fixed when the row is written, so every relay attempt publishes the same
/// id and downstream consumers recognise a republished copy as a duplicate.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// Stable message id (defaults to a new UUID).
    pub message_id: String,
    /// The queue or topic to publish to.
    pub destination: String,
    /// Subject (contract) of the outgoing message.
    pub subject: Option<String>,
    /// Correlation id of the outgoing message.
    pub correlation_id: Option<String>,
    /// Content type of the body.
    pub content_type: Option<String>,
    /// Application properties.
    pub application_properties: BTreeMap<String, PropertyValue>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl OutboxMessage {
    /// A JSON message for `destination` with a fresh stable id.
    pub fn new(destination: impl Into<String>, subject: impl Into<String>, body: Vec<u8>) -> Self {
        OutboxMessage {
            message_id: uuid::Uuid::new_v4().to_string(),
            destination: destination.into(),
            subject: Some(subject.into()),
            correlation_id: None,
            content_type: Some("application/json".to_owned()),
            application_properties: BTreeMap::new(),
            body,
        }
    }
}

/// An open database transaction with the inbox operations.
///
/// Dropping a transaction without [`Tx::commit`] rolls it back.
pub trait Tx: Send {
    /// Inserts the inbox row `(consumer, message_id)`. A repeat fails with
    /// [`ErrorKind::Duplicate`]`(`[`DuplicateScope::Inbox`]`)` once the first transaction commits.
    fn insert_inbox(
        &mut self,
        consumer: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Claims a business idempotency key; a key claimed before fails with
    /// [`ErrorKind::Duplicate`]`(`[`DuplicateScope::BusinessKey`]`)`.
    fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Stores `version` for `aggregate` if it is newer than the stored one.
    fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> impl Future<Output = Result<VersionCheck, StoreError>> + Send;
    /// Appends a message to the local outbox.
    fn append_outbox(
        &mut self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Commits.
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Rolls back.
    fn rollback(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A database that opens inbox transactions.
pub trait Store: Send + Sync + 'static {
    /// The transaction type handlers receive.
    type Tx: Tx;
    /// Opens a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;
}
