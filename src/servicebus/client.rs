use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sb_amqp::{Connection, ConnectionOptions, RequestResponse, Session};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::{ConnectionString, SasProvider, ServiceBusError, TokenProvider, cbs};

/// One AMQP connection to a namespace with its session and `$cbs` link.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) connection: Connection,
    pub(crate) session: Session,
    pub(crate) cbs: RequestResponse,
    /// Increments on every reconnect: deliveries of an older generation lost their link.
    pub(crate) generation: u64,
}

/// A Service Bus client: one connection, re-established on demand after a failure.
///
/// # Examples
/// ```
/// use sb_inbox::servicebus::ServiceBusClient;
/// let cs = "Endpoint=sb://127.0.0.1:5699;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true";
/// let client = ServiceBusClient::from_connection_string(&cs.parse()?);
/// // Links attach on first use.
/// let receiver = client.receiver("orders", 0);
/// assert_eq!(receiver.entity(), "orders");
/// # Ok::<(), sb_inbox::servicebus::ConnectionStringError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ServiceBusClient {
    inner: Arc<ClientInner>,
}

#[derive(Debug)]
struct ClientInner {
    url: String,
    host: String,
    tokens: Arc<dyn TokenProvider>,
    link: Mutex<Option<Arc<Link>>>,
    generation: AtomicU64,
    closed: CancellationToken,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

impl ServiceBusClient {
    /// A client for a connection string (SAS key or signature; plain AMQP for the emulator).
    pub fn from_connection_string(cs: &ConnectionString) -> Self {
        Self::new(
            cs.amqp_url(),
            cs.host(),
            Arc::new(SasProvider::new(cs.credential().clone())),
        )
    }

    /// A client for the namespace `host` (`NAME.servicebus.windows.net`) over AMQPS with
    /// Microsoft Entra ID tokens from `credential` (role *Azure Service Bus Data Receiver* /
    /// *Sender* on the entities).
    pub fn with_entra(host: &str, credential: crate::entra::EntraCredential) -> Self {
        Self::new(
            format!("amqps://{host}:5671"),
            host,
            Arc::new(super::EntraProvider::new(credential)),
        )
    }

    /// A client for `url` (`amqps://HOST:5671`) whose tokens come from `tokens` (for Microsoft
    /// Entra ID: a JWT provider for scope `https://servicebus.azure.net/.default`).
    pub fn new(
        url: impl Into<String>,
        host: impl Into<String>,
        tokens: Arc<dyn TokenProvider>,
    ) -> Self {
        ServiceBusClient {
            inner: Arc::new(ClientInner {
                url: url.into(),
                host: host.into(),
                tokens,
                link: Mutex::new(None),
                generation: AtomicU64::new(0),
                closed: CancellationToken::new(),
            }),
        }
    }

    /// A peek-lock receiver on `entity` (a queue, `TOPIC/Subscriptions/SUB`, or either's
    /// `/$DeadLetterQueue`), holding at most `prefetch` deliveries beyond those asked for.
    /// Deliveries waiting on the link are not renewed: under a [`crate::Runtime`] pass 0 and set
    /// [`crate::RuntimeConfig::prefetch`], which keeps the locks of what it holds from receipt.
    pub fn receiver(&self, entity: &str, prefetch: u32) -> super::ServiceBusReceiver {
        super::ServiceBusReceiver::new(self.clone(), entity, prefetch)
    }

    /// A sender to `entity`.
    pub fn sender(&self, entity: &str) -> super::ServiceBusSender {
        super::ServiceBusSender::new(self.clone(), entity)
    }

    /// The runtime's `Sender` port: sends to any queue or topic of the namespace.
    pub fn publisher(&self) -> super::ServiceBusPublisher {
        super::ServiceBusPublisher::new(self.clone())
    }

