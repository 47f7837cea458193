//! Transport: URL parsing, TCP, TLS (rustls with the `ring` provider) and WebSockets.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::core::BoxIo;
use crate::error::{Error, Result};
use crate::sasl::SaslClient;

/// A parsed `amqp://`, `amqps://`, `ws://` or `wss://` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// True for `amqps` and `wss`.
    pub tls: bool,
    /// Host name or IP.
    pub host: String,
    /// Port (default 5672, 5671 for `amqps`, 80 for `ws`, 443 for `wss`).
    pub port: u16,
    /// For `ws`/`wss`: the WebSocket path (default `/$servicebus/websocket`).
    pub websocket: Option<String>,
    /// SASL choice derived from the user info: PLAIN with credentials, else ANONYMOUS.
    pub sasl: SaslClient,
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Address {
    /// Parses `amqp[s]://[user:pass@]host[:port][/path]` or `ws[s]://host[:port][/path]`
    /// (AMQP over WebSockets).
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for other schemes or a bad port, and for `ws`/`wss` in a
    /// build without the `websockets` feature.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = || Error::InvalidAddress(url.to_string());
        let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
        let (tls, websocket) = match scheme.to_ascii_lowercase().as_str() {
            "amqp" => (false, false),
            "amqps" => (true, false),
            #[cfg(feature = "websockets")]
            "ws" => (false, true),
            #[cfg(feature = "websockets")]
            "wss" => (true, true),
            #[cfg(not(feature = "websockets"))]
            "ws" | "wss" => {
                let why = crate::websocket::NO_FEATURE;
                return Err(Error::InvalidAddress(format!("{url}: {why}")));
            }
            _ => return Err(bad()),
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let websocket = websocket.then(|| match &rest[authority.len()..] {
            "" | "/" => crate::websocket::SERVICE_BUS_PATH.to_owned(),
            path => path.to_owned(),
        });
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = if let Some(stripped) = hostport.strip_prefix('[') {
            let (h, p) = stripped.split_once(']').ok_or_else(bad)?;
            (h.to_string(), p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(bad());
        }
        let port = match (port, websocket.is_some()) {
            (Some(p), _) => p.parse().map_err(|_| bad())?,
            (None, true) if tls => 443,
            (None, true) => 80,
            (None, false) if tls => 5671,
            (None, false) => 5672,
        };
        let sasl = match userinfo {
            Some(u) => {
                let (user, pass) = u.split_once(':').unwrap_or((u, ""));
                SaslClient::Plain {
                    username: percent_decode(user),
                    password: percent_decode(pass),
                }
            }
            None => SaslClient::Anonymous,
        };
        Ok(Self {
            tls,
            host,
            port,
            websocket,
            sasl,
        })
    }
}

/// A TLS client configuration using the Mozilla roots from `webpki-roots` and the `ring`
/// crypto provider.
///
/// # Errors
/// [`Error::Tls`] if the provider rejects the protocol versions.
pub fn default_tls_config() -> Result<Arc<rustls::ClientConfig>> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange). ring is kept on
    // purpose: the project's one provider, lighter to build than aws-lc-rs.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// Opens TCP (through `proxy` for `ws`/`wss`), TLS when asked, and the WebSocket for
/// `ws`/`wss` addresses.
pub(crate) async fn connect_to(
    a: &Address,
    tls: Option<Arc<rustls::ClientConfig>>,
    proxy: Option<&crate::HttpProxy>,
) -> Result<BoxIo> {
    match &a.websocket {
        Some(path) => {
            let tcp = match proxy {
                Some(proxy) => crate::proxy::tunnel(proxy, &a.host, a.port).await?,
                None => tcp(&a.host, a.port).await?,
            };
            let io = secure(tcp, &a.host, tls).await?;
            crate::websocket::client(io, a.tls, &a.host, a.port, path).await
        }
        None => connect(&a.host, a.port, tls).await,
    }
}

async fn tcp(host: &str, port: u16) -> Result<TcpStream> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// Opens TCP (and TLS when asked) to `host:port`.
pub(crate) async fn connect(
    host: &str,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<BoxIo> {
    secure(tcp(host, port).await?, host, tls).await
}

/// TLS over `tcp` when asked, verifying `host`.
async fn secure(
    tcp: TcpStream,
    host: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<BoxIo> {
    match tls {
        None => Ok(Box::new(tcp)),
        Some(cfg) => {
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| Error::Tls(format!("bad server name {host}: {e}")))?;
            let s = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await
                .map_err(|e| Error::Tls(e.to_string()))?;
            Ok(Box::new(s))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        let a = Address::parse("amqp://guest:gu%40st@127.0.0.1:5673").unwrap();
        assert_eq!(a.host, "127.0.0.1");
        assert_eq!(a.port, 5673);
        assert!(!a.tls);
        assert_eq!(
            a.sasl,
            SaslClient::Plain {
                username: "guest".into(),
                password: "gu@st".into()
            }
        );
        let b = Address::parse("amqps://ns.example.net/q1").unwrap();
        assert_eq!(b.port, 5671);
        assert!(b.tls);
        assert_eq!(b.sasl, SaslClient::Anonymous);
        let ws = Address::parse("wss://ns.servicebus.windows.net").unwrap();
        assert_eq!((ws.port, ws.tls), (443, true));
        assert_eq!(ws.websocket.as_deref(), Some("/$servicebus/websocket"));
        let ws = Address::parse("ws://127.0.0.1:8080/$servicebus/websocket").unwrap();
        assert_eq!((ws.port, ws.tls), (8080, false));
        assert_eq!(ws.websocket.as_deref(), Some("/$servicebus/websocket"));
        assert_eq!(a.websocket, None);
        assert!(Address::parse("http://x").is_err());
        assert!(Address::parse("amqp://h:notaport").is_err());
    }
}
