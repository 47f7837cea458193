//! The token refresh scenario's credential: SAS tokens signed from the connection string's key,
//! valid for `--token-lifetime` ([`DEFAULT_TOKEN_LIFETIME`]) instead of an hour, each request
//! recorded, so verify sees whether the client asked for a fresh token before the first one ran
//! out.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sb_inbox::servicebus::{AccessToken, TokenFuture, TokenProvider, TokenType, sign_sas};

/// How long the scenario's tokens are valid by default: 30 s past the client's earliest
/// refresh of a token that outlives it (2 min after a put, `refresh_delay` in sb-servicebus's
/// client, after .NET `AmqpConnectionScope.CalculateLinkAuthorizationRefreshInterval`), so the
/// client must take the same "refresh ahead" path an hour-long token takes, put a fresh token
/// before the first one runs out, and use its link after that.
///
/// A shorter `--token-lifetime` (CI uses 20 s) is honest too, but proves another branch of the
/// same schedule: a token that does not outlive the 2-minute minimum is refreshed at half its
/// life, so the fresh token still has to arrive before the first expires.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(150);

/// The shortest `--token-lifetime` verify accepts: the client refreshes such a token at half
/// its life, and 5 s leave a CBS round trip to a distant namespace room to land before expiry.
pub const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(10);

/// One token handed out.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Its audience (`sb://HOST/ENTITY`).
    pub audience: String,
    /// When it was signed.
    pub at: SystemTime,
    /// When it expires.
    pub expires_at: SystemTime,
}

/// Short-lived SAS tokens from a key, every one recorded.
#[derive(Debug)]
pub struct ShortTokens {
    key_name: String,
    key: String,
    lifetime: Duration,
    issued: Mutex<Vec<Issued>>,
}

impl ShortTokens {
    /// Tokens for the key `key_name` / `key`, valid for `lifetime`.
    pub fn new(key_name: String, key: String, lifetime: Duration) -> Self {
        ShortTokens {
            key_name,
            key,
            lifetime,
            issued: Mutex::new(Vec::new()),
        }
    }

    /// The tokens issued for `audience`, in order.
    pub fn issued_for(&self, audience: &str) -> Vec<Issued> {
        self.issued
            .lock()
            .map(|issued| {
                issued
                    .iter()
                    .filter(|i| i.audience == audience)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl TokenProvider for ShortTokens {
    fn token<'a>(&'a self, audience: &'a str) -> TokenFuture<'a> {
        Box::pin(async move {
            let now = SystemTime::now();
            let sas = sign_sas(audience, &self.key_name, &self.key, now, self.lifetime);
            if let Ok(mut issued) = self.issued.lock() {
                issued.push(Issued {
                    audience: audience.to_owned(),
                    at: now,
                    expires_at: sas.expires_at,
                });
            }
            Ok(AccessToken {
                token: sas.token,
                token_type: TokenType::Sas,
                expires_at: sas.expires_at,
            })
        })
    }
}
