//! [`ServiceBusClient`]: one connection per namespace (`ConnectionScope`: the connection, its
//! session and its request/response nodes), tokens put on `$cbs` and kept fresh, and
//! `$management` requests.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::OrderedMap;
use sb_amqp::servicebus::{management, open_property};
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::messaging::{Message, SerializableBody};
use sb_amqp::types::primitives::Symbol;
use sb_amqp::{AnyMessage, Connection, ConnectionOptions, Session, unique_name};
use tokio_util::sync::CancellationToken;

use super::error::{Recovery, recovery};
use super::node::Node;
use super::{ConnectionString, SasProvider, ServiceBusError, TokenProvider, cbs};

/// How long each handshake step (connect with TLS, SASL and `open`; `begin`; each `attach`)
/// and each request may take by default; the SDKs' per-try timeout is 60 s (.NET
/// `ServiceBusRetryOptions.TryTimeout`), the service's own server timeout 30 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Our idle time-out: the service must send something (it sends empty frames) at least this
/// often, else the connection is declared dead (.NET `AmqpConnectionScope` uses 60 s).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Refresh a token this long before it expires (.NET `AmqpConnectionScope.AuthorizationRefreshBuffer`).
const REFRESH_BUFFER: Duration = Duration::from_secs(10 * 60);
/// ...but not sooner than this (.NET `AmqpConnectionScope.MinimumAuthorizationRefresh`).
const MIN_REFRESH: Duration = Duration::from_secs(2 * 60);
/// After a failed refresh, try again this soon.
const REFRESH_RETRY: Duration = Duration::from_secs(10);

/// What every link of a client shares: one AMQP connection to the namespace, its session, its
/// request/response nodes (`$cbs`, `<entity>/$management`) and the tokens kept fresh on it
/// (.NET `AmqpConnectionScope`). Replaced as a whole after a connection-level failure.
#[derive(Debug)]
pub(crate) struct ConnectionScope {
    pub(crate) connection: Connection,
    pub(crate) session: Session,
    /// `$cbs` and `<entity>/$management`, attached on first use and re-attached after a
    /// failure.
    nodes: StdMutex<HashMap<String, Arc<Node>>>,
    /// Audiences whose token is put and kept fresh on this connection.
    refreshing: StdMutex<HashSet<String>>,
    /// Ends this connection's refresh tasks when it is replaced, dropped, or the client goes.
    stop: CancellationToken,
}

impl Drop for ConnectionScope {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ConnectionScope {
    fn is_healthy(&self) -> bool {
        self.connection.error().is_none()
    }

    fn node(&self, address: &str) -> Arc<Node> {
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        nodes
            .entry(address.to_owned())
            .or_insert_with(|| Arc::new(Node::new(address)))
            .clone()
    }

    /// Marks `audience` as refreshed here; true for the first caller only.
    fn start_refreshing(&self, audience: &str) -> bool {
        self.refreshing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(audience.to_owned())
    }

    fn is_refreshing(&self, audience: &str) -> bool {
        self.refreshing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(audience)
    }

    /// Sends a request to `address` on this connection.
    pub(crate) async fn request<B: SerializableBody>(
        &self,
        address: &str,
        request: Message<B>,
        timeout: Duration,
    ) -> Result<AnyMessage, sb_amqp::Error> {
        self.node(address)
            .request(&self.session, request, timeout)
            .await
    }
}

/// A Service Bus client: one connection, re-established only after a connection-level
/// failure; a failed link is re-attached on the same connection.
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
    timeout: Duration,
    /// `None`: Mozilla's roots (sb-amqp's default).
    tls: Option<Arc<rustls::ClientConfig>>,
    current: StdMutex<Option<Arc<ConnectionScope>>>,
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
    #[cfg(feature = "entra")]
    pub fn with_entra(host: &str, credential: crate::entra::EntraCredential) -> Self {
        Self::with_entra_over(host, credential, super::Transport::Amqp)
    }

