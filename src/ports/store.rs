//! The transactional store port: [`Store`] opens a [`Tx`] with the inbox operations; store
//! errors carry a portable [`ErrorKind`].

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::PropertyValue;

/// Which dedupe constraint a unique violation hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuplicateScope {
    /// The inbox key `(consumer, logical id)`: the broker redelivered the same message.
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
    /// A statement no schema can run (syntax), or a savepoint the transaction does not hold.
    /// Permanent.
    Schema,
    /// A store address, option or credential setting that does not parse or is not supported
    /// (found before any statement runs). Permanent.
    Configuration,
    /// The deployment does not match the code: a missing table or column (code rolled out
    /// before `migrate`), a missing grant, a read-only database. Not the message's fault:
    /// transient, and the runtime reports the store unhealthy while it persists.
    Deployment,
    /// Serialization failure or deadlock: two transactions met over the same rows. Tied to the
    /// message's moment, not the store's health. Transient.
    Contention,
    /// A statement or a lock wait ran past the bound the database enforces (PostgreSQL's
    /// `lock_timeout` and `statement_timeout`, SQL Server's `LOCK_TIMEOUT`, SQLite's busy
    /// timeout). One alone is contention; many in a row are an outage every message meets
    /// alike (a migration's table lock, an overloaded server), so the kill switch counts them
    /// against the store. Transient.
    TimedOut,
    /// Server shutting down, failover, throttling, too many connections, or out of a resource
    /// (disk, transaction log, memory). Transient.
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
                | ErrorKind::TimedOut
                | ErrorKind::Deployment
                | ErrorKind::Unavailable
                | ErrorKind::Connection
                | ErrorKind::Unknown
        )
    }

    /// True when the failure is not the message's but the store's, and every message would
    /// meet it alike: the store unavailable (failover, shutdown, throttling, read-only), the
    /// connection gone, or the deployment wrong (a missing grant, table or column). The
    /// runtime's kill switch counts these; each store maps its provider's codes to these kinds
    /// in its `classify` module.
    pub fn is_systemic(self) -> bool {
        matches!(
            self,
            ErrorKind::Deployment | ErrorKind::Unavailable | ErrorKind::Connection
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
            ErrorKind::Configuration => "configuration",
            ErrorKind::Deployment => "deployment",
            ErrorKind::Contention => "contention",
            ErrorKind::TimedOut => "timed_out",
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

/// A store error: the portable [`ErrorKind`] plus the provider's code and constraint name,
/// and the driver's error kept whole as the `source` (as sqlx's `Error::Database` does).
///
/// The message is the provider's text for logs; classification never reads it. Neither the
/// message nor [`StoreError::redacted`] ever holds a connection string or a password.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{refused_note}{kind} (code {code}{constraint_note}): {message}", refused_note = if self.refused { "refused, the transaction failed earlier: " } else { "" }, code = self.code.as_deref().unwrap_or("none"), constraint_note = self.constraint.as_deref().map(|c| format!(", constraint {c}")).unwrap_or_default())]
pub struct StoreError {
    kind: ErrorKind,
    code: Option<String>,
    constraint: Option<String>,
    message: String,
    refused: bool,
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
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
            refused: false,
            source: None,
        }
    }

    /// An error of `kind` with no provider code or constraint: one the store (or its pool)
    /// raises itself rather than the database.
    pub fn of_kind(kind: ErrorKind, message: impl Into<String>) -> Self {
        StoreError::new(kind, None, None, message)
    }

    /// A store address, option or credential setting that cannot be used
    /// ([`ErrorKind::Configuration`]).
    pub fn configuration(message: impl Into<String>) -> Self {
        StoreError::of_kind(ErrorKind::Configuration, message)
    }

    /// A connection that broke, timed out or could not be made ([`ErrorKind::Connection`]).
    pub fn connection(message: impl Into<String>) -> Self {
        StoreError::of_kind(ErrorKind::Connection, message)
    }

    /// Keeps the driver's `error` as this error's `source`.
    #[must_use]
    pub fn with_source(mut self, error: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(error));
        self
    }

    /// The error a transaction answers to every statement and to the commit after `first`
    /// failed: the same kind, code and constraint, so a handler that propagates it settles the
    /// message exactly as if it had propagated `first`.
    pub fn refused(first: &StoreError) -> Self {
        StoreError {
            refused: true,
            ..first.clone()
        }
    }

    /// True when the transaction refused the statement or the commit because an earlier
    /// statement failed ([`StoreError::refused`]): nothing ran, nothing is committed.
    pub fn is_refused(&self) -> bool {
        self.refused
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
            "{}{} (code {}",
            if self.refused { "refused after " } else { "" },
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

/// A dead-letter verdict recorded as a message's inbox row (issue 41): the runtime writes it,
/// under the inbox constraint, before it dead-letters a message for what the message's
/// delivery history decided (its delayed retries spent, its panics counted out). A twin
/// delivery of the same message (a delayed retry's copy beside its original whose completion
/// failed) then meets the row and is dead-lettered too instead of taking effect: one logical
/// message, one outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The dead-letter reason (`RetriesExhausted`, `HandlerPanicked`).
    pub reason: String,
    /// The resubmission count of the delivery that decided it (0 before any resubmission): a
    /// later resubmission may take the verdict over ([`StoreTx::take_over_verdict`]).
    pub resubmission: i64,
}

