//! TLS for PostgreSQL connections (Azure Database for PostgreSQL requires it): rustls on ring,
//! the certificate chain and the host name always verified, against the webpki roots plus the
//! certificates of `sslrootcert`.
//!
//! `sslmode` follows libpq's names, with one deliberate difference: TLS is never used without
//! verification. `disable` (and no `sslmode` at all) is plain TCP; `prefer` is TLS when the
//! server offers it; `require`, `verify-ca` and `verify-full` insist on TLS.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::{Config, Socket};

use crate::ports::StoreError;

fn invalid(message: String) -> StoreError {
    StoreError::configuration(message)
}

/// Parses a `postgres://` URL or a libpq key/value string, taking out the parts
/// `tokio-postgres` does not know (`sslrootcert`, the `verify-*` modes).
///
/// # Errors
/// [`ErrorKind::Configuration`](crate::ports::ErrorKind::Configuration) for an unparseable string or an unreadable `sslrootcert`.
pub(crate) fn parse(url: &str) -> Result<(Config, PgTls), StoreError> {
    let (rest, options) = split_options(url)?;
    let mut config: Config = rest
        .parse()
        .map_err(|error| invalid(format!("invalid PostgreSQL URL: {error}")))?;
    config.ssl_mode(match options.mode.as_deref() {
        None | Some("disable") => SslMode::Disable,
        Some("prefer" | "allow") => SslMode::Prefer,
        Some("require" | "verify-ca" | "verify-full") => SslMode::Require,
        Some(other) => {
            return Err(invalid(format!(
                "invalid sslmode {other:?}: use disable, prefer, require, verify-ca or verify-full"
            )));
        }
    });
    let tls = PgTls::new(options.root_cert.as_deref())?;
    Ok((config, tls))
}

#[derive(Debug, Default)]
struct TlsOptions {
    mode: Option<String>,
    root_cert: Option<PathBuf>,
}

/// Removes `sslmode` and `sslrootcert` from the string and returns them.
fn split_options(url: &str) -> Result<(String, TlsOptions), StoreError> {
    let mut options = TlsOptions::default();
    let mut take = |key: &str, value: String| -> bool {
        match key {
            "sslmode" => options.mode = Some(value),
            "sslrootcert" => options.root_cert = Some(PathBuf::from(value)),
            _ => return false,
        }
        true
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), options));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| invalid(format!("invalid PostgreSQL URL: {key} is not UTF-8")))?;
            if !take(key, value.into_owned()) {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, options));
    }
    let mut kept = Vec::new();
    for word in url.split_whitespace() {
        match word.split_once('=') {
            Some((key, value)) if take(key.trim(), value.trim_matches('\'').to_owned()) => {}
            _ => kept.push(word),
        }
    }
    Ok((kept.join(" "), options))
}

/// The connector: one rustls configuration shared by every connection of a pool.
#[derive(Debug, Clone)]
pub(crate) struct PgTls {
    config: Arc<rustls::ClientConfig>,
}

impl PgTls {
    fn new(root_cert: Option<&Path>) -> Result<Self, StoreError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = root_cert {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|error| invalid(format!("sslrootcert {}: {error}", path.display())))?;
            if certs.is_empty() {
                return Err(invalid(format!(
                    "sslrootcert {}: no PEM certificate in the file",
                    path.display()
                )));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|error| invalid(format!("sslrootcert {}: {error}", path.display())))?;
            }
        }
        // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange). ring is kept on
        // purpose: the project's one provider, lighter to build than aws-lc-rs.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| invalid(format!("TLS configuration: {error}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(PgTls {
            config: Arc::new(config),
        })
    }
}

impl MakeTlsConnect<Socket> for PgTls {
    type Stream = PgTlsStream;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, io::Error> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        Ok(PgTlsConnect {
            config: self.config.clone(),
            name,
        })
    }
}

/// One handshake.
#[derive(Debug)]
pub(crate) struct PgTlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for PgTlsConnect {
    type Stream = PgTlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            let stream = connector.connect(self.name, stream).await?;
            Ok(PgTlsStream(stream))
        })
    }
}

/// A TLS session to the server.
#[derive(Debug)]
pub(crate) struct PgTlsStream(tokio_rustls::client::TlsStream<Socket>);

impl TlsStream for PgTlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding: the tls-server-end-point hash depends on the
        // certificate's signature algorithm, and a wrong one would fail every login.
        ChannelBinding::none()
    }
}

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ErrorKind;

    #[test]
    fn tls_options_are_taken_out_of_urls_and_key_value_strings() {
        let (rest, options) = split_options(
            "postgres://u@db/app?application_name=w&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@db/app?application_name=w");
        assert_eq!(options.mode.as_deref(), Some("verify-full"));
        assert_eq!(options.root_cert, Some(PathBuf::from("/etc/ca.pem")));

        let (rest, options) =
            split_options("host=db user=u sslmode=require sslrootcert='/etc/ca.pem'").unwrap();
        assert_eq!(rest, "host=db user=u");
        assert_eq!(options.mode.as_deref(), Some("require"));
        assert_eq!(options.root_cert, Some(PathBuf::from("/etc/ca.pem")));

        let (rest, options) = split_options("postgres://u@db/app").unwrap();
        assert_eq!(rest, "postgres://u@db/app");
        assert!(options.mode.is_none() && options.root_cert.is_none());
    }

    #[test]
    fn modes_map_to_tls_with_verification_or_none() {
        let mode = |url: &str| parse(url).map(|(config, _)| config.get_ssl_mode());
        assert_eq!(mode("postgres://u@db/app").unwrap(), SslMode::Disable);
        assert_eq!(
            mode("postgres://u@db/app?sslmode=prefer").unwrap(),
            SslMode::Prefer
        );
        assert_eq!(
            mode("postgres://u@db/app?sslmode=verify-full").unwrap(),
            SslMode::Require
        );
        let error = mode("postgres://u@db/app?sslmode=sometimes").unwrap_err();
        assert!(error.to_string().contains("sslmode"), "{error}");
        let error =
            parse("postgres://u@db/app?sslmode=require&sslrootcert=/no/such.pem").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Configuration);
        assert!(error.to_string().contains("/no/such.pem"), "{error}");
    }
}
