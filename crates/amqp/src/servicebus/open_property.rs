//! Connection properties a client sends in `open` to describe itself.
//!
//! Sources: Python `azure-servicebus` `_common/utils.py` `create_properties`; .NET
//! `AmqpConnectionScope.CreateAndOpenConnectionAsync` (`ClientPlatformProperties`).

/// The client library's name.
pub const PRODUCT: &str = "product";
/// The client library's version.
pub const VERSION: &str = "version";
/// The operating system and architecture.
pub const PLATFORM: &str = "platform";
/// The language runtime.
pub const FRAMEWORK: &str = "framework";
/// `product/version (platform)`.
pub const USER_AGENT: &str = "user-agent";
