//! Ports: the traits the runtime depends on.
//!
//! # Layout
//! - `message`: [`Message`], the broker-neutral view of one received message.
//! - `delivery`: a received [`Delivery`] with its lock and settlement operations, and the
//!   [`Receiver`] that yields them.
//! - `error`: [`Cause`], the typed error under every broker port error; the errors use one
//!   vocabulary: transient, permanent, lock lost.
//! - `store`: a transactional [`Store`] with the inbox operations, and its portable errors.
//! - `sender`: a [`Sender`] sends to named destinations, awaiting the broker's acceptance (outbox relay,
//!   delayed retries).
//! - `outbox`: the store as the outbox relay ([`OutboxStore`]) and retention
//!   ([`RetentionStore`]) see it: leased claims, marks, the backlog ([`OutboxBacklog`], sampled
//!   as a [`BacklogSample`]), batched deletes.
//!
//! The runtime only sees these traits: no SQL dialect and no AMQP frame crosses them.

mod delivery;
mod error;
mod message;
mod outbox;
mod sender;
mod session;
mod store;

pub use delivery::{Delivery, ReceiveError, Receiver, SettleError, Source};
pub use error::Cause;
pub use message::{INBOX_PROPERTY_PREFIX, Message, PropertyValue, TYPED_MESSAGE_ID_PREFIX};
pub use outbox::{
    BacklogSample, MAX_ROWS_PER_STATEMENT, OutboxBacklog, OutboxClaim, OutboxLease, OutboxRow,
    OutboxStore, RetentionStore, UnreadableRow,
};
pub use sender::{SendFailure, Sender};
pub use session::{SessionReceiver, SessionSource};
pub use store::{
    DelegateTx, DuplicateScope, ErrorKind, InboxEntry, OutboxMessage, Savepoint, Store, StoreError,
    StoreTx, Tx, Verdict, VersionCheck,
};
