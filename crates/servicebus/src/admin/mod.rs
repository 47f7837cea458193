//! A small client of the Service Bus management API (Atom entries over HTTPS under
//! `https://<namespace>/<entity>?api-version=2021-05`, Microsoft Learn "Service Bus management
//! REST API"): read a queue's or subscription's settings and message counts, create or update
//! one for provisioning. The same credentials as AMQP authorise it (a shared access signature
//! for the request URL, or an Entra ID token as `Bearer`), on the same trust roots.
//!
//! # Layout
//! - this file: [`AdminClient`], [`EntityProperties`], [`EntityCounts`], [`AdminError`].
//! - `http`: one HTTP/1.1 request per connection over tokio-rustls (or plain TCP for the
//!   emulator's `--http-listen`), directly or through the proxy's `CONNECT` tunnel, bounded.
//!
//! # Retries and bounds (protocol3 F4)
//! As .NET's `ServiceBusAdministrationClient` on the Azure.Core pipeline: a request answered
//! 408, 429, 500, 502, 503 or 504 (Azure.Core `ResponseClassifier.IsRetriableResponse`), or that
//! could not reach the service, is tried again up to [`DEFAULT_MAX_RETRIES`] times, after the
//! answer's `Retry-After` when it gives one, else an exponential backoff from
//! [`DEFAULT_RETRY_DELAY`] (Azure.Core `RetryOptions`: 3 retries, 0.8 s, exponential). Each try
//! is bounded: [`DEFAULT_CONNECT_TIMEOUT`] to connect, [`DEFAULT_TRY_TIMEOUT`] for the token,
//! the tunnel, TLS and the exchange (Azure.Core's per-try `NetworkTimeout`).
//! - `atom`: reading descriptions, writing the one a create or update sends.
//!
//! # Examples
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use sb_servicebus::ConnectionString;
//! use sb_servicebus::admin::AdminClient;
//! let cs: ConnectionString = "Endpoint=sb://my-ns.servicebus.windows.net/;SharedAccessKeyName=manage;SharedAccessKey=…".parse()?;
//! let admin = AdminClient::from_connection_string(&cs)?;
//! if let Some(orders) = admin.entity("orders").await? {
//!     println!("lock {:?}, {} active", orders.properties.lock_duration, orders.counts.active);
//! }
//! # Ok(()) }
//! ```

mod atom;
mod http;

use std::sync::Arc;
use std::time::Duration;

use super::{
    ConnectionString, ProxyConfig, SasProvider, TokenProvider, TokenType, TrustError, TrustRoots,
};
use http::{Endpoint, Transport};

/// How long a connect to the management endpoint (or the proxy) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one try may take after the connect: the token, the proxy tunnel, TLS, the request
/// and the whole response.
pub const DEFAULT_TRY_TIMEOUT: Duration = Duration::from_secs(30);
/// Retries after a retriable answer or a failure to reach the service (Azure.Core
/// `RetryOptions.MaxRetries`).
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// The first retry's delay, doubled for each next one (Azure.Core `RetryOptions.Delay`).
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(800);
/// The longest wait between tries, `Retry-After` included (Azure.Core `RetryOptions.MaxDelay`
/// is 1 min).
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// The management API version the client speaks (what the Python and JS SDKs send).
pub const API_VERSION: &str = "2021-05";

