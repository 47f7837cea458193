//! Transport: URL parsing, TCP and TLS (rustls with the `ring` provider).

use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::connection::BoxIo;
use crate::error::{Error, Result};
use crate::sasl::SaslClient;

/// A parsed `amqp://` or `amqps://` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// True for `amqps`.
    pub tls: bool,
    /// Host name or IP.
    pub host: String,
    /// Port (default 5672, or 5671 for `amqps`).
    pub port: u16,
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
    /// Parses `amqp[s]://[user:pass@]host[:port][/path]`.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for other schemes or a bad port.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = || Error::InvalidAddress(url.to_string());
        let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "amqp" => false,
            "amqps" => true,
            _ => return Err(bad()),
        };
        let authority = rest.split('/').next().unwrap_or_default();
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
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if tls => 5671,
            None => 5672,
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
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// Opens TCP (and TLS when asked) to `host:port`.
pub(crate) async fn connect(
    host: &str,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<BoxIo> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
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
        assert!(Address::parse("http://x").is_err());
        assert!(Address::parse("amqp://h:notaport").is_err());
    }
}
