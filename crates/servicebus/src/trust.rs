//! Which certificate authorities the client trusts for `amqps` and `wss`: Mozilla's roots
//! (`webpki-roots`) by default, plus extra CA bundles (an inspecting proxy's or a test
//! emulator's CA) and, on request, the operating system's trust store.
//!
//! The SDKs use the platform's store (.NET `SslStream`, Python's `ssl` default context, which
//! honours `SSL_CERT_FILE`) and take a CA bundle as an option (Python `connection_verify`,
//! `azure/servicebus/_pyamqp/_transport.py`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A trust root that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// A CA bundle could not be read or parsed.
    #[error("cannot read the CA bundle {path}: {source}")]
    CaFile {
        /// The bundle.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A CA bundle holds no certificate rustls accepts as a root.
    #[error("the CA bundle {0} holds no usable certificate")]
    NoCertificate(PathBuf),
    /// The operating system's trust store could not be read at all.
    #[error("cannot read the operating system's trust store: {0}")]
    Native(String),
    /// rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Tls(#[from] rustls::Error),
}

/// The certificate authorities a Service Bus client trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustRoots {
    ca_files: Vec<PathBuf>,
    #[cfg(feature = "native-roots")]
    native: bool,
}

impl TrustRoots {
    /// Mozilla's roots only.
    pub fn new() -> Self {
        TrustRoots::default()
    }

    /// Also trusts the certificates in the PEM bundle `path`.
    #[must_use]
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_files.push(path.into());
        self
    }

    /// Also trusts the operating system's store (`rustls-native-certs`; feature
    /// `native-roots`).
    #[cfg(feature = "native-roots")]
    #[must_use]
    pub fn with_native_roots(mut self) -> Self {
        self.native = true;
        self
    }

    /// The rustls client configuration (ring) over these roots.
    ///
    /// # Errors
    /// [`TrustError`] for an unreadable bundle, an unreadable OS store, or refused settings.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, TrustError> {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for path in &self.ca_files {
            let certs = read_bundle(path)?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TrustError::NoCertificate(path.clone()));
            }
        }
        #[cfg(feature = "native-roots")]
        if self.native {
            let native = rustls_native_certs::load_native_certs();
            if native.certs.is_empty() && !native.errors.is_empty() {
                let why: Vec<String> = native.errors.iter().map(ToString::to_string).collect();
                return Err(TrustError::Native(why.join("; ")));
            }
            for error in &native.errors {
                tracing::warn!(%error, "Part of the operating system's trust store is unreadable; using the rest.");
            }
            roots.add_parsable_certificates(native.certs);
        }
        // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange). ring is kept on
        // purpose: the project's one provider, lighter to build than aws-lc-rs.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }
}

fn read_bundle(path: &Path) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let failed = |source| TrustError::CaFile {
        path: path.to_owned(),
        source,
    };
    CertificateDer::pem_file_iter(path)
        .map_err(failed)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)
}
