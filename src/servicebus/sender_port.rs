//! [`ServiceBusSenderPort`]: the runtime's [`Sender`] port over Service Bus, any destination.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{SendOptions, ServiceBusClient, ServiceBusMessage, ServiceBusSender};
use crate::ports::Cause;
use crate::ports::{Message, SendFailure, Sender};

/// How long a destination's sender stays unused before the port drops it (and its link is
/// detached): Service Bus force-detaches a publisher link idle for 10 minutes itself
/// ("AmqpMessagePublisher.IdleTimerExpired: Idle timeout: 00:10:00";
/// Azure/azure-sdk-for-java#25787, Azure/azure-sdk-for-python#18795), so a sender unused that
/// long holds nothing worth keeping.
pub const SENDER_IDLE: Duration = Duration::from_secs(600);

/// The runtime's [`Sender`] port on one client: sends to any queue or topic of the namespace
/// through one [`ServiceBusSender`] per destination, attached on first use and kept while it
/// is used: one unused for [`SENDER_IDLE`] is dropped when another destination is first sent
/// to, so handlers that send to many destinations (tenants, reply queues) do not hold a link
/// for each one they ever used.
#[derive(Debug, Clone)]
pub struct ServiceBusSenderPort {
    client: ServiceBusClient,
    senders: Arc<StdMutex<HashMap<String, (ServiceBusSender, Instant)>>>,
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
        let now = Instant::now();
        let mut senders = self
            .senders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((sender, used)) = senders.get_mut(destination) {
            *used = now;
            return sender.clone();
        }
        // A send in flight keeps its own clone: dropping the port's only stops reuse.
        senders.retain(|_, (_, used)| now.duration_since(*used) < SENDER_IDLE);
        let sender = self.client.sender(destination);
        senders.insert(destination.to_owned(), (sender.clone(), now));
        sender
    }

    /// How many destinations the port holds a sender for.
    pub fn destinations(&self) -> usize {
        self.senders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40, minor 9: senders of destinations unused for [`SENDER_IDLE`] are dropped when
    /// a new destination is first used; a destination in use keeps its sender.
    #[tokio::test(start_paused = true)]
    async fn idle_destinations_do_not_accumulate() {
        let cs: crate::servicebus::ConnectionString =
            "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=a2V5;UseDevelopmentEmulator=true"
                .parse()
                .unwrap();
        let port = ServiceBusSenderPort::new(ServiceBusClient::from_connection_string(&cs));
        for n in 0..50 {
            drop(port.sender(&format!("reply-{n}")));
        }
        assert_eq!(port.destinations(), 50);
        tokio::time::advance(SENDER_IDLE / 2).await;
        drop(port.sender("reply-0"));
        tokio::time::advance(SENDER_IDLE / 2).await;
        drop(port.sender("tenant-a"));
        assert_eq!(port.destinations(), 2, "reply-0 (used since) and tenant-a");
    }
}
