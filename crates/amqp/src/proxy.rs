//! HTTP `CONNECT` tunnels: AMQP over WebSockets through a forward proxy, the usual reason to
//! choose WebSockets (a proxied, inspected egress). As in the official SDKs only `ws`/`wss` use
//! the proxy: .NET `ServiceBusClientOptions.WebProxy` ("a proxy cannot be used for communication
//! over the raw AMQP protocol"), Python `_common/_configuration.py` (`http_proxy` switches the
//! transport to `AmqpOverWebsocket`), JS `samples/.../gettingStarted/useProxy.js` (a proxy agent
//! on the WebSocket). The tunnel is opened before TLS, so the proxy sees host and port only.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::error::{Error, Result};

/// The largest proxy response head we read before giving up on it.
const MAX_RESPONSE_HEAD: usize = 8 * 1024;

/// An HTTP forward proxy reached over plain TCP (`http://host:port`).
#[derive(Clone, PartialEq, Eq)]
pub struct HttpProxy {
    /// The proxy's host name or IP.
    pub host: String,
    /// The proxy's port.
    pub port: u16,
    /// The `Proxy-Authorization` header value sent with `CONNECT` (e.g. `Basic …` for a proxy
    /// URL's `user:password`), if the proxy asks for credentials. Never logged.
    pub authorization: Option<String>,
}

impl std::fmt::Debug for HttpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credentials are a secret: only whether there are any.
        f.debug_struct("HttpProxy")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .finish()
    }
}

/// Opens TCP to `proxy` and asks it for a tunnel to `host:port`.
///
/// # Errors
/// I/O errors, and [`Error::Proxy`] when the proxy refuses or answers something else than HTTP.
pub(crate) async fn tunnel(proxy: &HttpProxy, host: &str, port: u16) -> Result<TcpStream> {
    let mut tcp = TcpStream::connect((proxy.host.as_str(), proxy.port)).await?;
    tcp.set_nodelay(true)?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let credentials = proxy
        .authorization
        .as_ref()
        .map(|value| format!("Proxy-Authorization: {value}\r\n"))
        .unwrap_or_default();
    let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{credentials}\r\n");
    tcp.write_all(request.as_bytes()).await?;
    // Byte by byte up to the blank line: anything after it is the tunnelled peer's.
    let mut head = Vec::with_capacity(128);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_RESPONSE_HEAD {
            return Err(Error::Proxy(format!(
                "{}:{}: response head longer than {MAX_RESPONSE_HEAD} bytes",
                proxy.host, proxy.port
            )));
        }
        let byte = tcp.read_u8().await?;
        head.push(byte);
    }
    let head = String::from_utf8_lossy(&head);
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line.split_whitespace().nth(1);
    if !status_line.starts_with("HTTP/1.") || status.is_none_or(|s| !s.starts_with('2')) {
        return Err(Error::Proxy(format!(
            "{}:{} refused CONNECT {authority}: {status_line}",
            proxy.host, proxy.port
        )));
    }
    Ok(tcp)
}