    /// [`ServiceBusClient::with_entra`] over `transport` (`AmqpWebSockets`: `wss://HOST:443`).
    #[cfg(feature = "entra")]
    pub fn with_entra_over(
        host: &str,
        credential: crate::entra::EntraCredential,
        transport: super::Transport,
    ) -> Self {
        Self::new(
            transport.url(host, None, true),
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
        Self::build(url.into(), host.into(), tokens, DEFAULT_TIMEOUT, None)
    }

    fn build(
        url: String,
        host: String,
        tokens: Arc<dyn TokenProvider>,
        timeout: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Self {
        ServiceBusClient {
            inner: Arc::new(ClientInner {
                url,
                host,
                tokens,
                timeout,
                tls,
                current: StdMutex::new(None),
                closed: CancellationToken::new(),
            }),
        }
    }

    /// The same client with `timeout` for each handshake step (connect, TLS, SASL and `open`;
    /// `begin`; each `attach`) and each request to the service ([`DEFAULT_TIMEOUT`] unless
    /// set). Call before first use: links opened already keep the old value.
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self::build(
            self.inner.url.clone(),
            self.inner.host.clone(),
            self.inner.tokens.clone(),
            timeout,
            self.inner.tls.clone(),
        )
    }

    /// The same client trusting `roots` for `amqps` and `wss` (an extra CA bundle, the OS
    /// store; see [`super::TrustRoots`]). Call before first use.
    ///
    /// # Errors
    /// [`super::TrustError`] when a root cannot be read.
    pub fn with_trust(self, roots: &super::TrustRoots) -> Result<Self, super::TrustError> {
        Ok(Self::build(
            self.inner.url.clone(),
            self.inner.host.clone(),
            self.inner.tokens.clone(),
            self.inner.timeout,
            Some(roots.client_config()?),
        ))
    }

    /// The bound of each handshake step and request.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
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
    pub fn sender_port(&self) -> super::ServiceBusSenderPort {
        super::ServiceBusSenderPort::new(self.clone())
    }

    /// The former name of [`ServiceBusClient::sender_port`], kept for one release.
    #[deprecated(since = "0.1.0", note = "renamed `sender_port`")]
    pub fn publisher(&self) -> super::ServiceBusSenderPort {
        self.sender_port()
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
        let mut out: Vec<super::PeekedMessage> = Vec::new();
        let mut from = from_sequence_number;
        while out.len() < max {
            let count = i32::try_from((max - out.len()).min(PAGE)).unwrap_or(1);
            let reply = self
                .management(entity, super::management::Request::peek(from, count))
                .await?;
            let page = super::management::peek_page(&reply)?;
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

    fn current(&self) -> Option<Arc<ConnectionScope>> {
        let current = self
            .inner
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        current.as_ref().filter(|c| c.is_healthy()).cloned()
    }

    /// The current connection, opening one if there is none or the last one failed. No lock is
    /// held while opening: a black-holed handshake delays only its callers, and only for the
    /// timeout.
    pub(crate) async fn connection(&self) -> Result<Arc<ConnectionScope>, ServiceBusError> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let opened = self.open().await?;
        let mut current = self
            .inner
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(winner) = current.as_ref().filter(|c| c.is_healthy()) {
            // Another caller connected meanwhile; ours closes when dropped.
            return Ok(winner.clone());
        }
        if let Some(old) = current.replace(opened.clone()) {
            old.stop.cancel();
        }
        tracing::info!(url = %self.inner.url, "Connected to Service Bus.");
        Ok(opened)
    }

    async fn open(&self) -> Result<Arc<ConnectionScope>, ServiceBusError> {
        let timeout = self.inner.timeout;
        let options = ConnectionOptions {
            container_id: unique_name("sb-inbox"),
            idle_timeout: Some(IDLE_TIMEOUT),
            properties: Some(client_properties()),
            tls_config: self.inner.tls.clone(),
            ..ConnectionOptions::default()
        };
        let connection = step(
            timeout,
            "connect",
            Connection::open_with(&self.inner.url, options),
        )
        .await?;
        let session = step(timeout, "begin a session", connection.begin()).await?;
        Ok(Arc::new(ConnectionScope {
            connection,
            session,
            nodes: StdMutex::default(),
            refreshing: StdMutex::default(),
            stop: self.inner.closed.child_token(),
        }))
    }

    /// True while a connection is open and healthy (false before the first use, while
    /// reconnecting, and after a failure).
    pub fn is_connected(&self) -> bool {
        self.current().is_some()
    }

    /// Makes sure a valid token for `entity` is on `conn`: puts one (and starts its refresh,
    /// one task per audience per connection) unless one is kept fresh there already, or
    /// `fresh` asks for a new one (after the service detached a link as unauthorized).
    pub(crate) async fn authorize(
        &self,
        conn: &Arc<ConnectionScope>,
        entity: &str,
        fresh: bool,
    ) -> Result<(), ServiceBusError> {
        let audience = self.audience(entity);
        if !fresh && conn.is_refreshing(&audience) {
            return Ok(());
        }
        let token = self.inner.tokens.token(&audience).await?;
        cbs::put_token(conn, &audience, &token, self.inner.timeout).await?;
        if conn.start_refreshing(&audience) {
            self.spawn_refresh(conn, audience, token.expires_at);
        }
        Ok(())
    }

    /// Refreshes the token for `audience` on `conn` until the connection fails or is dropped,
    /// or the client goes away. The task holds neither.
    fn spawn_refresh(&self, conn: &Arc<ConnectionScope>, audience: String, expires_at: SystemTime) {
        let (tokens, weak, timeout) = (
            self.inner.tokens.clone(),
            Arc::downgrade(conn),
            self.inner.timeout,
        );
        let stop = conn.stop.clone();
        tokio::spawn(stop.run_until_cancelled_owned(async move {
            let remaining = |at: SystemTime| {
                at.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
            };
            let mut delay = refresh_delay(remaining(expires_at));
            loop {
                tokio::time::sleep(delay).await;
                let Some(conn) = weak.upgrade().filter(|c| c.is_healthy()) else {
                    return;
                };
                let refreshed = async {
                    let token = tokens.token(&audience).await?;
                    cbs::put_token(&conn, &audience, &token, timeout).await?;
                    Ok::<_, ServiceBusError>(token.expires_at)
                }
                .await;
                delay = match refreshed {
                    Ok(next) => refresh_delay(remaining(next)),
                    Err(error) => {
                        tracing::warn!(%audience, %error, "Token refresh failed; retrying.");
                        REFRESH_RETRY
                    }
                };
            }
        }));
    }

    /// Sends `request` to `<entity>/$management` on the current connection, putting the
    /// entity's and the node's tokens first; an unauthorized answer is retried once after a
    /// fresh token.
    pub(crate) async fn management(
        &self,
        entity: &str,
        request: super::management::Request,
    ) -> Result<AnyMessage, ServiceBusError> {
        let node = management_node(entity);
        let request = request.into_message();
        let conn = self.connection().await?;
        let mut fresh = false;
        loop {
            // As for a receiver: the entity's token, then the node's.
            self.authorize(&conn, entity, fresh).await?;
            self.authorize(&conn, &node, fresh).await?;
            let replied = conn
                .request(&node, request.clone(), self.inner.timeout)
                .await;
            match replied {
                Ok(reply) => return Ok(reply),
                Err(error) if !fresh && recovery(&error) == Recovery::Reauthorize => fresh = true,
                Err(sb_amqp::Error::Timeout) => {
                    return Err(ServiceBusError::Connection(format!(
                        "{node} did not answer within {:?}",
                        self.inner.timeout
                    )));
                }
                Err(error) => return Err(ServiceBusError::from_amqp(&error)),
            }
        }
    }
}

/// The address of `entity`'s `$management` node (also its token audience's path).
pub(crate) fn management_node(entity: &str) -> String {
    format!("{entity}/{}", management::NODE_SUFFIX)
}

/// Runs one handshake step within `timeout`.
async fn step<T>(
    timeout: Duration,
    what: &str,
    future: impl Future<Output = sb_amqp::Result<T>>,
) -> Result<T, ServiceBusError> {
    match tokio::time::timeout(timeout, future).await {
        Ok(done) => done.map_err(|e| ServiceBusError::from_amqp(&e)),
        Err(_) => Err(ServiceBusError::Connection(format!(
            "could not {what} within {timeout:?}"
        ))),
    }
}

/// When to refresh a token that is valid for `remaining`: 10 minutes before it expires but not
/// within 2 minutes (.NET `AmqpConnectionScope.CalculateLinkAuthorizationRefreshInterval`);
/// a token too short-lived for that is refreshed at half its life, never after it expired.
pub(crate) fn refresh_delay(remaining: Duration) -> Duration {
    let due = remaining.saturating_sub(REFRESH_BUFFER).max(MIN_REFRESH);
    if due < remaining {
        due
    } else {
        (remaining / 2).max(Duration::from_secs(1))
    }
}

/// The connection properties the SDKs send in `open` (product, version, platform, user agent:
/// .NET `AmqpConnectionScope.CreateAndOpenConnectionAsync`, Python `_common/utils.py`
/// `create_properties`).
pub(crate) fn client_properties() -> Fields {
    let version = env!("CARGO_PKG_VERSION");
    let platform = format!("Rust; {} {}", std::env::consts::OS, std::env::consts::ARCH);
    let mut fields = OrderedMap::new();
    for (key, value) in [
        (open_property::PRODUCT, "sb-inbox".to_owned()),
        (open_property::VERSION, version.to_owned()),
        (open_property::PLATFORM, platform.clone()),
        (open_property::FRAMEWORK, "Rust".to_owned()),
        (
            open_property::USER_AGENT,
            format!("sb-inbox/{version} ({platform})"),
        ),
    ] {
        fields.insert(Symbol::from(key), Value::String(value));
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_refresh_ten_minutes_ahead_but_not_within_two_minutes() {
        let minutes = |m: u64| Duration::from_secs(m * 60);
        assert_eq!(refresh_delay(minutes(60)), minutes(50));
        assert_eq!(refresh_delay(minutes(11)), minutes(2));
        assert_eq!(refresh_delay(minutes(5)), minutes(2));
        // Shorter than the minimum: half its life, before it expires.
        assert_eq!(
            refresh_delay(Duration::from_secs(90)),
            Duration::from_secs(45)
        );
        assert_eq!(refresh_delay(Duration::ZERO), Duration::from_secs(1));
    }

    #[test]
    fn open_carries_product_version_platform_and_user_agent() {
        let properties = client_properties();
        for key in ["product", "version", "platform", "user-agent"] {
            assert!(
                properties.get(&Symbol::from(key)).is_some(),
                "{key} missing"
            );
        }
        assert_eq!(
            properties.get(&Symbol::from("product")),
            Some(&Value::String("sb-inbox".into()))
        );
    }
}