    /// Peeks up to `max` messages of `entity` (a queue, `TOPIC/Subscriptions/SUB`, or either's
    /// `/$DeadLetterQueue`) from `from_sequence_number` on, in sequence order, without locking
    /// them: what an operator looks at before acting on a dead-letter queue.
    ///
    /// # Errors
    /// [`ServiceBusError`]: `NotFound` for an unknown entity, connection and authorization
    /// failures.
    pub async fn peek(
        &self,
        entity: &str,
        from_sequence_number: i64,
        max: u32,
    ) -> Result<Vec<super::PeekedMessage>, ServiceBusError> {
        /// Messages asked for per request: Service Bus answers at most this many anyway.
        const PAGE: usize = 100;
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let link = self.link().await?;
        let node = format!("{entity}/$management");
        // As for a receiver: the entity's token, then the node's.
        self.authorize(&link, entity).await?;
        self.authorize(&link, &node).await?;
        let management = RequestResponse::attach(&link.session, &node)
            .await
            .map_err(|e| ServiceBusError::from_amqp(&e))?;
        let mut out: Vec<super::PeekedMessage> = Vec::new();
        let mut from = from_sequence_number;
        while out.len() < max {
            let count = i32::try_from((max - out.len()).min(PAGE)).unwrap_or(1);
            let page = tokio::time::timeout(
                Duration::from_secs(30),
                super::management::peek(&management, from, count),
            )
            .await
            .map_err(|_| {
                ServiceBusError::Connection("$management did not answer peek in time".into())
            })??;
            let Some(last) = page.last() else { break };
            from = last.sequence_number + 1;
            out.extend(page);
        }
        out.truncate(max);
        Ok(out)
    }

    /// The namespace host (telemetry's `server.address`).
    pub(crate) fn host(&self) -> &str {
        &self.inner.host
    }

    /// The token audience of an entity or node.
    pub(crate) fn audience(&self, entity: &str) -> String {
        format!(
            "sb://{}/{}",
            self.inner.host,
            entity.trim_start_matches('/')
        )
    }

    /// The current connection, opening one if there is none or the last one failed.
    pub(crate) async fn link(&self) -> Result<Arc<Link>, ServiceBusError> {
        let mut guard = self.inner.link.lock().await;
        if let Some(link) = guard.as_ref()
            && link.connection.error().is_none()
        {
            return Ok(link.clone());
        }
        let options = ConnectionOptions::default();
        let connection = Connection::open_with(&self.inner.url, options)
            .await
            .map_err(|e| ServiceBusError::from_amqp(&e))?;
        let session = connection
            .begin()
            .await
            .map_err(|e| ServiceBusError::from_amqp(&e))?;
        let cbs = RequestResponse::attach(&session, "$cbs")
            .await
            .map_err(|e| ServiceBusError::from_amqp(&e))?;
        let generation = self.inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
        tracing::info!(url = %self.inner.url, generation, "Connected to Service Bus.");
        let link = Arc::new(Link {
            connection,
            session,
            cbs,
            generation,
        });
        *guard = Some(link.clone());
        Ok(link)
    }

    /// Forgets the current connection so the next call reconnects.
    pub(crate) async fn reset(&self, generation: u64) {
        let mut guard = self.inner.link.lock().await;
        if guard.as_ref().is_some_and(|l| l.generation == generation) {
            *guard = None;
        }
    }

    /// True while a connection is open and healthy (false before the first use, while
    /// reconnecting, and after a failure).
    pub fn is_connected(&self) -> bool {
        self.inner.link.try_lock().is_ok_and(|link| {
            link.as_ref()
                .is_some_and(|l| l.connection.error().is_none())
        })
    }

    /// The generation of the current connection (0 before the first).
    pub(crate) fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Puts a token for `entity` and keeps refreshing it on this connection at 90 % of its
    /// lifetime, until the connection or the client goes away.
    pub(crate) async fn authorize(
        &self,
        link: &Arc<Link>,
        entity: &str,
    ) -> Result<(), ServiceBusError> {
        let audience = self.audience(entity);
        let token = self.inner.tokens.token(&audience).await?;
        cbs::put_token(&link.cbs, &audience, &token).await?;
        // The task holds neither the client nor the connection, so dropping them ends it.
        let (tokens, weak) = (self.inner.tokens.clone(), Arc::downgrade(link));
        let closed = self.inner.closed.clone();
        let mut expires_at = token.expires_at;
        tokio::spawn(closed.run_until_cancelled_owned(async move {
            loop {
                let lifetime = expires_at
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                tokio::time::sleep(lifetime.mul_f64(0.9).max(Duration::from_secs(1))).await;
                let Some(link) = weak.upgrade() else { return };
                let result = async {
                    let token = tokens.token(&audience).await?;
                    cbs::put_token(&link.cbs, &audience, &token).await?;
                    Ok::<_, ServiceBusError>(token.expires_at)
                }
                .await;
                match result {
                    Ok(next) => expires_at = next,
                    Err(error) => {
                        tracing::warn!(%audience, %error, "Token refresh failed; retrying.");
                        expires_at = SystemTime::now() + Duration::from_secs(10);
                    }
                }
            }
        }));
        Ok(())
    }
}
