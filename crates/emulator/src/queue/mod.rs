//! The message storage of one queue or subscription: its active messages, its
//! `$DeadLetterQueue`, locks, timers, sessions, duplicate detection, fault hooks and counters.
//! All of it sits behind one mutex per entity (see [`crate::broker`]); nothing here awaits.
//!
//! # Layout
//! - `state`: [`QueueState`], both subqueues of one entity; enqueueing, the timer pass (lock
//!   expiry, scheduled messages, TTL) and dead-lettering.
//! - `store`: one subqueue's messages and the indexes over them (ready, locks, due times).
//! - `delivery`: take, settle, renew, peek and receive deferred messages.
//! - `session`: one session's record (lock holder, locked-until, state).
//! - `sessions`: session locks ([`SessionLock`]), session messages and state.
//! - `settlement`: [`Settlement`], how a client settles a locked message.
//! - `counts`: [`EntityCounts`].
//! - `duplicates`: [`DupWindow`], duplicate detection history (queues and topics).
//! - `faults`: [`Faults`], injected faults.
//!
//! [`QueueState`] is one type whose methods are split by concern (`delivery`, `purge`,
//! `sessions` add an `impl QueueState`); the types its fields hold live where no such method
//! does (`counts`, `session`, `store`), so `state` imports no file that imports it back.

mod counts;
mod delivery;
mod duplicates;
mod faults;
mod purge;
mod session;
mod sessions;
mod settlement;
mod state;
mod store;

pub use counts::EntityCounts;
pub(crate) use duplicates::DupWindow;
pub(crate) use faults::Faults;
pub use sessions::SessionLock;
pub use settlement::Settlement;
pub(crate) use state::QueueState;