/// Why a management request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The endpoint could not be reached (transient).
    #[error("cannot reach the management endpoint {endpoint}")]
    Connect {
        /// `host:port`.
        endpoint: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed, e.g. the certificate is not trusted (permanent until the
    /// trust roots change).
    #[error("TLS to the management endpoint failed")]
    Tls(#[source] std::io::Error),
    /// Reading or writing the connection failed (transient).
    #[error("management request failed")]
    Io(#[source] std::io::Error),
    /// The trust roots could not be built.
    #[error("trust roots")]
    Trust(#[from] TrustError),
    /// A TLS endpoint without a TLS configuration.
    #[error("no TLS configuration for an https endpoint")]
    NoTrust,
    /// No token could be had for the request.
    #[error("no token for the management request")]
    Token(#[source] super::ServiceBusError),
    /// The service refused the credentials (401) or the right (403): permanent.
    #[error("the management API refused the request ({status}): {detail}")]
    Unauthorized {
        /// 401 or 403.
        status: u16,
        /// The service's explanation.
        detail: String,
    },
    /// The entity does not exist (404 on update or delete).
    #[error("not found: {0}")]
    NotFound(String),
    /// The entity already exists (409 on create).
    #[error("already exists: {0}")]
    Conflict(String),
    /// Any other error status.
    #[error("the management API answered {status}: {detail}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The service's explanation.
        detail: String,
    },
    /// The response could not be read.
    #[error("malformed management response: {0}")]
    Malformed(String),
    /// An endpoint URL that is not `http[s]://host[:port]`.
    #[error("invalid management endpoint {0:?}")]
    InvalidEndpoint(String),
    /// A step did not finish in time: the connect, or the answer (transient).
    #[error("the management endpoint {endpoint} did not {what} within {after:?}")]
    Timeout {
        /// `host:port` (the proxy's for a connect through it).
        endpoint: String,
        /// `connect`, `answer`, or `give a token`.
        what: &'static str,
        /// The bound.
        after: Duration,
    },
    /// The HTTP proxy refused the tunnel or answered something else than HTTP.
    #[error("proxy: {0}")]
    Proxy(String),
}

impl AdminError {
    /// Whether the management API could not be reached at all (connection refused, reset,
    /// timed out, the proxy refused): a caller may fall back to configured values.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            AdminError::Connect { .. }
                | AdminError::Io(_)
                | AdminError::Timeout { .. }
                | AdminError::Proxy(_)
        )
    }

    /// Whether trying again may help: unreachable, or answered 408, 429, 500, 502, 503 or 504
    /// (Azure.Core `ResponseClassifier.IsRetriableResponse`). What is left once the client's
    /// own retries ran out.
    pub fn is_transient(&self) -> bool {
        self.is_unreachable()
            || matches!(self, AdminError::Status { status, .. } if is_retriable(*status))
    }
}

/// Azure.Core `ResponseClassifier.IsRetriableResponse`: 408, 429, 500, 502, 503, 504.
fn is_retriable(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

/// The settings of a queue or subscription that a consumer depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntityProperties {
    /// `LockDuration`.
    pub lock_duration: Option<Duration>,
    /// `DefaultMessageTimeToLive`.
    pub default_message_time_to_live: Option<Duration>,
    /// `MaxDeliveryCount`.
    pub max_delivery_count: Option<u32>,
    /// `RequiresSession`.
    pub requires_session: bool,
    /// `DeadLetteringOnMessageExpiration`.
    pub dead_lettering_on_message_expiration: bool,
    /// `ForwardTo`: every message goes on to this entity instead.
    pub forward_to: Option<String>,
    /// `ForwardDeadLetteredMessagesTo`.
    pub forward_dead_lettered_messages_to: Option<String>,
}

/// Message counts (`MessageCount` and `CountDetails`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntityCounts {
    /// Every message, in any state and subqueue.
    pub total: u64,
    /// Receivable (and locked) messages.
    pub active: u64,
    /// In the dead-letter subqueue.
    pub dead_letter: u64,
    /// Scheduled for later.
    pub scheduled: u64,
    /// In the transfer queue (forwarding).
    pub transfer: u64,
    /// In the transfer dead-letter queue.
    pub transfer_dead_letter: u64,
}

/// A queue or subscription as the management API describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityDescription {
    /// Its settings.
    pub properties: EntityProperties,
    /// Its message counts.
    pub counts: EntityCounts,
}

