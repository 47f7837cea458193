//! What a user implements: the [`Handler`] trait, the [`Context`] it sees, and how it reports
//! success and failure.

use std::future::Future;

use super::{ConsumerName, Contract, DeadLetterReason, IdempotencyKey, Rejection};
use crate::envelope::{self, Headers};
use crate::ports::{Message, StoreError, Tx};

/// What a handler did with a message it accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The business change is written; the runtime commits.
    Processed,
    /// The message is older than the stored state ([`Tx::advance_version`] said so); the runtime
    /// commits the inbox row alone and completes.
    Stale,
}

/// Any error, boxed: what [`HandlerError`] keeps as its source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a handler failed, with the error that caused it kept as the [`source`] (not flattened
/// into a string), so logs and callers can walk the chain and downcast it.
///
/// # `?` in a handler
/// `?` converts the errors a handler commonly meets:
///
/// | error | becomes |
/// |---|---|
/// | [`StoreError`] | [`HandlerError::Store`], classified by its [`crate::ErrorKind`] |
/// | `tokio_postgres::Error` (feature `postgres`), `rusqlite::Error` (`sqlite`), `tiberius::error::Error` (`mssql`), `sqlx::Error` (`sqlx-postgres`) | classified by the store's own classifier into [`HandlerError::Store`], so a handler's own SQL is judged like the runtime's |
/// | [`std::io::Error`], [`serde_json::Error`], [`tokio::time::error::Elapsed`], `reqwest::Error` (`entra`), [`BoxError`] | [`HandlerError::Transient`] |
///
/// Any other `E: Error + Send + Sync + 'static` takes one call:
/// `.map_err(HandlerError::transient)?` or `.map_err(|e| HandlerError::permanent("why", e))?`.
///
/// Why not a blanket `impl<E: Error> From<E> for HandlerError`: `HandlerError` is itself an
/// `Error` (it nests in the user's own error types and reports its chain to any error
/// reporter), and the
/// blanket impl would then overlap the standard library's `impl<T> From<T> for T` (the reason
/// `anyhow::Error` does not implement `Error`). Keeping `Error` and listing the conversions
/// also lets driver errors be classified instead of all being transient.
///
/// Why transient is the default: abandoning a message that could never succeed costs a few
/// redeliveries before Service Bus dead-letters it at its `MaxDeliveryCount`; dead-lettering a
/// message that would have succeeded a second later loses it until an operator resubmits it.
/// A handler that knows better says so with [`HandlerError::permanent`].
///
/// [`source`]: std::error::Error::source
///
/// # Examples
/// ```
/// use sb_inbox::HandlerError;
/// use std::error::Error as _;
///
/// fn parse(body: &str) -> Result<u32, HandlerError> {
///     let n: u32 = serde_json::from_str(body)?; // transient by default
///     if n == 0 {
///         return Err(HandlerError::rejected("zero is not an order number"));
///     }
///     Ok(n)
/// }
///
/// let error = parse("{").unwrap_err();
/// assert!(error.is_transient());
/// assert!(error.source().unwrap().downcast_ref::<serde_json::Error>().is_some());
///
/// let io = std::io::Error::new(std::io::ErrorKind::InvalidData, "bad label");
/// let error = HandlerError::permanent("the label service refused the address", io);
/// assert!(error.is_permanent());
/// assert!(error.source().unwrap().downcast_ref::<std::io::Error>().is_some());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// A store error: classified by its [`crate::ErrorKind`] (duplicate, transient or permanent).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A failure that may pass (a downstream timeout): abandon and retry. Build it with
    /// [`HandlerError::transient`].
    #[error("transient failure: {0}")]
    Transient(#[source] BoxError),
    /// The message can never be processed: dead-letter it with the rejection's reason and
    /// description. Build it with [`HandlerError::permanent`] or [`HandlerError::rejected`].
    #[error("{rejection}")]
    Permanent {
        /// The dead-letter reason and bounded description.
        rejection: Rejection,
        /// The error that made the handler give up, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl HandlerError {
    /// A transient failure caused by `error`: any `Error + Send + Sync + 'static`, or a text
    /// (`&str` and `String` convert into [`BoxError`]). The message is abandoned and retried;
    /// the settlement description is the error's text, cut to 256 bytes.
    pub fn transient(error: impl Into<BoxError>) -> Self {
        HandlerError::Transient(error.into())
    }

    /// A permanent failure caused by `error`: dead-letter with reason `HandlerRejected` and
    /// `description` (bounded; it must not echo the payload). `error` stays the source, for
    /// logs, and is not written to the dead-letter description.
    pub fn permanent(description: impl AsRef<str>, error: impl Into<BoxError>) -> Self {
        HandlerError::Permanent {
            rejection: Rejection::new(DeadLetterReason::HandlerRejected, description),
            source: Some(error.into()),
        }
    }

    /// A permanent failure with reason `HandlerRejected` and a bounded description, caused by
    /// no other error.
    pub fn rejected(description: impl AsRef<str>) -> Self {
        HandlerError::Permanent {
            rejection: Rejection::new(DeadLetterReason::HandlerRejected, description),
            source: None,
        }
    }

    /// A permanent failure with a rejection of the handler's choosing (any reason from the
    /// fixed vocabulary), caused by no other error.
    pub fn rejection(rejection: Rejection) -> Self {
        HandlerError::Permanent {
            rejection,
            source: None,
        }
    }

    /// True for [`HandlerError::Transient`] and for a store error whose kind is transient.
    pub fn is_transient(&self) -> bool {
        match self {
            HandlerError::Store(error) => error.kind().is_transient(),
            HandlerError::Transient(_) => true,
            HandlerError::Permanent { .. } => false,
        }
    }

    /// True for [`HandlerError::Permanent`] and for a store error whose kind is permanent.
    pub fn is_permanent(&self) -> bool {
        match self {
            HandlerError::Store(error) => error.kind().is_permanent(),
            HandlerError::Transient(_) => false,
            HandlerError::Permanent { .. } => true,
        }
    }
}

/// Conversions that make `?` transient; see [`HandlerError`] for why transient is the default.
macro_rules! transient_from {
    ($($(#[$attr:meta])* $error:ty),* $(,)?) => {
        $(
            $(#[$attr])*
            impl From<$error> for HandlerError {
                fn from(error: $error) -> Self {
                    HandlerError::Transient(Box::new(error))
                }
            }
        )*
    };
}

transient_from!(
    std::io::Error,
    serde_json::Error,
    tokio::time::error::Elapsed,
    #[cfg(feature = "entra")]
    reqwest::Error,
);

impl From<BoxError> for HandlerError {
    fn from(error: BoxError) -> Self {
        HandlerError::Transient(error)
    }
}

/// A body that does not decode as its contract says.
///
/// The description must not echo the payload: use [`DecodeError::json`] for serde_json errors,
/// which keeps only the error category and position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(String);

impl DecodeError {
    /// A decode error with a description that does not quote the payload.
    pub fn new(description: impl AsRef<str>) -> Self {
        DecodeError(envelope::truncate(
            description.as_ref(),
            envelope::MAX_DESCRIPTION_LEN,
        ))
    }

    /// Describes a serde_json error by category and position only: its display text can quote
    /// payload values.
    pub fn json(error: &serde_json::Error) -> Self {
        let category = match error.classify() {
            serde_json::error::Category::Io => "i/o error",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "data does not match the contract",
            serde_json::error::Category::Eof => "unexpected end of input",
        };
        DecodeError(format!(
            "invalid JSON: {category} at line {} column {}",
            error.line(),
            error.column()
        ))
    }
}

/// What a handler sees of one message.
#[derive(Debug)]
#[non_exhaustive]
pub struct Context<'a, P> {
    /// The decoded body.
    pub payload: P,
    /// The message as received.
    pub message: &'a Message,
    /// The checked logical message id: see [`Context::logical_id`].
    pub(crate) logical_id: &'a str,
    /// The consumer this runtime runs as.
    pub consumer: &'a ConsumerName,
    /// The contract the envelope names; behind a [`Router`](crate::Router)'s upcaster, the
    /// contract the body was upcast to (the message's subject still names the original).
    pub contract: &'a Contract,
    /// The envelope's headers: see [`Context::headers`].
    pub(crate) headers: &'a Headers,
    /// Earlier deliveries of this message: 0 on the first (one less than .NET's
    /// `DeliveryCount`, which [`Context::attempt`] gives).
    pub delivery_count: u32,
}

impl<'a, P> Context<'a, P> {
    /// The checked logical message id (the inbox key): the `sb-inbox-logical-id` property of a
    /// delayed-retry copy or a resubmitted dead letter, else the broker message id. Claim
    /// business keys and derive downstream keys from it, never from the broker's id.
    pub fn logical_id(&self) -> &'a str {
        self.logical_id
    }

    /// This delivery's attempt number, counting it: 1 on the first delivery. The number .NET's
    /// `ServiceBusReceivedMessage.DeliveryCount` and MassTransit's `GetRetryAttempt() + 1`
    /// show; [`Context::delivery_count`] counts the earlier deliveries only.
    pub fn attempt(&self) -> u32 {
        self.delivery_count.saturating_add(1)
    }

    /// Claims the business idempotency key `key` for this message in `tx`: the consumer and
    /// the logical id come from the context, so a handler cannot pass the broker's id by
    /// mistake. A key claimed before (by another message carrying the same business request)
    /// fails with [`ErrorKind::Duplicate`](crate::ErrorKind::Duplicate)`(`[`BusinessKey`](crate::DuplicateScope::BusinessKey)`)`,
    /// which `?` turns into the duplicate outcome.
    ///
    /// # Errors
    /// As [`Tx::claim_business_key`].
    ///
    /// # Examples
    /// ```
    /// # #![allow(dead_code)]
    /// # use sb_inbox::{Context, Handled, HandlerError, Tx};
    /// async fn handle<T: Tx>(ctx: &Context<'_, String>, tx: &mut T) -> Result<Handled, HandlerError> {
    ///     ctx.claim(tx, &format!("order:{}", ctx.payload)).await?;
    ///     Ok(Handled::Processed)
    /// }
    /// ```
    pub async fn claim<T: Tx>(&self, tx: &mut T, key: &str) -> Result<(), crate::ports::StoreError>
    where
        P: Sync,
    {
        tx.claim_business_key(self.consumer.as_str(), key, self.logical_id)
            .await
    }

    /// The envelope's headers: the application properties for the subject-versioned envelope,
    /// the envelope's own headers for MassTransit, NServiceBus or CloudEvents (see
    /// [`EnvelopeReader`](crate::runtime::EnvelopeReader)).
    pub fn headers(&self) -> &'a Headers {
        self.headers
    }

    /// The logical message id under its old name.
    #[deprecated(note = "the inbox key is the logical id: use `Context::logical_id`")]
    pub fn message_id(&self) -> &'a str {
        self.logical_id
    }

    /// The message's session id: in session mode, the session whose messages this runtime
    /// handles one at a time, in order (`None` outside sessions).
    pub fn session_id(&self) -> Option<&str> {
        self.message.session_id.as_deref()
    }

    /// The key to send to a downstream API that deduplicates by an idempotency key (an
    /// `Idempotency-Key` header or the API's equivalent) for the call named `scope` (such as
    /// `"capture-payment"`).
    ///
    /// It depends only on the consumer name, the logical message id and `scope`, so it is the
    /// same on every delivery of this message, on a delayed-retry copy and on a resubmitted dead
    /// letter: a call repeated after a rollback, a lost lock or a crash is recognised by the API
    /// as the one it already served. It is not stored, so nothing has to commit before the call.
    /// Renaming the consumer changes it, as it changes the inbox key.
    ///
    /// # Examples
    /// ```
    /// # #![allow(dead_code)]
    /// # use sb_inbox::{Context, Handled, HandlerError};
    /// # fn call_api(_key: &str) {}
    /// fn capture<P>(ctx: &Context<'_, P>) -> Result<Handled, HandlerError> {
    ///     let key = ctx.idempotency_key("capture-payment");
    ///     call_api(key.as_str()); // sent as `Idempotency-Key: <key>`
    ///     Ok(Handled::Processed)
    /// }
    /// ```
    pub fn idempotency_key(&self, scope: &str) -> IdempotencyKey {
        IdempotencyKey::for_message(self.consumer, self.logical_id, scope)
    }

    /// The key for `scope` derived from a business idempotency key instead of the message id:
    /// two messages that carry one business request (the same `business_key`, which the handler
    /// claims with [`Tx::claim_business_key`]) send the API one key, so a second message for a
    /// request whose first message crashed after the call is recognised by the API too.
    pub fn business_idempotency_key(&self, business_key: &str, scope: &str) -> IdempotencyKey {
        IdempotencyKey::for_business_key(self.consumer, business_key, scope)
    }
}

