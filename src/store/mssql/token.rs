//! Entra ID access tokens for Azure SQL.
//!
//! [`TokenSource`] is the seam: the connection manager asks it for a token for every new
//! connection (the credential caches and refreshes tokens itself, so a pooled connection never
//! logs in with an expired one). [`AzureTokenSource`] implements it on [`EntraCredential`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::ports::{ErrorKind, StoreError};
use sb_servicebus::entra::{EntraCredential, EntraMode};

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

/// Parses an ADO.NET `Authentication=` method: `None` for SQL authentication (`SqlPassword`),
/// an [`EntraMode`] for the supported Entra methods.
///
/// # Errors
/// [`ErrorKind::Configuration`] for an unsupported method (interactive, password, …).
pub fn parse_authentication(method: &str) -> Result<Option<EntraMode>, StoreError> {
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
        _ => Err(StoreError::configuration(format!(
            "unsupported Authentication={method}: use SqlPassword, Active Directory \
                 Default, Active Directory Managed Identity or Active Directory Workload \
                 Identity"
        ))),
    }
}

/// Tokens for Azure SQL from an [`EntraCredential`].
#[derive(Debug)]
pub struct AzureTokenSource {
    credential: EntraCredential,
}

impl AzureTokenSource {
    /// A source for `mode` (`Authentication=`); `client_id` (`User Id`) selects a user-assigned
    /// managed identity. Without a `User Id`, `Active Directory Default` takes the identity from
    /// `AZURE_CLIENT_ID` (see [`EntraCredential::new`]).
    pub fn new(mode: EntraMode, client_id: Option<String>) -> Self {
        AzureTokenSource {
            credential: EntraCredential::new(mode, client_id),
        }
    }
}

impl TokenSource for AzureTokenSource {
    fn token(&self) -> TokenFuture<'_> {
        Box::pin(async move {
            self.credential
                .token(AZURE_SQL_SCOPE)
                .await
                .map(|token| token.secret)
                .map_err(|error| StoreError::of_kind(ErrorKind::Unavailable, error.to_string()))
        })
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
            parse_authentication("Active Directory Default").unwrap(),
            Some(EntraMode::Default)
        );
        assert_eq!(
            parse_authentication("ActiveDirectoryMSI").unwrap(),
            Some(EntraMode::ManagedIdentity)
        );
        assert_eq!(
            parse_authentication("active directory managed identity").unwrap(),
            Some(EntraMode::ManagedIdentity)
        );
        assert_eq!(
            parse_authentication("Active Directory Workload Identity").unwrap(),
            Some(EntraMode::WorkloadIdentity)
        );
        assert_eq!(parse_authentication("SqlPassword").unwrap(), None);
        assert!(parse_authentication("Active Directory Password").is_err());
    }

    /// No network: the credential fails on its missing `AZURE_*` variables before any request.
    #[tokio::test]
    async fn workload_identity_without_its_variables_is_unavailable() {
        if std::env::var_os("AZURE_TENANT_ID").is_some() {
            return;
        }
        let source = AzureTokenSource::new(EntraMode::WorkloadIdentity, None);
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
