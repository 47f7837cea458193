//! The HTTP proxy AMQP over WebSockets and the management client go through: `HTTPS_PROXY` /
//! `https_proxy` and `NO_PROXY` / `no_proxy`, read once (when the worker loads its
//! configuration) or given explicitly, never looked up per connection. Of AMQP only WebSockets
//! use it, as in the official SDKs (see `sb_amqp`'s proxy module: .NET
//! `ServiceBusClientOptions.WebProxy`, Python `_common/_configuration.py`): plain AMQP on 5671
//! cannot cross an HTTP proxy. The management client (HTTPS) goes through it as .NET's
//! `ServiceBusAdministrationClient` does through `HttpClient`'s environment proxy.
//!
//! `http://user:password@host:port` sends the credentials as `Proxy-Authorization: Basic`
//! (RFC 7617) with every `CONNECT`, as .NET's `WebProxy.Credentials` and Python's
//! `http_proxy` `username`/`password` do; an `https://` proxy (TLS to the proxy itself) is
//! refused, naming the variable.

use sb_amqp::HttpProxy;

/// A proxy setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// Not `[http://][user:password@]host:port`: no host, a bad port, or another scheme. The
    /// value is shown without its credentials.
    #[error("{var}={value:?}: expected http://[USER:PASSWORD@]HOST:PORT ({why})")]
    Invalid {
        /// The variable it came from.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Which proxy a WebSocket connection goes through, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    proxy: Option<HttpProxy>,
    /// Lower-cased `NO_PROXY` entries without a leading dot; `*` bypasses every host.
    no_proxy: Vec<String>,
}

impl ProxyConfig {
    /// No proxy.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every WebSocket connection through `proxy`, except to hosts [`ProxyConfig::with_no_proxy`]
    /// names.
    pub fn through(proxy: HttpProxy) -> Self {
        Self {
            proxy: Some(proxy),
            no_proxy: Vec::new(),
        }
    }

    /// The same setting bypassing the proxy for `list` (`NO_PROXY` syntax: comma-separated
    /// host names, each matching itself and its subdomains, a leading dot optional; `*` for
    /// all hosts).
    #[must_use]
    pub fn with_no_proxy(mut self, list: &str) -> Self {
        self.no_proxy = list
            .split(',')
            .map(|entry| entry.trim().trim_start_matches('.').to_ascii_lowercase())
            .filter(|entry| !entry.is_empty())
            .collect();
        self
    }

    /// The setting of the process's environment (`HTTPS_PROXY`, else `https_proxy`;
    /// `NO_PROXY`, else `no_proxy`).
    ///
    /// # Errors
    /// [`ProxyError`] when the proxy variable is set but unusable.
    pub fn from_env() -> Result<Self, ProxyError> {
        Self::from_env_vars(|name| std::env::var(name).ok())
    }

    /// [`ProxyConfig::from_env`] reading variables through `lookup` (tests, or a
    /// configuration that is not the process's environment).
    ///
    /// # Errors
    /// [`ProxyError`] when the proxy variable is set but unusable.
    pub fn from_env_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ProxyError> {
        let first = |names: [&'static str; 2]| {
            names.into_iter().find_map(|name| {
                lookup(name)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (name, v))
            })
        };
        let Some((var, value)) = first(["HTTPS_PROXY", "https_proxy"]) else {
            return Ok(Self::none());
        };
        let config = Self::through(parse_proxy(var, &value)?);
        Ok(match first(["NO_PROXY", "no_proxy"]) {
            Some((_, list)) => config.with_no_proxy(&list),
            None => config,
        })
    }

    /// The proxy for a connection to `host`: `None` without a proxy or when `NO_PROXY` names
    /// `host` or one of its parent domains.
    pub fn proxy_for(&self, host: &str) -> Option<&HttpProxy> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let bypass = self.no_proxy.iter().any(|entry| {
            entry == "*"
                || host == *entry
                || host
                    .strip_suffix(entry.as_str())
                    .is_some_and(|rest| rest.ends_with('.'))
        });
        self.proxy.as_ref().filter(|_| !bypass)
    }
}