/// The namespace as the management API describes it (`GET /$namespaceinfo`): what an SDK
/// sees of it, not the ARM resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NamespaceProperties {
    /// Its name.
    pub name: Option<String>,
    /// Its tier: `Basic`, `Standard` or `Premium`.
    pub messaging_sku: Option<String>,
    /// Its messaging units (Premium only).
    pub messaging_units: Option<u32>,
    /// `Messaging` for a Service Bus namespace.
    pub namespace_type: Option<String>,
    /// When it was created, as the service writes it (ISO 8601).
    pub created: Option<String>,
}

/// A client of the management API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    endpoint: Endpoint,
    tokens: Arc<dyn TokenProvider>,
    tls: Option<Arc<rustls::ClientConfig>>,
    proxy: ProxyConfig,
    connect_timeout: Duration,
    timeout: Duration,
    max_retries: u32,
    retry_delay: Duration,
}

impl AdminClient {
    /// A client for the connection string's namespace: HTTPS on its host (on the port the
    /// string names, as the emulator's TLS listener serves management beside `amqps`; else
    /// 443), signing with its key, trusting Mozilla's roots.
    ///
    /// # Errors
    /// [`AdminError::Trust`] when the default roots cannot be built.
    pub fn from_connection_string(cs: &ConnectionString) -> Result<Self, AdminError> {
        let port = cs.explicit_port().unwrap_or(443);
        Ok(Self::with_defaults(
            Endpoint {
                tls: true,
                host: cs.host().to_owned(),
                port,
            },
            Arc::new(SasProvider::new(cs.credential().clone())),
            TrustRoots::new().client_config()?,
        ))
    }

    /// A client for namespace `host` (HTTPS on 443) authorised by `tokens` (e.g. Entra ID),
    /// verifying the certificate with `trust`.
    ///
    /// # Errors
    /// [`AdminError::Trust`] for an unreadable bundle.
    pub fn for_namespace(
        host: &str,
        tokens: Arc<dyn TokenProvider>,
        trust: &TrustRoots,
    ) -> Result<Self, AdminError> {
        Ok(Self::with_defaults(
            Endpoint {
                tls: true,
                host: host.to_owned(),
                port: 443,
            },
            tokens,
            trust.client_config()?,
        ))
    }

