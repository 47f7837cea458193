//! The `<entity>/$management` node: operations, request and reply properties, status codes,
//! body map keys and disposition statuses.
//!
//! A request is a message whose application property [`request::OPERATION`] names an
//! [`Operation`] and whose body is an AMQP map keyed by [`key`]s; the reply carries
//! [`reply::STATUS_CODE`] (a [`status`] code), [`reply::STATUS_DESCRIPTION`], on failure
//! [`reply::ERROR_CONDITION`], and a map body.
//!
//! Sources: Python `_common/constants.py` (`REQUEST_RESPONSE_*`, `MGMT_REQUEST_*`,
//! `MGMT_RESPONSE_*`, `SETTLEMENT_*`); JS `@azure/core-amqp` `Constants.operations` and
//! `@azure/service-bus` `src/core/managementClient.ts`; .NET `ManagementConstants.cs`
//! (`Operations`, `Properties`, `Response`); Go `azservicebus` `internal/mgmt.go`.

/// The node's address under an entity: `<entity>/$management`.
pub const NODE_SUFFIX: &str = "$management";

/// Operation names (values of [`request::OPERATION`]).
pub mod operation {
    /// Renew message locks by lock token.
    pub const RENEW_LOCK: &str = "com.microsoft:renew-lock";
    /// Read messages without locking them.
    pub const PEEK_MESSAGE: &str = "com.microsoft:peek-message";
    /// Settle messages by lock token (complete, abandon, defer, dead-letter).
    pub const UPDATE_DISPOSITION: &str = "com.microsoft:update-disposition";
    /// Send messages that become visible later.
    pub const SCHEDULE_MESSAGE: &str = "com.microsoft:schedule-message";
    /// Cancel scheduled messages by sequence number.
    pub const CANCEL_SCHEDULED_MESSAGE: &str = "com.microsoft:cancel-scheduled-message";
    /// Receive deferred messages by sequence number.
    pub const RECEIVE_BY_SEQUENCE_NUMBER: &str = "com.microsoft:receive-by-sequence-number";
    /// Renew a session's lock.
    pub const RENEW_SESSION_LOCK: &str = "com.microsoft:renew-session-lock";
    /// Read a session's state.
    pub const GET_SESSION_STATE: &str = "com.microsoft:get-session-state";
    /// Write a session's state.
    pub const SET_SESSION_STATE: &str = "com.microsoft:set-session-state";
    /// List sessions with messages (or updated since a time).
    pub const GET_MESSAGE_SESSIONS: &str = "com.microsoft:get-message-sessions";
    /// Add a subscription rule.
    pub const ADD_RULE: &str = "com.microsoft:add-rule";
    /// Remove a subscription rule.
    pub const REMOVE_RULE: &str = "com.microsoft:remove-rule";
    /// List a subscription's rules.
    pub const ENUMERATE_RULES: &str = "com.microsoft:enumerate-rules";
    /// Delete a batch of messages enqueued before a time (JS `@azure/service-bus` 7.10 beta
    /// `Constants.operations.deleteMessages`, .NET `ManagementConstants.Operations`).
    pub const BATCH_DELETE_MESSAGES: &str = "com.microsoft:batch-delete-messages";
}

/// A `$management` operation, for dispatching on a request (one variant per
/// [`operation`] name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`operation::RENEW_LOCK`]
    RenewLock,
    /// [`operation::PEEK_MESSAGE`]
    PeekMessage,
    /// [`operation::UPDATE_DISPOSITION`]
    UpdateDisposition,
    /// [`operation::SCHEDULE_MESSAGE`]
    ScheduleMessage,
    /// [`operation::CANCEL_SCHEDULED_MESSAGE`]
    CancelScheduledMessage,
    /// [`operation::RECEIVE_BY_SEQUENCE_NUMBER`]
    ReceiveBySequenceNumber,
    /// [`operation::RENEW_SESSION_LOCK`]
    RenewSessionLock,
    /// [`operation::GET_SESSION_STATE`]
    GetSessionState,
    /// [`operation::SET_SESSION_STATE`]
    SetSessionState,
    /// [`operation::GET_MESSAGE_SESSIONS`]
    GetMessageSessions,
    /// [`operation::ADD_RULE`]
    AddRule,
    /// [`operation::REMOVE_RULE`]
    RemoveRule,
    /// [`operation::ENUMERATE_RULES`]
    EnumerateRules,
    /// [`operation::BATCH_DELETE_MESSAGES`]
    BatchDeleteMessages,
}

