//! [`ServiceBusSenderPort`]: the runtime's [`Sender`] port over Service Bus, any destination.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::SystemTime;

use super::{SendOptions, ServiceBusClient, ServiceBusMessage, ServiceBusSender};
use crate::ports::Cause;
use crate::{Message, SendFailure, Sender};

/// The runtime's [`Sender`] port on one client: sends to any queue or topic of the namespace
/// through one [`ServiceBusSender`] per destination, attached on first use and kept.
#[derive(Debug, Clone)]
pub struct ServiceBusSenderPort {
    client: ServiceBusClient,
    senders: Arc<StdMutex<HashMap<String, ServiceBusSender>>>,
}

impl ServiceBusSenderPort {
    /// The port on `client` (formerly `ServiceBusClient::sender_port`).
    pub fn new(client: ServiceBusClient) -> Self {
        ServiceBusSenderPort {
            client,
            senders: Arc::default(),
        }
    }

    fn sender(&self, destination: &str) -> ServiceBusSender {
        let mut senders = self
            .senders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        senders
            .entry(destination.to_owned())
            .or_insert_with(|| self.client.sender(destination))
            .clone()
    }
}

impl Sender for ServiceBusSenderPort {
    async fn send(
        &self,
        destination: &str,
        message: Message,
        scheduled_enqueue_time: Option<SystemTime>,
    ) -> Result<(), SendFailure> {
        let options = match scheduled_enqueue_time {
            Some(at) => SendOptions::scheduled(at),
            None => SendOptions::default(),
        };
        self.sender(destination)
            .send_with(ServiceBusMessage::from(message), &options)
            .await
            .map_err(|failed| {
                if failed.error.is_transient() {
                    SendFailure::transient(Cause::new(failed))
                } else {
                    SendFailure::permanent(Cause::new(failed))
                }
            })
    }
}

/// The former name of [`ServiceBusSenderPort`], kept for one release.
#[deprecated(
    since = "0.1.0",
    note = "renamed `ServiceBusSenderPort` (the runtime's `Sender` port; `ServiceBusSender` sends to one entity)"
)]
pub type ServiceBusPublisher = ServiceBusSenderPort;
