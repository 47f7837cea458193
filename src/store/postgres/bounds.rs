//! Upper bounds on how long a PostgreSQL session waits (issue 14, finding 6): a statement, a
//! lock, and a peer that vanished without closing the socket. Without them a lock held
//! elsewhere or a half-open connection keeps a message locked (its lock renewed) forever.
//!
//! Defaults, each kept when the URL sets it itself (`options=-c lock_timeout=5s`,
//! `keepalives_idle=…`):
//! - `statement_timeout` 60 s and `lock_timeout` 30 s, sent with `SET` on each new connection
//!   (not as startup options, which PgBouncer refuses). Both fail with transient errors
//!   (57014, 55P03: [`crate::ErrorKind::TimedOut`]).
//! - TCP keepalive after 30 s idle, every 10 s, 3 probes: a dead peer is noticed within a
//!   minute.

use std::time::Duration;

use tokio_postgres::Config;

/// `statement_timeout` unless the URL sets one.
pub const STATEMENT_TIMEOUT: &str = "60s";
/// `lock_timeout` unless the URL sets one.
pub const LOCK_TIMEOUT: &str = "30s";
/// Keepalive idle time, interval and probes unless the URL sets `keepalives*`.
const KEEPALIVE: (Duration, Duration, u32) = (Duration::from_secs(30), Duration::from_secs(10), 3);

/// Applies the keepalive defaults to `config` and returns the `SET` statements each new
/// connection runs (empty when the URL's `options` set both timeouts).
pub(crate) fn apply(config: &mut Config, url: &str) -> String {
    if !url.contains("keepalives") {
        let (idle, interval, retries) = KEEPALIVE;
        config
            .keepalives(true)
            .keepalives_idle(idle)
            .keepalives_interval(interval)
            .keepalives_retries(retries);
    }
    let options = config.get_options().unwrap_or_default();
    [
        ("statement_timeout", STATEMENT_TIMEOUT),
        ("lock_timeout", LOCK_TIMEOUT),
    ]
    .into_iter()
    .filter(|(name, _)| !options.contains(name))
    .map(|(name, value)| format!("SET {name} = '{value}'; "))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_unless_the_url_sets_them() {
        let mut config: Config = "postgres://u@h/db".parse().unwrap();
        let setup = apply(&mut config, "postgres://u@h/db");
        assert_eq!(
            setup,
            "SET statement_timeout = '60s'; SET lock_timeout = '30s'; "
        );
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(
            config.get_keepalives_interval(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(config.get_keepalives_retries(), Some(3));

        let url = "postgres://u@h/db?options=-c%20lock_timeout%3D5s&keepalives_idle=120";
        let mut config: Config = url.parse().unwrap();
        assert_eq!(apply(&mut config, url), "SET statement_timeout = '60s'; ");
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(120));
    }
}
