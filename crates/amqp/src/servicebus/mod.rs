//! The Service Bus wire vocabulary: every name Azure Service Bus gives to an annotation,
//! property, operation, map key, link property or filter, spelled once.
//!
//! The client (`sb_inbox::servicebus`) and the emulator (`sb_emulator`) both speak Service Bus
//! over this engine; both take the names from here, so a misspelling is a compile error on one
//! side and not a silent mismatch between the two. The SDK conformance tests
//! (`tests/servicebus/{python,js}.rs`) check the client's spelling against the official SDKs.
//!
//! # Layout
//!
//! - [`annotation`]: message annotations the broker writes (`x-opt-…`) and
//!   [`MessageState`](annotation::MessageState).
//! - [`dead_letter`]: the reason/description names on a dead-lettered message and in a
//!   `rejected` outcome's error info.
//! - [`link`]: attach properties and source filters (session filter, operation timeout,
//!   session lock expiry).
//! - [`cbs`]: the `$cbs` node: `put-token` request and reply names, token types.
//! - [`management`]: the `<entity>/$management` node: operations
//!   ([`Operation`](management::Operation)), request and reply application properties, status
//!   codes, body map keys, [`DispositionStatus`](management::DispositionStatus).
//! - [`open_property`]: the connection properties a client describes itself with in `open`.
//! - [`rule`]: rule descriptions on `$management` (`add-rule`, `enumerate-rules`): map keys and
//!   descriptor codes.
//! - [`condition`]: error conditions, AMQP's and Service Bus's (the same module as
//!   [`crate::condition`], re-exported: conditions live in one place).
//!
//! # Sources
//!
//! Each module cites the SDK sources it was read from: Python `azure-servicebus` 7.15
//! (`azure/servicebus/_common/constants.py`), JS `@azure/core-amqp` 4.4
//! (`src/util/constants.ts`) and `@azure/service-bus` 7.9 (`src/core/managementClient.ts`,
//! `src/session/messageSession.ts`), .NET `Azure.Messaging.ServiceBus`
//! (`src/Amqp/ManagementConstants.cs`, `src/Amqp/AmqpClientConstants.cs`) and Go
//! `azservicebus` (`internal/amqpLinks.go`, `internal/mgmt.go`).

pub mod annotation;
pub mod cbs;
pub mod dead_letter;
pub mod link;
pub mod management;
pub mod open_property;
pub mod rule;

pub use crate::error::condition;

/// The prefix of every Service Bus vendor symbol (`com.microsoft:…`).
pub const VENDOR_PREFIX: &str = "com.microsoft:";

#[cfg(test)]
mod tests;
