//! The `$cbs` node (claims-based security): `put-token` requests and their replies.
//!
//! Sources: JS `@azure/core-amqp` `Constants` (`cbsEndpoint`, `operationPutToken`,
//! `statusCode`, `statusDescription`) and `src/cbs.ts`; Python `_common/constants.py`
//! (`TOKEN_TYPE_JWT`, `TOKEN_TYPE_SASTOKEN`) and pyamqp `cbs.py`.

/// The node's address.
pub const NODE: &str = "$cbs";
/// The one operation (`operation` application property).
pub const PUT_TOKEN: &str = "put-token";

/// Application properties of a `put-token` request.
pub mod request {
    /// The operation: [`PUT_TOKEN`](super::PUT_TOKEN).
    pub const OPERATION: &str = "operation";
    /// The token type: [`SAS_TOKEN`](super::token_type::SAS_TOKEN) or
    /// [`JWT`](super::token_type::JWT).
    pub const TYPE: &str = "type";
    /// The audience the token is for (`sb://<host>/<entity>`).
    pub const NAME: &str = "name";
    /// When the token expires (timestamp).
    pub const EXPIRATION: &str = "expiration";
}

/// Application properties of a `put-token` reply. `$cbs` spells them in kebab case, unlike
/// `$management` ([`management::reply`](crate::servicebus::management::reply)).
pub mod reply {
    /// The status code (int, HTTP-like: 200 or 202 accept the token).
    pub const STATUS_CODE: &str = "status-code";
    /// The status description (string).
    pub const STATUS_DESCRIPTION: &str = "status-description";
    /// The error condition (symbol) in the request-response convention's spelling (JS
    /// `@azure/core-amqp` `Constants.errorCondition`).
    pub const ERROR_CONDITION: &str = "error-condition";
}

/// The values of [`request::TYPE`].
pub mod token_type {
    /// A shared access signature (`SharedAccessSignature sr=…&sig=…&se=…&skn=…`).
    pub const SAS_TOKEN: &str = "servicebus.windows.net:sastoken";
    /// An Entra ID (OAuth) access token.
    pub const JWT: &str = "jwt";
}