/// What a message's inbox row records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxEntry {
    /// A delivery of the message committed its work.
    Processed,
    /// The message was dead-lettered with this verdict.
    DeadLettered(Verdict),
}

/// A message written to the local outbox in the consumer's transaction.
///
/// The message id is fixed when the row is written, so every relay attempt publishes the same
/// id and downstream consumers recognise a republished copy as a duplicate.
///
/// Besides the body and subject it carries what the Service Bus SDKs send on a
/// `ServiceBusMessage`: a session id (required by session-enabled entities), a partition key, a
/// scheduled enqueue time, a time-to-live, and the `to`, `reply-to` and correlation id
/// properties. Each is a column of `sb_outbox` and goes out on the published message.
///
/// # Examples
/// ```
/// use std::time::{Duration, SystemTime};
/// use sb_inbox::OutboxMessage;
/// let message = OutboxMessage::new("shipments", "shipping.ship-order.v1", br#"{"orderId":"o-1"}"#.to_vec())
///     .with_session_id("o-1")
///     .with_time_to_live(Duration::from_secs(3600))
///     .with_scheduled_enqueue_time(SystemTime::now() + Duration::from_secs(60))
///     .with_correlation_id("o-1")
///     .with_reply_to("shipping-replies")
///     .with_property("tenant", "contoso");
/// assert_eq!(message.session_id.as_deref(), Some("o-1"));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
    /// Application properties. Doubles must be finite: `append_outbox` refuses NaN and ±∞
    /// (JSON, the column's encoding, has no spelling for them).
    pub application_properties: BTreeMap<String, PropertyValue>,
    /// Body bytes.
    pub body: Vec<u8>,
    /// The session id (AMQP `group-id`), required by a session-enabled destination. The relay
    /// publishes the rows of one (destination, session id) one at a time in write order.
    pub session_id: Option<String>,
    /// The partition key (`x-opt-partition-key`). With a session id it must equal it (as the
    /// SDKs require); `append_outbox` refuses a row where they differ.
    pub partition_key: Option<String>,
    /// Keep the published message invisible until this time (`x-opt-scheduled-enqueue-time`).
    pub scheduled_enqueue_time: Option<SystemTime>,
    /// The published message's time-to-live (the header's `ttl`); the destination's default
    /// when `None`. It counts from the publish, not from the commit.
    pub time_to_live: Option<Duration>,
    /// The `to` address of the published message.
    pub to: Option<String>,
    /// The `reply-to` address of the published message.
    pub reply_to: Option<String>,
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
            session_id: None,
            partition_key: None,
            scheduled_enqueue_time: None,
            time_to_live: None,
            to: None,
            reply_to: None,
        }
    }

    /// The message with its stable id set to `message_id` (a business id makes a rewrite of
    /// the same event a duplicate downstream).
    #[must_use]
    pub fn with_message_id(mut self, message_id: impl Into<String>) -> Self {
        self.message_id = message_id.into();
        self
    }

    /// The message with `correlation_id`.
    #[must_use]
    pub fn with_correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }

    /// The message with `content_type` (`application/json` by [`OutboxMessage::new`]).
    #[must_use]
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// The message with the application property `name` set to `value`.
    #[must_use]
    pub fn with_property(
        mut self,
        name: impl Into<String>,
        value: impl Into<PropertyValue>,
    ) -> Self {
        self.application_properties
            .insert(name.into(), value.into());
        self
    }

    /// The message with `session_id`: for a session-enabled destination, published in write
    /// order with the other rows of the same session.
    #[must_use]
    pub fn with_session_id(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    /// The message with `partition_key` (equal to the session id when both are set).
    #[must_use]
    pub fn with_partition_key(mut self, partition_key: impl Into<String>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// The message scheduled for `at`: the broker keeps it invisible until then.
    #[must_use]
    pub fn with_scheduled_enqueue_time(mut self, at: SystemTime) -> Self {
        self.scheduled_enqueue_time = Some(at);
        self
    }

    /// The message with a time-to-live (counted from the publish).
    #[must_use]
    pub fn with_time_to_live(mut self, time_to_live: Duration) -> Self {
        self.time_to_live = Some(time_to_live);
        self
    }

    /// The message with the `to` address.
    #[must_use]
    pub fn with_to(mut self, to: impl Into<String>) -> Self {
        self.to = Some(to.into());
        self
    }

    /// The message with the `reply-to` address.
    #[must_use]
    pub fn with_reply_to(mut self, reply_to: impl Into<String>) -> Self {
        self.reply_to = Some(reply_to.into());
        self
    }
}

/// A savepoint inside a transaction, from [`Tx::savepoint`]; ended by [`Tx::rollback_to`] or
/// [`Tx::release`].
///
/// Its SQL name is generated (`sb_sp_<n>`, unique within the transaction), so savepoints nest
/// and never shadow one another.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a savepoint is ended by Tx::rollback_to or Tx::release"]
pub struct Savepoint {
    id: u32,
}

impl Savepoint {
    /// A savepoint with the transaction-unique number `id` (stores number them from 1).
    pub fn new(id: u32) -> Self {
        Savepoint { id }
    }

    /// Its number within the transaction.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its SQL name: `sb_sp_<id>`, a plain identifier on every store.
    pub fn name(&self) -> String {
        format!("sb_sp_{}", self.id)
    }
}

/// An open database transaction, as a handler sees it: business keys, aggregate versions, the
/// outbox and savepoints. The store's own transaction type adds the handler's SQL (`PgTx::execute`,
/// `SqlxPgTx::conn`, ...); a service's extension trait for its own SQL is a `Tx` subtrait.
///
/// What the runtime does with the transaction and a handler must not (the inbox row, lock
/// bounds, commit and rollback) is [`StoreTx`]: a handler's `T: Tx` bound does not reach it, and
/// `commit`/`rollback` take the transaction by value, which a handler holding `&mut T` cannot
/// give.
///
/// # Why not sealed
/// Neither trait is sealed: a third-party store implements both (and runs
/// `testing::conformance` (feature `test-util`) to show it keeps their contract), and so do test doubles and
/// wrappers (a wrapper that changes one operation implements [`DelegateTx`] instead, and
/// overrides only that one).
///
/// Dropping a transaction without [`StoreTx::commit`] rolls it back.
///
/// # The first error ends the transaction
/// After a statement fails, the transaction refuses every further statement and the commit
/// with [`StoreError::refused`] (same kind as the first error), and the caller rolls back. A
/// database may already have aborted the transaction (PostgreSQL) or rolled it back (SQL
/// Server with `XACT_ABORT ON`), so carrying on would either commit nothing while reporting
/// success or run later statements outside any transaction.
///
/// To tolerate an expected error (insert, and on a unique violation update instead), put the
/// statement that may fail inside a savepoint:
///
/// ```
/// # #[allow(dead_code)]
/// # async fn example<T: sb_inbox::Tx>(tx: &mut T) -> Result<(), sb_inbox::StoreError> {
/// use sb_inbox::ErrorKind;
/// let savepoint = tx.savepoint().await?;
/// match tx.claim_business_key("billing", "invoice:7", "m-1").await {
///     Ok(()) => tx.release(savepoint).await?,
///     // Undone and forgotten: the transaction goes on.
///     Err(error) if error.kind() == ErrorKind::Duplicate(sb_inbox::DuplicateScope::BusinessKey) => {
///         tx.rollback_to(savepoint).await?
///     }
///     Err(error) => return Err(error),
/// }
/// # Ok(()) }
/// ```
pub trait Tx: Send {
    /// Claims a business idempotency key for the message with `logical_id`; a key claimed
    /// before fails with [`ErrorKind::Duplicate`]`(`[`DuplicateScope::BusinessKey`]`)`.
    fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
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
    /// Marks a savepoint. Savepoints nest; each is ended by [`Tx::rollback_to`] or
    /// [`Tx::release`] (ending one ends those marked after it).
    ///
    /// # Errors
    /// [`StoreError::refused`] after an earlier failure; the store's error.
    fn savepoint(&mut self) -> impl Future<Output = Result<Savepoint, StoreError>> + Send;
    /// Undoes every statement since `savepoint`, a failed one included, and ends it: the
    /// transaction goes on as before the savepoint and an error raised after it is forgotten.
    ///
    /// # Errors
    /// When the database cannot return to the savepoint (it ended the whole transaction, as
    /// a deadlock does), the first error, refused: the transaction stays failed. A savepoint
    /// that is not live in this transaction is a [`ErrorKind::Schema`] error.
    fn rollback_to(
        &mut self,
        savepoint: Savepoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Keeps the statements since `savepoint` and ends it. Cheap: stores send nothing or fold
    /// the release into their next savepoint statement.
    ///
    /// # Errors
    /// [`StoreError::refused`] after a failure (roll back to the savepoint instead); a
    /// savepoint that is not live is a [`ErrorKind::Schema`] error.
    fn release(
        &mut self,
        savepoint: Savepoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The store-facing side of a transaction: the inbox row the runtime inserts first, the lock
/// bound of batched transactions, commit and rollback. Implemented by each store's transaction
/// beside [`Tx`]; a handler never calls these (see [`Tx`]).
pub trait StoreTx: Tx {
    /// Inserts the inbox row `(consumer, logical_id)` (the table's `message_id` column holds the
    /// logical id). A repeat fails with [`ErrorKind::Duplicate`]`(`[`DuplicateScope::Inbox`]`)`
    /// once the first transaction commits.
    fn insert_inbox(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Inserts the inbox row `(consumer, logical_id)` as a dead-letter [`Verdict`] instead of
    /// a processed message. Conflicts exactly as [`StoreTx::insert_inbox`] does: a repeat,
    /// either kind, fails with [`ErrorKind::Duplicate`]`(`[`DuplicateScope::Inbox`]`)`.
    fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Reads the inbox row `(consumer, logical_id)`: `None` when there is none.
    fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<Option<InboxEntry>, StoreError>> + Send;
    /// Deletes the message's dead-letter verdict if a delivery resubmitted fewer than
    /// `resubmission` times decided it, so that this resubmission of the dead letter can take
    /// effect (or be decided) once; a processed row is never touched. `true` when a row was
    /// deleted.
    fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Bounds how long each later statement of this transaction waits for a row lock that
    /// another transaction holds: past `limit` the statement fails with
    /// [`ErrorKind::TimedOut`] instead of waiting on. Batched transactions bound every
    /// delivery after their first, so two batches that each hold rows the other needs give way
    /// within `limit` instead of waiting for the database's deadlock detection (PostgreSQL's
    /// `deadlock_timeout` is 1 s). Stores without row locks wait for nothing and do nothing.
    /// (Required, so a wrapping `Tx` cannot lose the bound by forgetting to pass it on.)
    ///
    /// # Errors
    /// [`StoreError::refused`] after an earlier failure; the store's error.
    fn bound_lock_waits(
        &mut self,
        limit: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Commits.
    ///
    /// # Errors
    /// [`StoreError::refused`] after an earlier failure (nothing is committed; roll back);
    /// the store's error, also when the database answers a commit with a rollback.
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Rolls back.
    fn rollback(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A transaction that wraps another (`Inner`) and changes some of its operations: each method
/// has a provided body that passes the call on to [`DelegateTx::inner`], so a wrapper overrides
/// only what it changes (a commit that fails, a savepoint it also tracks). Every `DelegateTx` is
/// a [`Tx`] and a [`StoreTx`] through blanket impls.
///
/// Import `DelegateTx` only where it is implemented: where both it and [`Tx`] are in scope, a
/// method call on the wrapper names two traits' methods of one name.
///
/// # Examples
/// ```
/// use sb_inbox::{DelegateTx, StoreError, StoreTx};
///
/// /// Commits nothing: the test checks what a failed commit does.
/// # #[allow(dead_code)]
/// struct FailingCommit<T>(T);
///
/// impl<T: StoreTx> DelegateTx for FailingCommit<T> {
///     type Inner = T;
///     fn inner(&mut self) -> &mut T {
///         &mut self.0
///     }
///     fn into_inner(self) -> T {
///         self.0
///     }
///     async fn commit(self) -> Result<(), StoreError> {
///         self.0.rollback().await?;
///         Err(StoreError::connection("the commit failed"))
///     }
/// }
/// ```
pub trait DelegateTx: Send + Sized {
    /// The transaction underneath.
    type Inner: StoreTx;
    /// The transaction underneath, for the provided methods.
    fn inner(&mut self) -> &mut Self::Inner;
    /// The transaction underneath, for the provided `commit` and `rollback`.
    fn into_inner(self) -> Self::Inner;

    /// [`Tx::claim_business_key`] (passed on).
    fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner().claim_business_key(consumer, key, logical_id)
    }
    /// [`Tx::advance_version`] (passed on).
    fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> impl Future<Output = Result<VersionCheck, StoreError>> + Send {
        self.inner().advance_version(consumer, aggregate, version)
    }
    /// [`Tx::append_outbox`] (passed on).
    fn append_outbox(
        &mut self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner().append_outbox(message)
    }
    /// [`Tx::savepoint`] (passed on).
    fn savepoint(&mut self) -> impl Future<Output = Result<Savepoint, StoreError>> + Send {
        self.inner().savepoint()
    }
    /// [`Tx::rollback_to`] (passed on).
    fn rollback_to(
        &mut self,
        savepoint: Savepoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner().rollback_to(savepoint)
    }
    /// [`Tx::release`] (passed on).
    fn release(
        &mut self,
        savepoint: Savepoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner().release(savepoint)
    }
    /// [`StoreTx::insert_inbox`] (passed on).
    fn insert_inbox(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner().insert_inbox(consumer, logical_id)
    }
    /// [`StoreTx::insert_verdict`] (passed on).
    fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner().insert_verdict(consumer, logical_id, verdict)
    }
    /// [`StoreTx::inbox_entry`] (passed on).
    fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<Option<InboxEntry>, StoreError>> + Send {
        self.inner().inbox_entry(consumer, logical_id)
    }
    /// [`StoreTx::take_over_verdict`] (passed on).
    fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.inner()
            .take_over_verdict(consumer, logical_id, resubmission)
    }
    /// [`StoreTx::bound_lock_waits`] (passed on).
    fn bound_lock_waits(
        &mut self,
        limit: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner().bound_lock_waits(limit)
    }
    /// [`StoreTx::commit`] (passed on).
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.into_inner().commit()
    }
    /// [`StoreTx::rollback`] (passed on).
    fn rollback(self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.into_inner().rollback()
    }
}

impl<D: DelegateTx> Tx for D {
    fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::claim_business_key(self, consumer, key, logical_id)
    }
    fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> impl Future<Output = Result<VersionCheck, StoreError>> + Send {
        DelegateTx::advance_version(self, consumer, aggregate, version)
    }
    fn append_outbox(
        &mut self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::append_outbox(self, message)
    }
    fn savepoint(&mut self) -> impl Future<Output = Result<Savepoint, StoreError>> + Send {
        DelegateTx::savepoint(self)
    }
    fn rollback_to(
        &mut self,
        savepoint: Savepoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::rollback_to(self, savepoint)
    }
    fn release(
        &mut self,
        savepoint: Savepoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::release(self, savepoint)
    }
}

impl<D: DelegateTx> StoreTx for D {
    fn insert_inbox(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::insert_inbox(self, consumer, logical_id)
    }
    fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::insert_verdict(self, consumer, logical_id, verdict)
    }
    fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> impl Future<Output = Result<Option<InboxEntry>, StoreError>> + Send {
        DelegateTx::inbox_entry(self, consumer, logical_id)
    }
    fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        DelegateTx::take_over_verdict(self, consumer, logical_id, resubmission)
    }
    fn bound_lock_waits(
        &mut self,
        limit: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::bound_lock_waits(self, limit)
    }
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::commit(self)
    }
    fn rollback(self) -> impl Future<Output = Result<(), StoreError>> + Send {
        DelegateTx::rollback(self)
    }
}

/// A database that opens inbox transactions.
pub trait Store: Send + Sync + 'static {
    /// The transaction type handlers receive ([`Tx`]) and the runtime ends ([`StoreTx`]).
    type Tx: StoreTx;
    /// Opens a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;
}