fn parse_proxy(var: &'static str, value: &str) -> Result<HttpProxy, ProxyError> {
    let shown = redacted(value);
    let invalid = |why| ProxyError::Invalid {
        var,
        value: shown.clone(),
        why,
    };
    let rest = match value.trim().split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
            return Err(invalid(
                "https:// proxies (TLS to the proxy) are not supported; use the proxy's http:// address",
            ));
        }
        Some(_) => return Err(invalid("only http:// proxies are supported")),
        None => value.trim(),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (authorization, authority) = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let decode = |part: &str| {
                percent_encoding::percent_decode_str(part)
                    .decode_utf8()
                    .map(|p| p.into_owned())
                    .map_err(|_| invalid("credentials are not UTF-8"))
            };
            let pair = format!("{}:{}", decode(user)?, decode(password)?);
            let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pair);
            (Some(format!("Basic {encoded}")), host)
        }
        None => (None, authority),
    };
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once("]:").ok_or_else(|| invalid("no port"))?,
        None => authority
            .rsplit_once(':')
            .ok_or_else(|| invalid("no port"))?,
    };
    if host.is_empty() {
        return Err(invalid("no host"));
    }
    let port = port.parse().map_err(|_| invalid("bad port"))?;
    Ok(HttpProxy {
        host: host.to_owned(),
        port,
        authorization,
    })
}

/// `value` with the password of its `user:password@` replaced, for messages.
fn redacted(value: &str) -> String {
    let (prefix, rest) = match value.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), value),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, _)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            let host = &rest[userinfo.len() + 1..];
            format!("{prefix}{user}:***@{host}")
        }
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_become_a_basic_proxy_authorization() {
        let c =
            ProxyConfig::from_env_vars(vars(&[("HTTPS_PROXY", "http://al%40ice:p%3Ass@p:3128")]))
                .unwrap();
        let proxy = c.proxy_for("ns.example").unwrap();
        // base64("al@ice:p:ss")
        assert_eq!(
            proxy.authorization.as_deref(),
            Some("Basic YWxAaWNlOnA6c3M=")
        );
        assert_eq!((proxy.host.as_str(), proxy.port), ("p", 3128));
        assert!(!format!("{c:?}").contains("YWx"), "{c:?}");
    }

    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn proxy(host: &str, port: u16) -> HttpProxy {
        HttpProxy {
            host: host.into(),
            port,
            authorization: None,
        }
    }

    #[test]
    fn reads_the_upper_case_variable_first_then_the_lower_case_one() {
        let both = [
            ("HTTPS_PROXY", "http://upper:3128"),
            ("https_proxy", "lower:8080"),
        ];
        let c = ProxyConfig::from_env_vars(vars(&both)).unwrap();
        assert_eq!(c.proxy_for("ns.example"), Some(&proxy("upper", 3128)));
        let lower = [("https_proxy", "lower:8080/")];
        let c = ProxyConfig::from_env_vars(vars(&lower)).unwrap();
        assert_eq!(c.proxy_for("ns.example"), Some(&proxy("lower", 8080)));
        let c = ProxyConfig::from_env_vars(vars(&[])).unwrap();
        assert_eq!(c, ProxyConfig::none());
    }

    #[test]
    fn no_proxy_matches_the_host_its_subdomains_and_star() {
        let c = ProxyConfig::from_env_vars(vars(&[
            ("HTTPS_PROXY", "http://p:1"),
            ("no_proxy", " .Windows.net ,localhost"),
        ]))
        .unwrap();
        assert_eq!(c.proxy_for("ns.servicebus.windows.net"), None);
        assert_eq!(c.proxy_for("windows.net"), None);
        assert_eq!(c.proxy_for("LOCALHOST"), None);
        assert_eq!(c.proxy_for("notwindows.net"), Some(&proxy("p", 1)));
        assert_eq!(c.proxy_for("localhost.example"), Some(&proxy("p", 1)));
        let star = ProxyConfig::through(proxy("p", 1)).with_no_proxy("*");
        assert_eq!(star.proxy_for("anything"), None);
    }

    #[test]
    fn refuses_unusable_proxy_settings() {
        for bad in [
            "https://p:1",
            "socks5://p:1",
            "http://p",
            "http://:1",
            "p:port",
        ] {
            let err = ProxyConfig::from_env_vars(vars(&[("HTTPS_PROXY", bad)])).unwrap_err();
            assert!(err.to_string().contains("HTTPS_PROXY"), "{bad}: {err}");
        }
        let https = ProxyConfig::from_env_vars(vars(&[("HTTPS_PROXY", "https://u:secret@p:1")]))
            .unwrap_err()
            .to_string();
        assert!(https.contains("https:// proxies"), "{https}");
        assert!(!https.contains("secret"), "{https}");
        let v6 = ProxyConfig::from_env_vars(vars(&[("HTTPS_PROXY", "[::1]:3128")])).unwrap();
        assert_eq!(v6.proxy_for("h"), Some(&proxy("::1", 3128)));
    }
}
