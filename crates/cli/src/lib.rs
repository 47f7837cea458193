//! sb-inbox-cli: the application on the sb-inbox library, the `sb-inbox` binary's modules.
//!
//! Not published and not API: the library a service depends on is `sb-inbox`; this crate is
//! what the reference binary, the demo and the workspace's tests build on.
//!
//! # Layout
//! - [`inventory`]: the reference consumer (`orders.order-placed.v1` → reserve stock), written
//!   on the library's public API only (checked by `tests/inventory_api`).
//! - [`run`]: the reference worker (`sb-inbox run`): the inventory consumer hosted in a
//!   `sb_inbox::worker::Worker` as `worker.toml` says, the store opened with retries.
//! - [`demo`] (feature `sqlite`): `sb-inbox demo`, the article's scenario in process.
//! - [`ops`]: operator commands (publish orders, dead-letter peek and resubmit).
//! - [`verify`]: `sb-inbox verify`, the article's verification scenarios against a user's own
//!   namespace and database, on scratch entities and a scratch schema.
//! - [`retry`]: `sb-inbox migrate`'s bounded wait for a database that is not available yet.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

#[cfg(feature = "sqlite")]
pub mod demo;
pub mod inventory;
pub mod ops;
pub mod retry;
pub mod run;
pub mod verify;
