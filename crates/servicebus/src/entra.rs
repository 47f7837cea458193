//! Microsoft Entra ID access tokens through `azure_identity`, for the SQL Server store (scope
//! `https://database.windows.net/.default`) and the Service Bus client (scope
//! `https://servicebus.azure.net/.default`).
//!
//! [`EntraCredential`] picks the credential for the environment it runs in (workload identity,
//! managed identity, developer tools) on first use; the credentials cache and refresh tokens
//! themselves.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use azure_core::credentials::TokenCredential;
use azure_core::http::{ClientOptions, Transport};
use azure_identity::{
    ClientAssertionCredentialOptions, DeveloperToolsCredential, ManagedIdentityCredential,
    ManagedIdentityCredentialOptions, UserAssignedId, WorkloadIdentityCredential,
    WorkloadIdentityCredentialOptions,
};
use tokio::sync::OnceCell;

/// Which Entra ID credentials to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntraMode {
    /// Workload identity when `AZURE_FEDERATED_TOKEN_FILE` is set, managed identity when
    /// `IDENTITY_ENDPOINT` or `MSI_ENDPOINT` is set (App Service, Container Apps), otherwise the
    /// Azure CLI / Azure Developer CLI, then the VM's managed identity.
    Default,
    /// Managed identity only; a client id selects a user-assigned identity.
    ManagedIdentity,
    /// Workload identity only (AKS, from the `AZURE_*` variables).
    WorkloadIdentity,
}

/// The HTTP transport of every credential: reqwest over rustls with ring named explicitly.
///
/// reqwest is built with `rustls-no-provider` (its `rustls` feature means aws-lc-rs), so without
/// a configuration of our own it would need a process-wide provider; installing one is a global
/// side effect a library must not have (the application may install another). The roots are
/// Mozilla's plus, with `native-roots`, the operating system's, as reqwest's platform verifier
/// would trust; the identity endpoints (`login.microsoftonline.com`, IMDS over plain HTTP)
/// need nothing else.
fn client_options() -> azure_core::Result<ClientOptions> {
    // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange). ring is kept on
    // purpose: the project's one provider, lighter to build than aws-lc-rs.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    #[cfg_attr(not(feature = "native-roots"), allow(unused_mut))]
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    // A store that cannot be read leaves Mozilla's roots, which cover Entra ID's endpoints
    // (and are all a build without `native-roots` trusts).
    #[cfg(feature = "native-roots")]
    {
        let native = rustls_native_certs::load_native_certs();
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(
            added,
            ignored,
            errors = native.errors.len(),
            "Entra ID HTTP trust roots."
        );
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| other(e, "TLS protocol versions"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| other(e, "the HTTP client"))?;
    Ok(ClientOptions {
        transport: Some(Transport::new(Arc::new(client))),
        ..Default::default()
    })
}

fn other<E>(error: E, what: &'static str) -> azure_core::Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    azure_core::Error::with_error(azure_core::error::ErrorKind::Other, error, what)
}

/// No token could be obtained. Callers treat it as transient: the identity endpoint may be
/// briefly unreachable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Entra ID token: {0}")]
pub struct EntraError(String);

/// An access token and its expiry. The token never appears in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct EntraToken {
    /// The bearer token.
    pub secret: String,
    /// When it expires.
    pub expires_at: SystemTime,
}

impl fmt::Debug for EntraToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntraToken")
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Entra ID credentials, built on first use.
pub struct EntraCredential {
    mode: EntraMode,
    client_id: Option<String>,
    credentials: OnceCell<Vec<Arc<dyn TokenCredential>>>,
}

impl fmt::Debug for EntraCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntraCredential")
            .field("mode", &self.mode)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

impl EntraCredential {
    /// Credentials for `mode`; `client_id` selects a user-assigned managed identity (in
    /// [`EntraMode::Default`], `None` means the one named by `AZURE_CLIENT_ID`, if set).
    pub fn new(mode: EntraMode, client_id: Option<String>) -> Self {
        EntraCredential {
            mode,
            client_id: client_id.filter(|id| !id.is_empty()),
            credentials: OnceCell::new(),
        }
    }

    /// One given credential (a custom chain, or a test double).
    pub fn from_credential(credential: Arc<dyn TokenCredential>) -> Self {
        EntraCredential {
            mode: EntraMode::Default,
            client_id: None,
            credentials: OnceCell::new_with(Some(vec![credential])),
        }
    }

    /// The user-assigned identity to ask for: the given client id, else (in
    /// [`EntraMode::Default`]) `AZURE_CLIENT_ID`, as `DefaultAzureCredential` does ("Defaults to
    /// the value of environment variable AZURE_CLIENT_ID",
    /// <https://learn.microsoft.com/dotnet/api/azure.identity.defaultazurecredentialoptions.managedidentityclientid>)
    /// and so SqlClient's `Authentication=Active Directory Default`. Without it a Container App
    /// that has only user-assigned identities asks for a system-assigned one it does not have.
    fn client_id(&self) -> Option<String> {
        match (&self.client_id, self.mode) {
            (Some(id), _) => Some(id.clone()),
            (None, EntraMode::Default) => std::env::var("AZURE_CLIENT_ID")
                .ok()
                .filter(|id| !id.is_empty()),
            (None, _) => None,
        }
    }

    fn managed_identity(
        &self,
        client_options: ClientOptions,
    ) -> azure_core::Result<Arc<dyn TokenCredential>> {
        let options = ManagedIdentityCredentialOptions {
            user_assigned_id: self.client_id().map(UserAssignedId::ClientId),
            client_options,
        };
        Ok(ManagedIdentityCredential::new(Some(options))?)
    }

    fn build(&self) -> azure_core::Result<Vec<Arc<dyn TokenCredential>>> {
        let http = client_options()?;
        let workload = || {
            WorkloadIdentityCredential::new(Some(WorkloadIdentityCredentialOptions {
                credential_options: ClientAssertionCredentialOptions {
                    client_options: http.clone(),
                },
                ..Default::default()
            }))
        };
        Ok(match self.mode {
            EntraMode::ManagedIdentity => vec![self.managed_identity(http.clone())?],
            EntraMode::WorkloadIdentity => vec![workload()?],
            EntraMode::Default if env_set("AZURE_FEDERATED_TOKEN_FILE") => vec![workload()?],
            EntraMode::Default if env_set("IDENTITY_ENDPOINT") || env_set("MSI_ENDPOINT") => {
                vec![self.managed_identity(http.clone())?]
            }
            EntraMode::Default => vec![
                DeveloperToolsCredential::new(None)?,
                self.managed_identity(http.clone())?,
            ],
        })
    }

    /// A token for `scope` from the first credential that answers.
    ///
    /// # Errors
    /// [`EntraError`] with every credential's failure.
    pub async fn token(&self, scope: &str) -> Result<EntraToken, EntraError> {
        let credentials = self
            .credentials
            .get_or_try_init(|| async { self.build() })
            .await
            .map_err(|e| EntraError(e.to_string()))?;
        let mut failures = Vec::new();
        for credential in credentials {
            match credential.get_token(&[scope], None).await {
                Ok(token) => {
                    let seconds = u64::try_from(token.expires_on.unix_timestamp()).unwrap_or(0);
                    return Ok(EntraToken {
                        secret: token.token.secret().to_owned(),
                        expires_at: UNIX_EPOCH + Duration::from_secs(seconds),
                    });
                }
                Err(error) => failures.push(error.to_string()),
            }
        }
        Err(EntraError(failures.join("; ")))
    }
}
