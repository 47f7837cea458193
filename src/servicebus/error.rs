/// A Service Bus client failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceBusError {
    /// The connection or a link failed; reconnecting may help. Transient.
    #[error("connection failed: {0}")]
    Connection(String),
    /// `$cbs` refused the token (status code and description). Permanent until the credential
    /// changes.
    #[error("authorization refused ({status}): {description}")]
    Unauthorized {
        /// The CBS status code.
        status: i64,
        /// The CBS status description.
        description: String,
    },
    /// The entity does not exist. Permanent.
    #[error("entity not found: {0}")]
    NotFound(String),
    /// The broker refused with a condition.
    #[error("broker error {condition}: {description}")]
    Broker {
        /// The AMQP error condition.
        condition: String,
        /// Its description.
        description: String,
    },
    /// Acquiring a token failed.
    #[error("token acquisition failed: {0}")]
    Token(String),
}

impl ServiceBusError {
    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ServiceBusError::Connection(_) | ServiceBusError::Token(_) => true,
            ServiceBusError::Broker { condition, .. } => {
                condition == sb_amqp::condition::SERVER_BUSY
                    || condition == sb_amqp::condition::TIMEOUT
            }
            _ => false,
        }
    }

    pub(crate) fn from_amqp(error: &sb_amqp::Error) -> Self {
        match error.amqp_error() {
            Some(e) if e.condition == sb_amqp::condition::NOT_FOUND => {
                ServiceBusError::NotFound(e.description.clone().unwrap_or_default())
            }
            Some(e) if e.condition == sb_amqp::condition::UNAUTHORIZED_ACCESS => {
                ServiceBusError::Unauthorized {
                    status: 401,
                    description: e.description.clone().unwrap_or_default(),
                }
            }
            Some(e) if !error.is_connection_error() => ServiceBusError::Broker {
                condition: e.condition.clone(),
                description: e.description.clone().unwrap_or_default(),
            },
            _ => ServiceBusError::Connection(error.to_string()),
        }
    }
}
