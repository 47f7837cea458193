//! What a user implements: the [`Handler`] trait, the [`Context`] it sees, and how it reports
//! success and failure.

use std::future::Future;

use super::{ConsumerName, Contract, DeadLetterReason, IdempotencyKey, Rejection, envelope};
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

/// Why a handler failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// A store error: classified by its [`crate::ErrorKind`] (duplicate, transient or permanent).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A failure that may pass (a downstream timeout): abandon and retry.
    #[error("transient failure: {0}")]
    Transient(String),
    /// The message can never be processed: dead-letter it.
    #[error(transparent)]
    Permanent(Rejection),
}

impl HandlerError {
    /// A permanent failure with reason `HandlerRejected` and a bounded description.
    pub fn rejected(description: impl AsRef<str>) -> Self {
        HandlerError::Permanent(Rejection::new(
            DeadLetterReason::HandlerRejected,
            description,
        ))
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
    /// The contract from the subject.
    pub contract: &'a Contract,
    /// Earlier deliveries of this message.
    pub delivery_count: u32,
}

impl<'a, P> Context<'a, P> {
    /// The checked logical message id (the inbox key): the `sb-inbox-logical-id` property of a
    /// delayed-retry copy or a resubmitted dead letter, else the broker message id. Claim
    /// business keys and derive downstream keys from it, never from the broker's id.
    pub fn logical_id(&self) -> &'a str {
        self.logical_id
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

    /// The contracts this handler accepts; anything else is dead-lettered before any database
    /// work.
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
