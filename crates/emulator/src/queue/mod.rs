//! The message storage of one queue or subscription: its active messages, its
//! `$DeadLetterQueue`, locks, timers, sessions, duplicate detection, fault hooks and counters.
//! All of it sits behind one mutex per entity (see [`crate::broker`]); nothing here awaits.
//!
//! # Layout
//! - `state`: [`QueueState`], both subqueues of one entity; enqueueing, the timer pass (lock
//!   expiry, scheduled messages, TTL) and dead-lettering.
//! - `store`: one subqueue's messages and the indexes over them (ready, locks, due times).
//! - `delivery`: take, settle, renew, peek and receive deferred messages.
//! - `sessions`: session locks ([`SessionLock`]), session messages and state.
//! - `settlement`: [`Settlement`], how a client settles a locked message.
//! - `counts`: [`EntityCounts`].
//! - `duplicates`: [`DupWindow`], duplicate detection history (queues and topics).
//! - `faults`: [`Faults`], injected faults.
//!
//! `state` and `counts`, `state` and `sessions` import each other, and stay so: [`QueueState`]
//! is one type whose methods are split by concern (`delivery`, `purge`, `counts`, `sessions`
//! each add an `impl QueueState`), and its fields hold the counters and sessions those files
//! define. Moving each concern's type into `state` would put every concern back in one file;
//! a trait per concern would hide the same dependency behind indirection.

mod counts;
mod delivery;
mod duplicates;
mod faults;
mod purge;
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
