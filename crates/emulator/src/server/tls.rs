//! The TLS listener's identity: a server certificate for `localhost` and `127.0.0.1` signed by
//! a CA generated at start and written to a folder (so clients can trust that CA), or the
//! operator's own PEM certificate chain and key.
//!
//! The service serves AMQP over TLS on 5671 and AMQP over WebSockets on 443 (`wss`,
//! Microsoft Learn, "AMQP 1.0 in Azure Service Bus and Event Hubs protocol guide"); the
//! emulator serves both on one TLS port, told apart by the client's first bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// The generated CA's file in [`TlsIdentity::Generate`]'s folder: what clients trust.
pub const CA_FILE: &str = "ca.pem";
/// The generated server certificate's file (PEM, the server certificate then the CA).
pub const CERT_FILE: &str = "server.pem";
/// The generated server key's file (PKCS#8 PEM).
pub const KEY_FILE: &str = "server.key";

/// Where the TLS listener's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsIdentity {
    /// Generate a CA and a server certificate for `localhost` and `127.0.0.1` at start, and
    /// write them to this folder ([`CA_FILE`], [`CERT_FILE`], [`KEY_FILE`]).
    Generate(PathBuf),
    /// A PEM certificate chain (server certificate first) and its PEM private key.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// The private key.
        key: PathBuf,
    },
}

/// The TLS listener: `amqps` and `wss` on one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListen {
    /// Address to bind (`127.0.0.1:0` picks a port).
    pub addr: String,
    /// Its certificate.
    pub identity: TlsIdentity,
}

/// The listener's rustls configuration (ring), and the CA file clients should trust when the
/// emulator generated it.
pub(crate) fn server_config(
    identity: &TlsIdentity,
) -> Result<(Arc<rustls::ServerConfig>, Option<PathBuf>), Error> {
    let (chain, key, ca) = match identity {
        TlsIdentity::Generate(dir) => {
            let (chain, key) = generate(dir)?;
            (chain, key, Some(dir.join(CA_FILE)))
        }
        TlsIdentity::Files { cert, key } => (read_chain(cert)?, read_key(key)?, None),
    };
    // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange). ring is kept on
    // purpose: the project's one provider, lighter to build than aws-lc-rs.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Server(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| Error::Server(format!("TLS certificate refused: {e}")))?;
    Ok((Arc::new(config), ca))
}

fn tls_error(what: &str, error: impl std::fmt::Display) -> Error {
    Error::Server(format!("TLS: cannot {what}: {error}"))
}

/// Generates the CA and the server certificate, writes them to `dir`, returns the chain and key.
fn generate(dir: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error("make the CA", e))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sb-emulator test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(|e| tls_error("make the CA key", e))?;
    let ca = ca_params
        .self_signed(&ca_key)
        .map_err(|e| tls_error("sign the CA", e))?;
    // rcgen makes `127.0.0.1` an IP address subject alternative name, `localhost` a DNS one.
    let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .map_err(|e| tls_error("make the server certificate", e))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(|e| tls_error("make the server key", e))?;
    let cert = params
        .signed_by(&key, &ca, &ca_key)
        .map_err(|e| tls_error("sign the server certificate", e))?;
    std::fs::create_dir_all(dir).map_err(|e| tls_error(&format!("create {}", dir.display()), e))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| tls_error(&format!("write {}", path.display()), e))
    };
    write(CA_FILE, ca.pem())?;
    write(CERT_FILE, format!("{}{}", cert.pem(), ca.pem()))?;
    write(KEY_FILE, key.serialize_pem())?;
    let chain = vec![cert.der().clone(), ca.der().clone()];
    let key = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| tls_error("use the server key", e))?;
    Ok((chain, key))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let what = || format!("read the certificates in {}", path.display());
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(&what(), e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(&what(), e))?;
    if chain.is_empty() {
        return Err(tls_error(&what(), "no PEM certificate in it"));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| tls_error(&format!("read the private key in {}", path.display()), e))
}
