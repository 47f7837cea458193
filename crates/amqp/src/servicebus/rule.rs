//! Subscription rules on `$management` (`add-rule`, `remove-rule`, `enumerate-rules`): body
//! map keys and the descriptor codes of a rule description.
//!
//! Sources: JS `@azure/service-bus` `src/core/managementClient.ts` (`addRule`, `getRules`) and
//! `@azure/core-amqp` `Constants.descriptorCodes`; .NET `AmqpRuleDescriptionCodec`,
//! `AmqpSqlFilterCodec`, `AmqpCorrelationFilterCodec`, `ManagementConstants.Properties`.

/// Body map keys.
pub mod key {
    /// The rule's name (string).
    pub const RULE_NAME: &str = "rule-name";
    /// The rule (map in `add-rule`; described list in `enumerate-rules`).
    pub const RULE_DESCRIPTION: &str = "rule-description";
    /// A SQL filter (map with [`EXPRESSION`]).
    pub const SQL_FILTER: &str = "sql-filter";
    /// A correlation filter (map of [`correlation`](super::correlation) fields).
    pub const CORRELATION_FILTER: &str = "correlation-filter";
    /// A SQL rule action (map with [`EXPRESSION`]).
    pub const SQL_RULE_ACTION: &str = "sql-rule-action";
    /// The SQL text of a filter or action (string).
    pub const EXPRESSION: &str = "expression";
    /// The rules of an `enumerate-rules` reply (array of maps with [`RULE_DESCRIPTION`]).
    pub const RULES: &str = "rules";
}

/// Fields of a correlation filter map.
pub mod correlation {
    /// The message's correlation id.
    pub const CORRELATION_ID: &str = "correlation-id";
    /// The message id.
    pub const MESSAGE_ID: &str = "message-id";
    /// The `to` address.
    pub const TO: &str = "to";
    /// The `reply-to` address.
    pub const REPLY_TO: &str = "reply-to";
    /// The subject (Service Bus's "label").
    pub const LABEL: &str = "label";
    /// The session id.
    pub const SESSION_ID: &str = "session-id";
    /// The reply-to session id.
    pub const REPLY_TO_SESSION_ID: &str = "reply-to-session-id";
    /// The content type.
    pub const CONTENT_TYPE: &str = "content-type";
    /// Application properties to match (map).
    pub const PROPERTIES: &str = "properties";
}

/// Descriptor codes of the described types in an `enumerate-rules` reply.
pub mod descriptor {
    /// `[filter, action, name, created-at]`.
    pub const RULE_DESCRIPTION: u64 = 0x0000_0137_0000_0004;
    /// No action.
    pub const EMPTY_RULE_ACTION: u64 = 0x0000_0137_0000_0005;
    /// `[expression]`.
    pub const SQL_RULE_ACTION: u64 = 0x0000_0137_0000_0006;
    /// `[expression]`.
    pub const SQL_FILTER: u64 = 0x0000_0013_7000_0006;
    /// `1=1`.
    pub const TRUE_FILTER: u64 = 0x0000_0013_7000_0007;
    /// `1=0`.
    pub const FALSE_FILTER: u64 = 0x0000_0013_7000_0008;
    /// `[correlation-id, message-id, to, reply-to, label, session-id, reply-to-session-id,
    /// content-type, properties]`.
    pub const CORRELATION_FILTER: u64 = 0x0000_0013_7000_0009;
}
