//! How a client settles a locked message: [`Settlement`].

use crate::message::Properties;

/// How a locked message is settled.
#[derive(Debug, Clone)]
pub enum Settlement {
    /// Remove the message (AMQP `accepted`).
    Complete,
    /// Unlock for redelivery with delivery count + 1 (AMQP `modified{delivery-failed}`); the
    /// properties are merged into the message's application properties.
    Abandon {
        /// Properties to modify.
        properties_to_modify: Properties,
    },
    /// Set the message aside; only `receive_deferred` gets it (AMQP
    /// `modified{undeliverable-here}`).
    Defer {
        /// Properties to modify.
        properties_to_modify: Properties,
    },
    /// Move the message to the dead-letter subqueue (AMQP `rejected`).
    DeadLetter {
        /// `DeadLetterReason`.
        reason: Option<String>,
        /// `DeadLetterErrorDescription`.
        description: Option<String>,
        /// Further properties to modify.
        properties_to_modify: Properties,
    },
    /// Unlock without counting a delivery attempt (AMQP `released`), as Service Bus does: "Service
    /// Bus processes Release outcome and it doesn't increment delivery count"
    /// (<https://github.com/Azure/amqpnetlite/issues/342>).
    Release,
}

impl Settlement {
    /// Abandon without modifying properties.
    pub fn abandon() -> Self {
        Settlement::Abandon {
            properties_to_modify: Properties::new(),
        }
    }

    /// Defer without modifying properties.
    pub fn defer() -> Self {
        Settlement::Defer {
            properties_to_modify: Properties::new(),
        }
    }

    /// Dead-letter with a reason and description.
    pub fn dead_letter(reason: impl Into<String>, description: impl Into<String>) -> Self {
        Settlement::DeadLetter {
            reason: Some(reason.into()),
            description: Some(description.into()),
            properties_to_modify: Properties::new(),
        }
    }
}