impl Operation {
    /// Every operation, in declaration order.
    pub const ALL: [Operation; 14] = [
        Operation::RenewLock,
        Operation::PeekMessage,
        Operation::UpdateDisposition,
        Operation::ScheduleMessage,
        Operation::CancelScheduledMessage,
        Operation::ReceiveBySequenceNumber,
        Operation::RenewSessionLock,
        Operation::GetSessionState,
        Operation::SetSessionState,
        Operation::GetMessageSessions,
        Operation::AddRule,
        Operation::RemoveRule,
        Operation::EnumerateRules,
        Operation::BatchDeleteMessages,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::RenewLock => operation::RENEW_LOCK,
            Operation::PeekMessage => operation::PEEK_MESSAGE,
            Operation::UpdateDisposition => operation::UPDATE_DISPOSITION,
            Operation::ScheduleMessage => operation::SCHEDULE_MESSAGE,
            Operation::CancelScheduledMessage => operation::CANCEL_SCHEDULED_MESSAGE,
            Operation::ReceiveBySequenceNumber => operation::RECEIVE_BY_SEQUENCE_NUMBER,
            Operation::RenewSessionLock => operation::RENEW_SESSION_LOCK,
            Operation::GetSessionState => operation::GET_SESSION_STATE,
            Operation::SetSessionState => operation::SET_SESSION_STATE,
            Operation::GetMessageSessions => operation::GET_MESSAGE_SESSIONS,
            Operation::AddRule => operation::ADD_RULE,
            Operation::RemoveRule => operation::REMOVE_RULE,
            Operation::EnumerateRules => operation::ENUMERATE_RULES,
            Operation::BatchDeleteMessages => operation::BATCH_DELETE_MESSAGES,
        }
    }

    /// The operation a wire name names; `None` for an operation Service Bus does not have
    /// (or this vocabulary does not know).
    pub fn from_name(name: &str) -> Option<Self> {
        Operation::ALL.into_iter().find(|op| op.as_str() == name)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Application properties of a request.
pub mod request {
    /// The operation's name ([`operation`](super::operation)).
    pub const OPERATION: &str = "operation";
    /// How long (milliseconds, uint) the service may take to answer.
    pub const SERVER_TIMEOUT: &str = "com.microsoft:server-timeout";
    /// The name of the receive link a request acts for (lets the service settle on it).
    pub const ASSOCIATED_LINK_NAME: &str = "associated-link-name";
}

/// Application properties of a reply. `$management` spells them in camel case, unlike `$cbs`
/// ([`cbs::reply`](crate::servicebus::cbs::reply)).
pub mod reply {
    /// The status code (int, HTTP-like; see [`status`](super::status)).
    pub const STATUS_CODE: &str = "statusCode";
    /// The status description (string).
    pub const STATUS_DESCRIPTION: &str = "statusDescription";
    /// The error condition (symbol) of a failed operation.
    pub const ERROR_CONDITION: &str = "errorCondition";
}

/// The status codes a reply carries (HTTP's: .NET `AmqpResponseStatusCode`).
pub mod status {
    /// Done, with a body.
    pub const OK: i32 = 200;
    /// Accepted (a `put-token`; some peeks past the end).
    pub const ACCEPTED: i32 = 202;
    /// Done, nothing to return (a peek past the last message, no rules).
    pub const NO_CONTENT: i32 = 204;
    /// The request is malformed or not allowed.
    pub const BAD_REQUEST: i32 = 400;
    /// The connection holds no token with the right claims.
    pub const UNAUTHORIZED: i32 = 401;
    /// The entity, message or session does not exist.
    pub const NOT_FOUND: i32 = 404;
    /// The service timed out (transient).
    pub const REQUEST_TIMEOUT: i32 = 408;
    /// The thing already exists (a rule name).
    pub const CONFLICT: i32 = 409;
    /// The lock is gone (message or session lock lost).
    pub const GONE: i32 = 410;
    /// The service failed (transient).
    pub const INTERNAL_SERVER_ERROR: i32 = 500;
    /// The service is busy (transient).
    pub const SERVICE_UNAVAILABLE: i32 = 503;
}

/// Keys of request and reply body maps.
pub mod key {
    /// Lock tokens (array of uuid): `renew-lock`, `update-disposition`.
    pub const LOCK_TOKENS: &str = "lock-tokens";
    /// One message's lock token (uuid), in a `receive-by-sequence-number` reply entry.
    pub const LOCK_TOKEN: &str = "lock-token";
    /// New lock expiries (array of timestamp), in a `renew-lock` reply.
    pub const EXPIRATIONS: &str = "expirations";
    /// The new session lock expiry (timestamp), in a `renew-session-lock` reply.
    pub const EXPIRATION: &str = "expiration";
    /// Where a peek starts (long).
    pub const FROM_SEQUENCE_NUMBER: &str = "from-sequence-number";
    /// How many messages a peek may return (int).
    pub const MESSAGE_COUNT: &str = "message-count";
    /// `batch-delete-messages`: delete messages enqueued before this time (timestamp).
    pub const ENQUEUED_TIME_UTC: &str = "enqueued-time-utc";
    /// A list of message entries (each a map with [`MESSAGE`]).
    pub const MESSAGES: &str = "messages";
    /// One encoded message (binary), in a [`MESSAGES`] entry.
    pub const MESSAGE: &str = "message";
    /// A message id (string), in a `schedule-message` entry.
    pub const MESSAGE_ID: &str = "message-id";
    /// Sequence numbers (array of long).
    pub const SEQUENCE_NUMBERS: &str = "sequence-numbers";
    /// The settle mode of a `receive-by-sequence-number` (uint: 0 receive-and-delete, 1
    /// peek-lock).
    pub const RECEIVER_SETTLE_MODE: &str = "receiver-settle-mode";
    /// The new state (a [`DispositionStatus`](super::DispositionStatus) name).
    pub const DISPOSITION_STATUS: &str = "disposition-status";
    /// The dead-letter reason of an `update-disposition` to
    /// [`DispositionStatus::Suspended`](super::DispositionStatus::Suspended).
    pub const DEAD_LETTER_REASON: &str = "deadletter-reason";
    /// The dead-letter description, beside [`DEAD_LETTER_REASON`].
    pub const DEAD_LETTER_DESCRIPTION: &str = "deadletter-description";
    /// Application properties to set on the message (map).
    pub const PROPERTIES_TO_MODIFY: &str = "properties-to-modify";
    /// The session a session operation acts on (string).
    pub const SESSION_ID: &str = "session-id";
    /// A session's state (binary or null).
    pub const SESSION_STATE: &str = "session-state";
    /// How many entries of a listing to skip (int); a reply's next `skip`.
    pub const SKIP: &str = "skip";
    /// How many entries a listing may return (int).
    pub const TOP: &str = "top";
    /// `get-message-sessions`: sessions updated after this time (timestamp).
    pub const LAST_UPDATED_TIME: &str = "last-updated-time";
    /// The session ids of a `get-message-sessions` reply (array of string; the service's
    /// spelling).
    pub const SESSIONS_IDS: &str = "sessions-ids";
}

/// The values of [`key::DISPOSITION_STATUS`], spelled as the service spells them (Python
/// `SETTLEMENT_*`, JS `DispositionStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DispositionStatus {
    /// `completed`: remove the message.
    Completed,
    /// `abandoned`: release the lock for redelivery.
    Abandoned,
    /// `suspended`: dead-letter the message.
    Suspended,
    /// `defered` (sic): set the message aside, receivable by sequence number.
    Deferred,
}

impl DispositionStatus {
    /// Every status.
    pub const ALL: [DispositionStatus; 4] = [
        DispositionStatus::Completed,
        DispositionStatus::Abandoned,
        DispositionStatus::Suspended,
        DispositionStatus::Deferred,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DispositionStatus::Completed => "completed",
            DispositionStatus::Abandoned => "abandoned",
            DispositionStatus::Suspended => "suspended",
            DispositionStatus::Deferred => "defered",
        }
    }

    /// The status a wire name names, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        DispositionStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == name)
    }
}

impl std::fmt::Display for DispositionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
