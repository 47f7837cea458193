//! The runtime's session ports on the client's session receiver and source.

use std::time::{Duration, SystemTime};

use sb_servicebus::{ServiceBusSessionReceiver, ServiceBusSessionSource};

use super::ServiceBusDelivery;
use super::convert::{receive_error, settle_error, source};
use crate::ports::{ReceiveError, SessionReceiver, SessionSource, SettleError, Source};

impl SessionReceiver for ServiceBusSessionReceiver {
    type Delivery = ServiceBusDelivery;

    fn session_id(&self) -> &str {
        ServiceBusSessionReceiver::session_id(self)
    }

    fn locked_until(&self) -> SystemTime {
        ServiceBusSessionReceiver::locked_until(self)
    }

    async fn renew(&self) -> Result<SystemTime, SettleError> {
        self.renew_session_lock().await.map_err(settle_error)
    }

    async fn receive(&self, wait: Duration) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        loop {
            let received = ServiceBusSessionReceiver::receive(self, wait)
                .await
                .map_err(receive_error)?;
            if let Some(delivery) = super::receiver::usable(received).await {
                return Ok(delivery);
            }
        }
    }

    async fn close(&self) {
        ServiceBusSessionReceiver::close(self).await;
    }

    async fn give_back_ahead(&self) {
        ServiceBusSessionReceiver::give_back_ahead(self).await;
    }
}

/// For [`crate::Runtime::for_sessions`].
impl SessionSource for ServiceBusSessionSource {
    type Session = ServiceBusSessionReceiver;

    fn source(&self) -> Source {
        source(self.names())
    }

    async fn accept_next(&self) -> Result<Option<ServiceBusSessionReceiver>, ReceiveError> {
        ServiceBusSessionSource::accept_next(self)
            .await
            .map_err(receive_error)
    }
}
