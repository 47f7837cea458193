//! A request/response node (`$cbs`, `<entity>/$management`) whose link pair is attached on
//! first use and re-attached after it fails, on the same connection.
//!
//! The SDKs re-create these links on demand (.NET `AmqpConnectionScope` opens a new
//! management link when the cached one is closed; Go `internal/rpc.go` recovers the RPC
//! link with the entity's links); a pair that failed once never answers again.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sb_amqp::types::messaging::Message;
use sb_amqp::types::messaging::SerializableBody;
use sb_amqp::{AnyMessage, RequestResponse, Session};

/// One node on one connection.
#[derive(Debug)]
pub(crate) struct Node {
    address: String,
    /// The `max-message-size` of the reply link (`limits::max_reply_size`).
    max_reply: u64,
    pair: StdMutex<Option<Arc<RequestResponse>>>,
    /// One attach at a time (azure-amqp `Singleton`): concurrent requests that find no pair
    /// share the one being attached.
    attaching: tokio::sync::Mutex<()>,
}

impl Node {
    pub(crate) fn new(address: impl Into<String>) -> Self {
        let address = address.into();
        Node {
            max_reply: super::limits::max_reply_size(&address),
            address,
            pair: StdMutex::new(None),
            attaching: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Option<Arc<RequestResponse>> {
        let pair = self
            .pair
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pair.as_ref().filter(|p| p.error().is_none()).cloned()
    }

    /// The working pair, attaching one when there is none; callers arriving meanwhile wait for
    /// that attach instead of attaching their own.
    async fn pair(
        &self,
        session: &Session,
        timeout: Duration,
    ) -> Result<Arc<RequestResponse>, sb_amqp::Error> {
        if let Some(pair) = self.cached() {
            return Ok(pair);
        }
        let _attaching = self.attaching.lock().await;
        if let Some(pair) = self.cached() {
            return Ok(pair);
        }
        let attached = tokio::time::timeout(
            timeout,
            RequestResponse::attach_with_max_reply(session, &self.address, self.max_reply),
        )
        .await
        .map_err(|_| sb_amqp::Error::Timeout)??;
        let mut slot = self
            .pair
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pair = Arc::new(attached);
        *slot = Some(pair.clone());
        Ok(pair)
    }

    /// Sends `request` and waits at most `timeout` for the reply. A failed pair is forgotten so
    /// the next request attaches a new one; a timeout keeps the pair (its reply may be late).
    pub(crate) async fn request<B: SerializableBody>(
        &self,
        session: &Session,
        request: Message<B>,
        timeout: Duration,
    ) -> Result<AnyMessage, sb_amqp::Error> {
        let pair = self.pair(session, timeout).await?;
        let replied = tokio::time::timeout(timeout, pair.request(request))
            .await
            .map_err(|_| sb_amqp::Error::Timeout)?;
        if replied.is_err() || pair.error().is_some() {
            let mut slot = self
                .pair
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.as_ref().is_some_and(|p| Arc::ptr_eq(p, &pair)) {
                *slot = None;
            }
        }
        replied
    }
}