    /// A client with the default bounds and retries, and no proxy.
    fn with_defaults(
        endpoint: Endpoint,
        tokens: Arc<dyn TokenProvider>,
        tls: Arc<rustls::ClientConfig>,
    ) -> Self {
        AdminClient {
            endpoint,
            tokens,
            tls: Some(tls),
            proxy: ProxyConfig::none(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TRY_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_delay: DEFAULT_RETRY_DELAY,
        }
    }

    /// Goes through `proxy` (`HTTPS_PROXY` / `NO_PROXY`, [`ProxyConfig::from_env`]) as the
    /// AMQP WebSocket connections do; without this call, directly.
    #[must_use]
    pub fn with_proxy(mut self, proxy: &ProxyConfig) -> Self {
        self.proxy = proxy.clone();
        self
    }

    /// Bounds each try: `connect` for the connect, `timeout` for the rest (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], [`DEFAULT_TRY_TIMEOUT`]).
    #[must_use]
    pub fn with_timeouts(mut self, connect: Duration, timeout: Duration) -> Self {
        self.connect_timeout = connect;
        self.timeout = timeout;
        self
    }

    /// Tries a retriable request `max_retries` more times, the first after `delay`, doubling
    /// (default [`DEFAULT_MAX_RETRIES`], [`DEFAULT_RETRY_DELAY`]); a `Retry-After` replaces
    /// the delay. 0: no retries.
    #[must_use]
    pub fn with_retries(mut self, max_retries: u32, delay: Duration) -> Self {
        self.max_retries = max_retries;
        self.retry_delay = delay;
        self
    }

    fn transport(&self) -> Transport {
        Transport {
            tls: self.tls.clone(),
            proxy: self.proxy.proxy_for(&self.endpoint.host).cloned(),
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
        }
    }

    /// Sends requests to `url` instead (`https://host[:port]`, or `http://host:port` for the
    /// emulator's plain `--http-listen`).
    ///
    /// # Errors
    /// [`AdminError::InvalidEndpoint`] for another form.
    pub fn with_endpoint(mut self, url: &str) -> Result<Self, AdminError> {
        let invalid = || AdminError::InvalidEndpoint(url.to_owned());
        let (scheme, rest) = url.split_once("://").ok_or_else(invalid)?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return Err(invalid()),
        };
        let authority = rest.trim_end_matches('/');
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().map_err(|_| invalid())?),
            None => (authority, if tls { 443 } else { 80 }),
        };
        if host.is_empty() || host.contains('/') {
            return Err(invalid());
        }
        self.endpoint = Endpoint {
            tls,
            host: host.to_owned(),
            port,
        };
        Ok(self)
    }

    /// Verifies the endpoint's certificate with `trust` (e.g. the emulator's generated CA).
    ///
    /// # Errors
    /// [`AdminError::Trust`] for an unreadable bundle.
    pub fn with_trust(mut self, trust: &TrustRoots) -> Result<Self, AdminError> {
        self.tls = Some(trust.client_config()?);
        Ok(self)
    }

    /// Authorises requests with `tokens` (an Entra ID provider sends `Bearer` tokens).
    #[must_use]
    pub fn with_token_provider(mut self, tokens: Arc<dyn TokenProvider>) -> Self {
        self.tokens = tokens;
        self
    }

    async fn authorization(&self, path: &str) -> Result<String, AdminError> {
        let audience = format!("https://{}/{path}", self.endpoint.host);
        // Bounded (N14): a hung identity endpoint must not hang the caller.
        let token = tokio::time::timeout(self.timeout, self.tokens.token(&audience))
            .await
            .map_err(|_| AdminError::Timeout {
                endpoint: "the token provider".to_owned(),
                what: "give a token",
                after: self.timeout,
            })?
            .map_err(AdminError::Token)?;
        Ok(match token.token_type {
            TokenType::Sas => token.token,
            TokenType::Jwt => format!("Bearer {}", token.token),
        })
    }

    /// Sends the request, trying again after a retriable answer or failure (see the module
    /// documentation), and classifies the final answer.
    async fn request(
        &self,
        method: &str,
        path: &str,
        extra: &[(&str, String)],
        body: Option<&str>,
    ) -> Result<http::HttpResponse, AdminError> {
        let path = path.trim_matches('/');
        let mut delay = self.retry_delay;
        let mut tries = 0;
        loop {
            tries += 1;
            let last = tries > self.max_retries;
            let wait = match self.try_once(method, path, extra, body).await {
                Ok(response) if last || !is_retriable(response.status) => {
                    return classify(response);
                }
                Ok(response) => {
                    tracing::debug!(status = response.status, retry_after = ?response.retry_after, tries, "Management request answered retriably; retrying.");
                    response.retry_after.unwrap_or(delay)
                }
                Err(error) if !last && error.is_unreachable() => {
                    tracing::debug!(%error, tries, "Management request failed; retrying.");
                    delay
                }
                Err(error) => return Err(error),
            };
            tokio::time::sleep(wait.min(MAX_RETRY_DELAY)).await;
            delay = delay.saturating_mul(2).min(MAX_RETRY_DELAY);
        }
    }

    async fn try_once(
        &self,
        method: &str,
        path: &str,
        extra: &[(&str, String)],
        body: Option<&str>,
    ) -> Result<http::HttpResponse, AdminError> {
        let mut headers = vec![("Authorization", self.authorization(path).await?)];
        headers.extend(extra.iter().map(|(n, v)| (*n, v.clone())));
        let target = format!("/{path}?api-version={API_VERSION}");
        http::send(
            &self.endpoint,
            &self.transport(),
            method,
            &target,
            &headers,
            body,
        )
        .await
    }
}