/// A message handler: decodes accepted contracts and applies the business change in the
/// transaction the runtime opened (the inbox row is already inserted in it).
///
/// The handler must do all its durable work through `tx`: anything else (an email, an HTTP
/// call) is not covered by the commit; write it to the outbox with [`Tx::append_outbox`] instead.
pub trait Handler<T: Tx>: Send + Sync + 'static {
    /// The decoded body.
    type Payload: Send + Sync;

    /// The contracts this handler accepts (several versions of one name, or, for a
    /// [`Router`](crate::Router), every route's); anything else is dead-lettered before any
    /// database work, or completed for an unknown name under
    /// [`UnknownContracts::Complete`](crate::UnknownContracts::Complete).
    fn contracts(&self) -> &[Contract];

    /// Decodes a body of an accepted contract.
    ///
    /// # Errors
    /// [`DecodeError`] dead-letters the message with reason `InvalidPayload`.
    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<Self::Payload, DecodeError>;

    /// Applies the business change.
    ///
    /// # Errors
    /// [`HandlerError`], classified into duplicate, transient or permanent outcomes.
    fn handle(
        &self,
        ctx: &Context<'_, Self::Payload>,
        tx: &mut T,
    ) -> impl Future<Output = Result<Handled, HandlerError>> + Send;
}
