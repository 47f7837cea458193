//! Token providers for `$cbs`: SAS keys and signatures, Microsoft Entra ID.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sb_amqp::servicebus::cbs::token_type;

use super::{Credential, ServiceBusError, sign_sas};
#[cfg(feature = "entra")]
use crate::entra::EntraCredential;

/// The token types `$cbs` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// `servicebus.windows.net:sastoken`.
    Sas,
    /// `jwt` (Microsoft Entra ID).
    Jwt,
}

impl TokenType {
    /// The `type` application property of a put-token request.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenType::Sas => token_type::SAS_TOKEN,
            TokenType::Jwt => token_type::JWT,
        }
    }
}

/// A token for one audience.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken {
    /// The token (never printed).
    pub token: String,
    /// Its type.
    pub token_type: TokenType,
    /// When it expires.
    pub expires_at: SystemTime,
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessToken")
            .field("token_type", &self.token_type)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// The future a [`TokenProvider`] returns.
pub type TokenFuture<'a> =
    Pin<Box<dyn Future<Output = Result<AccessToken, ServiceBusError>> + Send + 'a>>;

/// Gets tokens per audience. Implement it for Microsoft Entra ID credentials (scope
/// `https://servicebus.azure.net/.default`, type [`TokenType::Jwt`]).
pub trait TokenProvider: Send + Sync + fmt::Debug {
    /// A token for `audience` (`sb://HOST/ENTITY`).
    fn token<'a>(&'a self, audience: &'a str) -> TokenFuture<'a>;
}

/// Signs SAS tokens from a connection string's credential, valid for one hour.
#[derive(Debug, Clone)]
pub struct SasProvider {
    credential: Credential,
}

impl SasProvider {
    /// A provider for a key or a ready-made signature.
    pub fn new(credential: Credential) -> Self {
        SasProvider { credential }
    }
}

const SAS_LIFETIME: Duration = Duration::from_secs(3600);

impl TokenProvider for SasProvider {
    fn token<'a>(&'a self, audience: &'a str) -> TokenFuture<'a> {
        Box::pin(async move {
            match &self.credential {
                Credential::Key { name, key } => {
                    let sas = sign_sas(audience, name, key, SystemTime::now(), SAS_LIFETIME);
                    Ok(AccessToken {
                        token: sas.token,
                        token_type: TokenType::Sas,
                        expires_at: sas.expires_at,
                    })
                }
                Credential::Signature(token) => {
                    let expires_at = token
                        .split(['&', ' '])
                        .find_map(|part| part.strip_prefix("se="))
                        .and_then(|se| se.parse::<u64>().ok())
                        .map_or(SystemTime::now() + SAS_LIFETIME, |se| {
                            UNIX_EPOCH + Duration::from_secs(se)
                        });
                    Ok(AccessToken {
                        token: token.clone(),
                        token_type: TokenType::Sas,
                        expires_at,
                    })
                }
            }
        })
    }
}

/// The OAuth scope of Azure Service Bus data-plane tokens.
pub const SERVICE_BUS_SCOPE: &str = "https://servicebus.azure.net/.default";

/// Microsoft Entra ID tokens (type `jwt`, scope [`SERVICE_BUS_SCOPE`]): one token serves every
/// audience of the namespace; the credential caches it until shortly before it expires.
#[cfg(feature = "entra")]
#[derive(Debug)]
pub struct EntraProvider {
    credential: EntraCredential,
}

#[cfg(feature = "entra")]
impl EntraProvider {
    /// A provider on `credential` (managed identity, workload identity or developer tools).
    pub fn new(credential: EntraCredential) -> Self {
        EntraProvider { credential }
    }
}

#[cfg(feature = "entra")]
impl TokenProvider for EntraProvider {
    fn token<'a>(&'a self, _audience: &'a str) -> TokenFuture<'a> {
        Box::pin(async move {
            let token = self
                .credential
                .token(SERVICE_BUS_SCOPE)
                .await
                .map_err(|error| ServiceBusError::Token(error.to_string()))?;
            Ok(AccessToken {
                token: token.secret,
                token_type: TokenType::Jwt,
                expires_at: token.expires_at,
            })
        })
    }
}