/// The final answer of a request: success, or the error its status names.
fn classify(response: http::HttpResponse) -> Result<http::HttpResponse, AdminError> {
    let detail = || atom::error_detail(&response.body);
    match response.status {
        200..=299 => Ok(response),
        401 | 403 => Err(AdminError::Unauthorized {
            status: response.status,
            detail: detail(),
        }),
        404 => Err(AdminError::NotFound(detail())),
        409 => Err(AdminError::Conflict(detail())),
        status => Err(AdminError::Status {
            status,
            detail: detail(),
        }),
    }
}

impl AdminClient {
    /// The settings and counts of a queue or subscription (`topic/Subscriptions/sub`);
    /// `None` when it does not exist.
    ///
    /// # Errors
    /// [`AdminError`] when the request fails or is refused.
    pub async fn entity(&self, path: &str) -> Result<Option<EntityDescription>, AdminError> {
        let response = self.request("GET", path, &[], None).await?;
        Ok(atom::read_entity(&response.body)?
            .map(|(properties, counts)| EntityDescription { properties, counts }))
    }

    /// Creates a queue or subscription (`topic/Subscriptions/sub`) with `properties` (what is
    /// `None` takes the service's default).
    ///
    /// # Errors
    /// [`AdminError::Conflict`] when it exists; others as [`AdminClient::entity`].
    pub async fn create(
        &self,
        path: &str,
        properties: &EntityProperties,
    ) -> Result<EntityDescription, AdminError> {
        self.put(path, properties, false).await
    }

    /// Replaces the settings of an existing queue or subscription.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] when it does not exist; others as [`AdminClient::entity`].
    pub async fn update(
        &self,
        path: &str,
        properties: &EntityProperties,
    ) -> Result<EntityDescription, AdminError> {
        self.put(path, properties, true).await
    }

    /// The namespace's properties: `GET /$namespaceinfo` (.NET
    /// `ServiceBusAdministrationClient.GetNamespacePropertiesAsync`, Python
    /// `ServiceBusAdministrationClient.get_namespace_properties`); any key with rights on the
    /// namespace may read it.
    ///
    /// # Errors
    /// [`AdminError::Malformed`] when the answer describes no namespace; others as
    /// [`AdminClient::entity`].
    pub async fn namespace_properties(&self) -> Result<NamespaceProperties, AdminError> {
        let response = self.request("GET", "$namespaceinfo", &[], None).await?;
        atom::read_namespace(&response.body)?
            .ok_or_else(|| AdminError::Malformed("no NamespaceInfo in the answer".to_owned()))
    }

    /// Deletes a queue, topic or subscription (`topic/Subscriptions/sub`) with its messages:
    /// `DELETE` on the entity's address (Microsoft Learn, "Service Bus management REST API",
    /// Delete Queue / Delete Subscription: 200 OK, 404 when it does not exist).
    ///
    /// # Errors
    /// [`AdminError::NotFound`] when it does not exist; others as [`AdminClient::entity`].
    pub async fn delete(&self, path: &str) -> Result<(), AdminError> {
        self.request("DELETE", path, &[], None).await.map(drop)
    }

    async fn put(
        &self,
        path: &str,
        properties: &EntityProperties,
        update: bool,
    ) -> Result<EntityDescription, AdminError> {
        let subscription = path.to_ascii_lowercase().contains("/subscriptions/");
        let body = atom::description_entry(properties, subscription);
        let if_match = [("If-Match", "*".to_owned())];
        let extra: &[(&str, String)] = if update { &if_match } else { &[] };
        let response = self.request("PUT", path, extra, Some(&body)).await?;
        atom::read_entity(&response.body)?
            .map(|(properties, counts)| EntityDescription { properties, counts })
            .ok_or_else(|| AdminError::Malformed("no description in the answer".into()))
    }
}
