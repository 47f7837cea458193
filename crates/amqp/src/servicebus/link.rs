//! Attach-time names: link properties and source filters.
//!
//! Sources: Python `_common/constants.py` (`SESSION_FILTER`, `SESSION_LOCKED_UNTIL`,
//! `OPERATION_TIMEOUT`); JS `@azure/core-amqp` `Constants.sessionFilterName` and
//! `@azure/service-bus` `src/session/messageSession.ts`; .NET `AmqpClientConstants`
//! (`SessionFilterName`, `LockedUntilUtc`, `TimeoutName`, `EntityTypeName`).

/// Source filter naming the session a receiver wants; `null` asks for the next available one.
/// The broker's attach echoes the accepted session id under the same key.
pub const SESSION_FILTER: &str = "com.microsoft:session-filter";
/// Link property on the broker's attach of a session receiver: the session lock's expiry in
/// .NET ticks (see [`TICKS_AT_UNIX_EPOCH`]).
pub const LOCKED_UNTIL_UTC: &str = "com.microsoft:locked-until-utc";
/// Link property: how long (milliseconds, uint) the broker may take to answer the attach, e.g.
/// to find a next available session. The same symbol is the `com.microsoft:timeout` condition.
pub const OPERATION_TIMEOUT: &str = "com.microsoft:timeout";
/// Link property: the kind of entity a link addresses (.NET `EntityTypeName`).
pub const ENTITY_TYPE: &str = "com.microsoft:entity-type";
/// .NET ticks (100 ns) from 0001-01-01 to the Unix epoch, for [`LOCKED_UNTIL_UTC`].
pub const TICKS_AT_UNIX_EPOCH: i64 = 621_355_968_000_000_000;
