//! [`Reply`]: what a request node answers (status code, description, error condition, body),
//! and the map bodies replies carry.

use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::OrderedMap;
use sb_amqp::servicebus::management::status;

use crate::Error;

/// One node reply, before it is encoded: the status code and description go in the reply's
/// application properties (with the error condition on `$management`), the body as its
/// `amqp-value`.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// HTTP-like status code ([`status`]).
    pub(crate) status: i32,
    /// Human-readable status description.
    pub(crate) description: String,
    /// The error condition of a failed `$management` operation.
    pub(crate) condition: Option<&'static str>,
    /// The reply body, if any.
    pub(crate) body: Option<Value>,
}

impl Reply {
    /// A reply without a body.
    pub(crate) fn new(
        status: i32,
        description: impl Into<String>,
        condition: Option<&'static str>,
    ) -> Self {
        Reply {
            status,
            description: description.into(),
            condition,
            body: None,
        }
    }

    /// `200 OK` with `body`.
    pub(crate) fn ok(body: Option<Value>) -> Self {
        Reply {
            body,
            ..Reply::new(status::OK, "OK", None)
        }
    }

    /// `202 Accepted` (a put token).
    pub(crate) fn accepted() -> Self {
        Reply::new(status::ACCEPTED, "Accepted", None)
    }

    /// `204 No Content`.
    pub(crate) fn no_content() -> Self {
        Reply::new(status::NO_CONTENT, "No Content", None)
    }

    /// A broker error with its status code and its condition.
    pub(crate) fn error(error: &Error) -> Self {
        let code = if error.is_lock_lost() {
            status::GONE
        } else if error.is_not_found() || matches!(error, Error::MessageNotFound { .. }) {
            status::NOT_FOUND
        } else if matches!(error, Error::AlreadyExists { .. }) {
            status::CONFLICT
        } else {
            status::BAD_REQUEST
        };
        Reply::new(code, error.to_string(), Some(error.condition()))
    }

    /// `200 OK` with the body, or the error's reply.
    pub(crate) fn from_result(result: Result<Option<Value>, Error>) -> Self {
        result.map_or_else(|error| Reply::error(&error), Reply::ok)
    }
}

/// A reply body map with string keys, in the given order.
pub(crate) fn map(entries: Vec<(&str, Value)>) -> Value {
    let mut map = OrderedMap::new();
    for (key, value) in entries {
        map.insert(Value::String(key.into()), value);
    }
    Value::Map(map)
}
