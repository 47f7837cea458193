//! The client role: connecting ([`Connection::open`]): transport, protocol headers, SASL as a
//! client, and our `open`. What follows the `open` exchange is the role-neutral core.

use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp_types::definitions::Fields;
use tracing::Instrument;

use crate::core::open::{local_open, read_open, start};
use crate::core::sasl;
use crate::core::{BoxIo, Connection, FramedIo, unique_name};
use crate::error::{Error, Result};
use crate::frame::{AMQP_HEADER, SASL_HEADER};
use crate::sasl::SaslClient;
use crate::transport::{self, Address};

/// Options for a client connection.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    /// `container-id` sent in `open`.
    pub container_id: String,
    /// `hostname` sent in `open` and `sasl-init` (defaults to the URL's host).
    pub hostname: Option<String>,
    /// Largest frame we accept.
    pub max_frame_size: u32,
    /// Highest channel number we accept.
    pub channel_max: u16,
    /// Our idle timeout: the peer must send something at least this often.
    pub idle_timeout: Option<Duration>,
    /// SASL override; `None` derives it from the URL (PLAIN with user info, else ANONYMOUS).
    pub sasl: Option<SaslClient>,
    /// TLS client configuration for `amqps`; `None` uses [`transport::default_tls_config`].
    pub tls_config: Option<Arc<rustls::ClientConfig>>,
    /// `properties` sent in `open`.
    pub properties: Option<Fields>,
    /// For `ws`/`wss` only: the HTTP proxy to tunnel through with `CONNECT` (before TLS).
    pub http_proxy: Option<crate::HttpProxy>,
    /// Bytes all unfinished incoming deliveries of the connection may hold together, across
    /// its sessions and links; the link whose transfer would pass it is detached with
    /// `amqp:resource-limit-exceeded` (`0`: unbounded). Default
    /// [`DEFAULT_MAX_UNFINISHED_BYTES`](crate::DEFAULT_MAX_UNFINISHED_BYTES).
    pub max_unfinished_bytes: u64,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        Self {
            container_id: unique_name("sb-amqp"),
            hostname: None,
            max_frame_size: 256 * 1024,
            channel_max: 255,
            idle_timeout: None,
            sasl: None,
            tls_config: None,
            properties: None,
            http_proxy: None,
            max_unfinished_bytes: crate::DEFAULT_MAX_UNFINISHED_BYTES,
        }
    }
}

impl Connection {
    /// Connects to `amqp://[user:pass@]host[:port]`, `amqps://…`, or `ws[s]://host[:port][/path]`
    /// (AMQP over WebSockets) with default options.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn f() -> sb_amqp::Result<()> {
    /// let conn = sb_amqp::Connection::open("amqp://guest:guest@127.0.0.1:5672").await?;
    /// let session = conn.begin().await?;
    /// session.end().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Address, I/O, TLS, SASL and protocol errors.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, ConnectionOptions::default()).await
    }

    /// Connects with explicit options.
    ///
    /// # Errors
    /// Address, I/O, TLS, SASL and protocol errors.
    pub async fn open_with(url: &str, opts: ConnectionOptions) -> Result<Self> {
        let a = Address::parse(url)?;
        let tls = if a.tls {
            Some(match &opts.tls_config {
                Some(c) => c.clone(),
                None => transport::default_tls_config()?,
            })
        } else {
            None
        };
        let io = transport::connect_to(&a, tls, opts.http_proxy.as_ref()).await?;
        let mut opts = opts;
        if opts.sasl.is_none() {
            opts.sasl = Some(a.sasl.clone());
        }
        if opts.hostname.is_none() {
            opts.hostname = Some(a.host.clone());
        }
        Self::open_io(io, opts).await
    }

    /// Runs the protocol on an already connected stream (TCP, TLS or in-memory).
    ///
    /// # Errors
    /// I/O, SASL and protocol errors.
    pub async fn open_io(io: BoxIo, opts: ConnectionOptions) -> Result<Self> {
        let span =
            tracing::info_span!("amqp_connection", role = "client", container = %opts.container_id);
        async {
            let mut f = FramedIo::new(io, opts.max_frame_size);
            let host = opts.hostname.clone().unwrap_or_else(|| "localhost".into());
            let sasl = opts.sasl.clone().unwrap_or(SaslClient::Anonymous);
            if sasl != SaslClient::None {
                f.write_header(SASL_HEADER).await?;
                let h = f.read_header().await?.ok_or(Error::ConnectionLost)?;
                if h != SASL_HEADER {
                    return Err(Error::Protocol(format!(
                        "peer answered SASL header with {h:?}"
                    )));
                }
                sasl::client(&mut f, &sasl, &host).await?;
            }
            f.write_header(AMQP_HEADER).await?;
            let h = f.read_header().await?.ok_or(Error::ConnectionLost)?;
            if h != AMQP_HEADER {
                return Err(Error::Protocol(format!(
                    "peer answered AMQP header with {h:?}"
                )));
            }
            let open = local_open(
                &opts.container_id,
                Some(host),
                opts.max_frame_size,
                opts.channel_max,
                opts.idle_timeout,
                opts.properties.clone(),
            );
            f.write_frame(&crate::frame::Frame::amqp(0, open.clone()))
                .await?;
            let remote = read_open(&mut f).await?;
            tracing::debug!(peer = %remote.container_id, "Connection open.");
            Ok(start(
                f,
                &open,
                remote,
                opts.idle_timeout,
                opts.max_unfinished_bytes,
                None,
                tracing::Span::current(),
            ))
        }
        .instrument(span)
        .await
    }
}
