//! [`ServiceBusClient`]: one connection per namespace (`ConnectionScope`: the connection, its
//! session and its request/response nodes), tokens put on `$cbs` and kept fresh, and
//! `$management` requests.
//!
//! The client owns the connection; its links (sender, receiver, session receiver) each hold a
//! client to reach it and are made in their own modules (`impl ServiceBusClient` blocks there),
//! so this module imports none of them and they report failures to the connection's scope.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::OrderedMap;
use sb_amqp::servicebus::{management, open_property};
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::primitives::Symbol;
use sb_amqp::{AnyMessage, Connection, ConnectionOptions, unique_name};
use tokio_util::sync::CancellationToken;

use super::error::{Recovery, recovery};
use super::scope::{ConnectionScope, LinkKind};
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
/// How long every operation of a client waits after the service answered busy: .NET
/// `ServiceBusRetryPolicy` / `RetryPolicy.ServerBusyBaseSleepTime` (10 s, client-wide: while
/// `IsServerBusy`, every operation of the client adds that wait); Java waits 4 s
/// (`ServerBusyException`: "wait at least 4 seconds before any retry",
/// `ClientConstants.ServerBusyBaseSleepTimeInSecs`).
pub const DEFAULT_SERVER_BUSY_WAIT: Duration = Duration::from_secs(10);
/// A Service Bus client: one connection, re-established only after a connection-level
/// failure; a failed link is re-attached on the same connection.
///
/// # Examples
/// ```
/// use sb_servicebus::ServiceBusClient;
/// let cs = "Endpoint=sb://127.0.0.1:5699;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true";
/// let client = ServiceBusClient::from_connection_string(&cs.parse()?);
/// // Links attach on first use.
/// let receiver = client.receiver("orders", 0);
/// assert_eq!(receiver.entity(), "orders");
/// # Ok::<(), sb_servicebus::ConnectionStringError>(())
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
    /// The `CONNECT` proxy for `wss` (already matched against `NO_PROXY` for `host`).
    proxy: Option<sb_amqp::HttpProxy>,
    current: StdMutex<Option<Arc<ConnectionScope>>>,
    /// One connection setup at a time (azure-amqp `Singleton`): callers that find no healthy
    /// connection wait for the one being opened instead of opening their own.
    opening: tokio::sync::Mutex<()>,
    /// Client-wide server-busy state (.NET `ServiceBusRetryPolicy`).
    busy: super::busy::BusyState,
    retry: super::RetryOptions,
    /// Opens the byte stream instead of TCP/TLS when set ([`ServiceBusClient::with_connector`]).
    connector: Option<super::Connector>,
    /// The host clock lock arithmetic reads ([`ServiceBusClient::with_clock`]).
    clock: super::WallClock,
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
        Self::build(
            url.into(),
            host.into(),
            tokens,
            DEFAULT_TIMEOUT,
            DEFAULT_SERVER_BUSY_WAIT,
            None,
            None,
            super::RetryOptions::default(),
            (None, super::WallClock::system()),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        url: String,
        host: String,
        tokens: Arc<dyn TokenProvider>,
        timeout: Duration,
        busy_wait: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
        proxy: Option<sb_amqp::HttpProxy>,
        retry: super::RetryOptions,
        seam: (Option<super::Connector>, super::WallClock),
    ) -> Self {
        let (connector, clock) = seam;
        ServiceBusClient {
            inner: Arc::new(ClientInner {
                url,
                host,
                tokens,
                timeout,
                tls,
                proxy,
                current: StdMutex::new(None),
                opening: tokio::sync::Mutex::new(()),
                busy: super::busy::BusyState::new(busy_wait),
                retry,
                connector,
                clock,
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
            self.inner.busy.wait(),
            self.inner.tls.clone(),
            self.inner.proxy.clone(),
            self.inner.retry,
            self.seam(),
        )
    }

    /// The same client waiting `wait` before any operation once the service answered busy
    /// ([`DEFAULT_SERVER_BUSY_WAIT`], .NET's 10 s, unless set; Java uses 4 s). Call
    /// before first use.
    #[must_use]
    pub fn with_server_busy_wait(self, wait: Duration) -> Self {
        Self::build(
            self.inner.url.clone(),
            self.inner.host.clone(),
            self.inner.tokens.clone(),
            self.inner.timeout,
            wait,
            self.inner.tls.clone(),
            self.inner.proxy.clone(),
            self.inner.retry,
            self.seam(),
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
            self.inner.busy.wait(),
            Some(roots.client_config()?),
            self.inner.proxy.clone(),
            self.inner.retry,
            self.seam(),
        ))
    }

    /// The same client opening AMQP over WebSockets through the HTTP proxy `proxy` chooses
    /// for the namespace's host (a `CONNECT` tunnel, then TLS end to end; plain AMQP never
    /// uses it). Without this call no proxy is used; pass [`super::ProxyConfig::from_env`] to
    /// follow `HTTPS_PROXY` / `NO_PROXY`. Call before first use.
    #[must_use]
    pub fn with_proxy(self, proxy: &super::ProxyConfig) -> Self {
        Self::build(
            self.inner.url.clone(),
            self.inner.host.clone(),
            self.inner.tokens.clone(),
            self.inner.timeout,
            self.inner.busy.wait(),
            self.inner.tls.clone(),
            proxy.proxy_for(&self.inner.host).cloned(),
            self.inner.retry,
            self.seam(),
        )
    }

    /// The same client retrying sends and settlements as `retry` says
    /// ([`RetryOptions::default`](super::RetryOptions::default) unless set). Call before first
    /// use.
    #[must_use]
    pub fn with_retry(self, retry: super::RetryOptions) -> Self {
        Self::build(
            self.inner.url.clone(),
            self.inner.host.clone(),
            self.inner.tokens.clone(),
            self.inner.timeout,
            self.inner.busy.wait(),
            self.inner.tls.clone(),
            self.inner.proxy.clone(),
            retry,
            self.seam(),
        )
    }

    /// How the client retries.
    pub fn retry(&self) -> &super::RetryOptions {
        &self.inner.retry
    }

    /// The same client opening its connections through `connector` instead of TCP (and TLS,
    /// WebSockets, the proxy): an in-memory or simulated network. The connection string's
    /// host, SASL mechanism and credentials are used as over TCP. Call before first use.
    #[must_use]
    pub fn with_connector(self, connector: super::Connector) -> Self {
        let mut seam = self.seam();
        seam.0 = Some(connector);
        self.rebuilt(seam)
    }

    /// The same client reading the host's time from `clock` where it compares lock ends
    /// (settlement deadlines, locks that ran out on the link) and schedules token refreshes;
    /// the system clock unless set. Call before first use.
    #[must_use]
    pub fn with_clock(self, clock: super::WallClock) -> Self {
        let mut seam = self.seam();
        seam.1 = clock;
        self.rebuilt(seam)
    }

    /// The host's time, from [`ServiceBusClient::with_clock`]'s clock.
    pub(crate) fn now(&self) -> SystemTime {
        self.inner.clock.now()
    }

    fn seam(&self) -> (Option<super::Connector>, super::WallClock) {
        (self.inner.connector.clone(), self.inner.clock.clone())
    }

    fn rebuilt(&self, seam: (Option<super::Connector>, super::WallClock)) -> Self {
        Self::build(
            self.inner.url.clone(),
            self.inner.host.clone(),
            self.inner.tokens.clone(),
            self.inner.timeout,
            self.inner.busy.wait(),
            self.inner.tls.clone(),
            self.inner.proxy.clone(),
            self.inner.retry,
            seam,
        )
    }

    /// The client-wide server-busy state.
    pub(crate) fn busy(&self) -> &super::busy::BusyState {
        &self.inner.busy
    }

    /// The bound of each handshake step and request.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
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
    pub fn host(&self) -> &str {
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

    /// The current connection, opening one if there is none or the last one failed; after
    /// the service ended our session on a connection that lives, a new session on it.
    ///
    /// Single-flight (azure-amqp `Singleton`, issue 27): the callers that find no healthy
    /// connection queue behind one setup and share its result, so a dropped connection with
    /// many operations in flight opens one connection, not one each. A black-holed handshake
    /// holds its callers for the timeout, as it would each of them anyway.
    pub(crate) async fn connection(&self) -> Result<Arc<ConnectionScope>, ServiceBusError> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let _opening = self.inner.opening.lock().await;
        if let Some(current) = self.current() {
            // Opened by the caller we queued behind.
            return Ok(current);
        }
        let previous = self
            .inner
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        // The session ended but the connection lives: only the session is rebuilt (.NET
        // `AmqpConnectionScope` opens a session per link on the same connection).
        let reuse = previous
            .as_ref()
            .filter(|p| p.connection.error().is_none() && !p.is_poisoned())
            .map(|p| p.connection.clone());
        let rebuilt = reuse.is_some();
        let opened = self.open(reuse).await?;
        if let Some(old) = self
            .inner
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(opened.clone())
        {
            old.stop.cancel();
        }
        if rebuilt {
            tracing::info!(url = %self.inner.url, "Began a new session on the Service Bus connection.");
        } else {
            tracing::info!(url = %self.inner.url, "Connected to Service Bus.");
        }
        Ok(opened)
    }

    /// A new scope: on `reuse` (a new session only) or on a new connection.
    async fn open(
        &self,
        reuse: Option<Connection>,
    ) -> Result<Arc<ConnectionScope>, ServiceBusError> {
        let timeout = self.inner.timeout;
        let connection = match reuse {
            Some(connection) => connection,
            None => self.connect().await?,
        };
        let session = step(timeout, "begin a session", connection.begin()).await?;
        Ok(Arc::new(ConnectionScope {
            connection,
            session,
            nodes: StdMutex::default(),
            refreshing: StdMutex::default(),
            stop: self.inner.closed.child_token(),
            session_ended: AtomicBool::new(false),
            internal_errors: StdMutex::default(),
            authorizing: StdMutex::default(),
        }))
    }

    async fn connect(&self) -> Result<Connection, ServiceBusError> {
        let timeout = self.inner.timeout;
        let options = ConnectionOptions {
            container_id: unique_name("sb-servicebus"),
            idle_timeout: Some(IDLE_TIMEOUT),
            properties: Some(client_properties()),
            tls_config: self.inner.tls.clone(),
            http_proxy: self.inner.proxy.clone(),
            max_unfinished_bytes: super::limits::MAX_UNFINISHED_BYTES,
            ..ConnectionOptions::default()
        };
        let Some(connector) = &self.inner.connector else {
            return step(
                timeout,
                "connect",
                Connection::open_with(&self.inner.url, options),
            )
            .await;
        };
        // As `open_with` derives them from the URL, without its transport.
        let address =
            sb_amqp::Address::parse(&self.inner.url).map_err(|e| ServiceBusError::from_amqp(&e))?;
        let options = ConnectionOptions {
            sasl: Some(address.sasl.clone()),
            hostname: Some(address.host.clone()),
            ..options
        };
        let host = address.host.clone();
        step(timeout, "connect", async move {
            let io = connector.connect(&host).await?;
            Connection::open_io(io, options).await
        })
        .await
    }

    /// Takes note of a link failure on the current connection (see
    /// `ConnectionScope::observe`), for callers that keep no scope of their own.
    pub(crate) fn observe(&self, error: &sb_amqp::Error) {
        if let Some(current) = self.current() {
            current.observe(error);
        }
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
        // Single-flight per (connection, audience): who waited finds the token put.
        let guard = conn.authorizing(&audience);
        let _putting = guard.lock().await;
        if !fresh && conn.is_refreshing(&audience) {
            return Ok(());
        }
        let token = token_within(self.inner.tokens.as_ref(), &audience, self.inner.timeout).await?;
        cbs::put_token(conn, &audience, &token, self.inner.timeout).await?;
        if conn.start_refreshing(&audience) {
            self.spawn_refresh(conn, audience, token.expires_at);
        }
        Ok(())
    }

    /// Refreshes the token for `audience` on `conn` until the connection fails or is dropped,
    /// or the client goes away. The task holds neither.
    fn spawn_refresh(&self, conn: &Arc<ConnectionScope>, audience: String, expires_at: SystemTime) {
        let (tokens, weak, timeout, clock) = (
            self.inner.tokens.clone(),
            Arc::downgrade(conn),
            self.inner.timeout,
            self.inner.clock.clone(),
        );
        let stop = conn.stop.clone();
        tokio::spawn(stop.run_until_cancelled_owned(async move {
            let remaining =
                |at: SystemTime| at.duration_since(clock.now()).unwrap_or(Duration::ZERO);
            let mut delay = refresh_delay(remaining(expires_at));
            loop {
                tokio::time::sleep(delay).await;
                let Some(conn) = weak.upgrade().filter(|c| c.is_healthy()) else {
                    return;
                };
                let refreshed = async {
                    let token = token_within(tokens.as_ref(), &audience, timeout).await?;
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
        // Boxed: a request's state (authorization, the request link's exchange) is about 7 KiB,
        // and every future that may fall back to `$management` would carry it inline: a
        // delivery's settlement and its lock renewal, held for each delivery in flight although
        // they almost always settle on the link (issue 42).
        Box::pin(self.management_unboxed(entity, request)).await
    }

    async fn management_unboxed(
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
                // The service stopped honouring the token it was given (revoked, or its view
                // of it expired before our refresh): put a fresh one and ask once more
                // (Python `mgmt_handlers.default` raises on 401; .NET re-authorizes the link).
                Ok(reply) if !fresh && super::management::is_unauthorized(&reply) => {
                    tracing::warn!(%node, "$management answered 401; putting a fresh token.");
                    fresh = true;
                }
                Ok(reply) => {
                    if super::management::is_success(&reply) {
                        conn.observe_healthy(LinkKind::Node);
                    }
                    return Ok(reply);
                }
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

/// A token for `audience` within `timeout`: a hung identity endpoint must not hang a
/// re-attach or a refresh (.NET bounds token acquisition by the operation's try timeout,
/// `AmqpConnectionScope.RequestAuthorizationUsingCbsAsync`).
pub(crate) async fn token_within(
    tokens: &dyn TokenProvider,
    audience: &str,
    timeout: Duration,
) -> Result<super::AccessToken, ServiceBusError> {
    tokio::time::timeout(timeout, tokens.token(audience))
        .await
        .unwrap_or_else(|_| {
            Err(ServiceBusError::Token(format!(
                "no token for {audience} within {timeout:?}"
            )))
        })
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
        (open_property::PRODUCT, "sb-servicebus".to_owned()),
        (open_property::VERSION, version.to_owned()),
        (open_property::PLATFORM, platform.clone()),
        (open_property::FRAMEWORK, "Rust".to_owned()),
        (
            open_property::USER_AGENT,
            format!("sb-servicebus/{version} ({platform})"),
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

    /// A settlement or a lock renewal may fall back to `$management`, and each delivery in
    /// flight holds its settlement's future: the request's own state must be allocated when a
    /// request is made, not carried inline by every such future. Before, a request future took
    /// 7 KiB (release build), a delivery's `complete()` 8.7 KiB.
    #[test]
    fn a_management_request_holds_its_state_apart() {
        let cs: ConnectionString = "Endpoint=sb://127.0.0.1:5699;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;"
            .parse()
            .unwrap();
        let client = ServiceBusClient::from_connection_string(&cs);
        let request = client.management(
            "orders",
            crate::management::Request::renew_lock(uuid::Uuid::nil()),
        );
        let size = std::mem::size_of_val(&request);
        assert!(
            size < 1024,
            "a management request's future takes {size} bytes"
        );
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
            Some(&Value::String("sb-servicebus".into()))
        );
    }
}
