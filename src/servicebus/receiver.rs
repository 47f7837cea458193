//! The runtime's [`Receiver`] port on the client's [`ServiceBusReceiver`], and its
//! [`Delivery`]: [`ServiceBusDelivery`].

use std::collections::BTreeMap;
use std::time::SystemTime;

use sb_servicebus::ServiceBusReceiver;

use super::convert::{property_to_client, receive_error, settle_error, source};
use crate::ports::{Delivery, Message, PropertyValue, ReceiveError, Receiver, SettleError, Source};

/// A peek-locked Service Bus delivery as the runtime takes it: the client's
/// [`sb_servicebus::ServiceBusDelivery`] with its message as a [`Message`].
#[derive(Debug)]
pub struct ServiceBusDelivery {
    delivery: sb_servicebus::ServiceBusDelivery,
    message: Message,
}

impl ServiceBusDelivery {
    pub(super) fn new(delivery: sb_servicebus::ServiceBusDelivery) -> Self {
        let message = Message::from(delivery.message());
        ServiceBusDelivery { delivery, message }
    }

    /// The client's delivery: the message with the broker's state, and its settlements
    /// with the client's errors.
    pub fn client_delivery(&self) -> &sb_servicebus::ServiceBusDelivery {
        &self.delivery
    }

    /// The broker's sequence number.
    pub fn sequence_number(&self) -> Option<i64> {
        self.delivery.sequence_number()
    }
}

impl Delivery for ServiceBusDelivery {
    fn message(&self) -> &Message {
        &self.message
    }

    fn delivery_count(&self) -> u32 {
        self.delivery.delivery_count()
    }

    fn lock_token(&self) -> uuid::Uuid {
        self.delivery.lock_token()
    }

    fn locked_until(&self) -> SystemTime {
        self.delivery.locked_until()
    }

    fn enqueued_time(&self) -> Option<SystemTime> {
        self.delivery.enqueued_time()
    }

    async fn renew_lock(&self) -> Result<SystemTime, SettleError> {
        self.delivery.renew_lock().await.map_err(settle_error)
    }

    async fn complete(&self) -> Result<(), SettleError> {
        self.delivery.complete().await.map_err(settle_error)
    }

    async fn abandon(
        &self,
        properties: BTreeMap<String, PropertyValue>,
    ) -> Result<(), SettleError> {
        let properties = properties
            .iter()
            .map(|(k, v)| (k.clone(), property_to_client(v)))
            .collect();
        self.delivery
            .abandon(properties)
            .await
            .map_err(settle_error)
    }

    async fn release(&self) -> Result<(), SettleError> {
        self.delivery.release().await.map_err(settle_error)
    }

    async fn dead_letter(&self, reason: &str, description: &str) -> Result<(), SettleError> {
        self.delivery
            .dead_letter(reason, description)
            .await
            .map_err(settle_error)
    }
}

/// `Some` with what the runtime takes (a usable delivery, or none), `None` after
/// dead-lettering an unusable one: the client hands those out (protocol3 F10), the inbox keeps
/// its rule that no delivery of them can ever be processed, under the runtime's reasons
/// ([`crate::runtime::DeadLetterReason::InvalidMessageId`],
/// [`crate::runtime::DeadLetterReason::UndecodableMessage`]).
pub(super) async fn usable(
    received: Option<sb_servicebus::ServiceBusDelivery>,
) -> Option<Option<ServiceBusDelivery>> {
    let Some(delivery) = received else {
        return Some(None);
    };
    let Some(unusable) = delivery.unusable().cloned() else {
        return Some(Some(ServiceBusDelivery::new(delivery)));
    };
    tracing::warn!(reason = %unusable.reason, description = %unusable.description, "Dead-lettering a delivery no handler can take.");
    if let Err(error) = delivery
        .dead_letter(unusable.reason, &unusable.description)
        .await
    {
        // Its lock decides: it comes back and is dead-lettered then.
        tracing::warn!(%error, "Dead-lettering an unusable delivery failed.");
    }
    None
}

impl Receiver for ServiceBusReceiver {
    type Delivery = ServiceBusDelivery;

    fn source(&self) -> Source {
        source(self.names())
    }

    async fn receive(&self) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        loop {
            let received = self.receive_message().await.map_err(receive_error)?;
            if let Some(delivery) = usable(received).await {
                return Ok(delivery);
            }
        }
    }

    async fn receive_one(&self) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        loop {
            let received = ServiceBusReceiver::receive_one(self)
                .await
                .map_err(receive_error)?;
            if let Some(delivery) = usable(received).await {
                return Ok(delivery);
            }
        }
    }

    async fn pause(&self) {
        self.withdraw().await;
    }
}
