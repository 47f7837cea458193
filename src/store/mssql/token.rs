//! Entra ID access tokens for Azure SQL.
//!
//! [`TokenSource`] is the seam: the connection manager asks it for a token for every new
//! connection (the credential caches and refreshes tokens itself, so a pooled connection never
//! logs in with an expired one). [`AzureTokenSource`] implements it on `azure_identity`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_identity::{
    DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
    UserAssignedId, WorkloadIdentityCredential,
};
use tokio::sync::OnceCell;

use crate::ports::{ErrorKind, StoreError};

/// The OAuth scope of Azure SQL Database.
pub const AZURE_SQL_SCOPE: &str = "https://database.windows.net/.default";

/// A boxed future, so [`TokenSource`] can be used as a trait object.
pub type TokenFuture<'a> = Pin<Box<dyn Future<Output = Result<String, StoreError>> + Send + 'a>>;

/// Supplies Entra ID access tokens for [`AZURE_SQL_SCOPE`].
pub trait TokenSource: Send + Sync + fmt::Debug {
    /// A token valid for a new login. Failures are transient ([`ErrorKind::Unavailable`]): the
    /// identity endpoint may be briefly unreachable.
    fn token(&self) -> TokenFuture<'_>;
}

/// The `Authentication=` methods that take Entra ID tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntraMode {
    /// `Active Directory Default`: workload identity when `AZURE_FEDERATED_TOKEN_FILE` is set,
    /// managed identity when `IDENTITY_ENDPOINT` or `MSI_ENDPOINT` is set (App Service, Container
    /// Apps), otherwise the Azure CLI / Azure Developer CLI, then the VM's managed identity.
    Default,
    /// `Active Directory Managed Identity` (or `…MSI`); `User Id` names a user-assigned
    /// identity's client id.
    ManagedIdentity,
    /// `Active Directory Workload Identity` (AKS, from `AZURE_*` variables).
    WorkloadIdentity,
}

impl EntraMode {
    /// `None` for SQL authentication (`SqlPassword`), a mode for the supported Entra methods.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`] for an unsupported method (interactive, password, …).
    pub fn parse(method: &str) -> Result<Option<Self>, StoreError> {
        let normalized: String = method
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '-' && *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        match normalized.as_str() {
            "" | "sqlpassword" => Ok(None),
            "activedirectorydefault" => Ok(Some(EntraMode::Default)),
            "activedirectorymanagedidentity" | "activedirectorymsi" => {
                Ok(Some(EntraMode::ManagedIdentity))
            }
            "activedirectoryworkloadidentity" => Ok(Some(EntraMode::WorkloadIdentity)),
            _ => Err(StoreError::new(
                ErrorKind::Schema,
                None,
                None,
                format!(
                    "unsupported Authentication={method}: use SqlPassword, Active Directory \
                     Default, Active Directory Managed Identity or Active Directory Workload \
                     Identity"
                ),
            )),
        }
    }
}

/// Tokens from `azure_identity`, built on first use.
pub struct AzureTokenSource {
    mode: EntraMode,
    client_id: Option<String>,
    credentials: OnceCell<Vec<Arc<dyn TokenCredential>>>,
}

impl fmt::Debug for AzureTokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureTokenSource")
            .field("mode", &self.mode)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

fn unavailable(message: impl fmt::Display) -> StoreError {
    StoreError::new(
        ErrorKind::Unavailable,
        None,
        None,
        format!("Entra ID token: {message}"),
    )
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

impl AzureTokenSource {
    /// A source for `mode`; `client_id` selects a user-assigned managed identity.
    ///
    /// # Errors
    /// None today; kept fallible so that credential construction may move here.
    pub fn new(mode: EntraMode, client_id: Option<String>) -> Result<Self, StoreError> {
        Ok(AzureTokenSource {
            mode,
            client_id: client_id.filter(|id| !id.is_empty()),
            credentials: OnceCell::new(),
        })
    }

    fn managed_identity(&self) -> azure_core::Result<Arc<dyn TokenCredential>> {
        let options = ManagedIdentityCredentialOptions {
            user_assigned_id: self.client_id.clone().map(UserAssignedId::ClientId),
            ..Default::default()
        };
        Ok(ManagedIdentityCredential::new(Some(options))?)
    }

    fn build(&self) -> azure_core::Result<Vec<Arc<dyn TokenCredential>>> {
        // reqwest is built with `rustls-no-provider`: it needs a process-wide rustls provider.
        // The binary installs ring at start-up; a library user who did not gets ring here.
        // An Err means a provider is installed already, which is what we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(match self.mode {
            EntraMode::ManagedIdentity => vec![self.managed_identity()?],
            EntraMode::WorkloadIdentity => vec![WorkloadIdentityCredential::new(None)?],
            EntraMode::Default if env_set("AZURE_FEDERATED_TOKEN_FILE") => {
                vec![WorkloadIdentityCredential::new(None)?]
            }
            EntraMode::Default if env_set("IDENTITY_ENDPOINT") || env_set("MSI_ENDPOINT") => {
                vec![self.managed_identity()?]
            }
            EntraMode::Default => vec![
                DeveloperToolsCredential::new(None)?,
                self.managed_identity()?,
            ],
        })
    }

    async fn fetch(&self) -> Result<String, StoreError> {
        let credentials = self
            .credentials
            .get_or_try_init(|| async { self.build() })
            .await
            .map_err(unavailable)?;
        let mut failures = Vec::new();
        for credential in credentials {
            match credential.get_token(&[AZURE_SQL_SCOPE], None).await {
                Ok(token) => return Ok(token.token.secret().to_owned()),
                Err(error) => failures.push(error.to_string()),
            }
        }
        Err(unavailable(failures.join("; ")))
    }
}

impl TokenSource for AzureTokenSource {
    fn token(&self) -> TokenFuture<'_> {
        Box::pin(self.fetch())
    }
}

/// A fixed token, for tests and for callers that manage tokens themselves.
#[derive(Clone)]
pub struct StaticToken(pub String);

impl fmt::Debug for StaticToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StaticToken(***)")
    }
}

impl TokenSource for StaticToken {
    fn token(&self) -> TokenFuture<'_> {
        let token = self.0.clone();
        Box::pin(async move { Ok(token) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(
            EntraMode::parse("Active Directory Default").unwrap(),
            Some(EntraMode::Default)
        );
        assert_eq!(
            EntraMode::parse("ActiveDirectoryMSI").unwrap(),
            Some(EntraMode::ManagedIdentity)
        );
        assert_eq!(
            EntraMode::parse("active directory managed identity").unwrap(),
            Some(EntraMode::ManagedIdentity)
        );
        assert_eq!(
            EntraMode::parse("Active Directory Workload Identity").unwrap(),
            Some(EntraMode::WorkloadIdentity)
        );
        assert_eq!(EntraMode::parse("SqlPassword").unwrap(), None);
        assert!(EntraMode::parse("Active Directory Password").is_err());
    }

    /// No network: the credential fails on its missing `AZURE_*` variables before any request.
    #[tokio::test]
    async fn workload_identity_without_its_variables_is_unavailable() {
        if std::env::var_os("AZURE_TENANT_ID").is_some() {
            return;
        }
        let source = AzureTokenSource::new(EntraMode::WorkloadIdentity, None).unwrap();
        let error = source.token().await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
        assert!(error.kind().is_transient());
    }

    #[tokio::test]
    async fn static_token_hides_itself() {
        let source = StaticToken("eyJ.secret".into());
        assert_eq!(source.token().await.unwrap(), "eyJ.secret");
        assert!(!format!("{source:?}").contains("secret"));
    }
}
