//! Connection settings: ADO.NET connection strings and `mssql://` URLs, with Entra ID
//! authentication and a Display that never shows the password.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tiberius::Config;

use super::token::{AzureTokenSource, TokenSource, parse_authentication};
use crate::ports::StoreError;
use sb_servicebus::entra::EntraMode;

/// [`MssqlConfig::command_timeout`] without `Command Timeout=`: ADO.NET's default.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a [`super::MssqlStore`] connects and how it authenticates.
///
/// Parsed from an ADO.NET connection string (`Server=tcp:host,1433;Database=…;User Id=…;
/// Password=…;Encrypt=true;TrustServerCertificate=true`) or a URL (`mssql://user:password@host:
/// 1433/db?encrypt=true&trustServerCertificate=true`, `sqlserver://` too). `Authentication=
/// Active Directory Default` (also `…Managed Identity`, `…MSI`, `…Workload Identity`) takes an
/// Entra ID access token for each new connection instead of a password.
///
/// # Examples
/// ```
/// use sb_inbox::store::MssqlConfig;
/// let config: MssqlConfig = "Server=tcp:db.example.net,1433;Database=app;User Id=app;Password=s3cret;Encrypt=true".parse()?;
/// assert!(!config.to_string().contains("s3cret"));
/// let url: MssqlConfig = "mssql://app:s3cret@127.0.0.1:1433/app?trustServerCertificate=true".parse()?;
/// assert_eq!(url.database(), Some("app"));
/// # Ok::<(), sb_inbox::StoreError>(())
/// ```
#[derive(Clone)]
pub struct MssqlConfig {
    pub(crate) tiberius: Config,
    /// How long one statement may take before the connection is dropped (`None`: no limit).
    pub(crate) command_timeout: Option<Duration>,
    pub(crate) token: Option<Arc<dyn TokenSource>>,
    entra: Option<EntraMode>,
    database: Option<String>,
    /// The database user every session runs as ([`MssqlConfig::set_execute_as`]).
    pub(crate) execute_as: Option<String>,
    redacted: String,
}

impl MssqlConfig {
    /// Parses an ADO.NET connection string or an `mssql://` / `sqlserver://` URL.
    ///
    /// # Errors
    /// [`ErrorKind::Configuration`](crate::ports::ErrorKind::Configuration) for a string tiberius cannot parse or an unsupported
    /// `Authentication` method.
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        let ado = if is_url(text) {
            url_to_ado(text)?
        } else {
            text.to_owned()
        };
        let pairs = ado_pairs(&ado).map_err(invalid)?;
        let entra = pairs
            .iter()
            .find(|(key, _)| key == "authentication")
            .map(|(_, value)| parse_authentication(value))
            .transpose()?
            .flatten();
        let tiberius = Config::from_ado_string(&ado).map_err(|e| invalid(e.to_string()))?;
        let database = pairs
            .iter()
            .find(|(key, _)| key == "database" || key == "initial catalog")
            .map(|(_, value)| value.clone());
        let user = pairs
            .iter()
            .find(|(key, _)| matches!(key.as_str(), "user id" | "uid" | "user" | "username"))
            .map(|(_, value)| value.clone());
        let command_timeout = match pairs.iter().find(|(key, _)| key == "command timeout") {
            None => Some(DEFAULT_COMMAND_TIMEOUT),
            Some((_, value)) => match value.trim().parse::<u64>() {
                // ADO.NET's meaning of 0: wait without limit.
                Ok(0) => None,
                Ok(seconds) => Some(Duration::from_secs(seconds)),
                Err(_) => {
                    return Err(invalid(format!(
                        "Command Timeout {value:?} is not a number of seconds"
                    )));
                }
            },
        };
        let token: Option<Arc<dyn TokenSource>> = match entra {
            Some(mode) => Some(Arc::new(AzureTokenSource::new(mode, user))),
            None => None,
        };
        Ok(MssqlConfig {
            tiberius,
            command_timeout,
            token,
            entra,
            database,
            execute_as: None,
            redacted: redact(&pairs),
        })
    }

    /// How long one statement may run (`Command Timeout=` seconds in the connection string,
    /// [`DEFAULT_COMMAND_TIMEOUT`] without it, `0` for no limit). Past it the connection is
    /// dropped (the server rolls its transaction back) and the statement fails with a transient
    /// [`ErrorKind::Connection`](crate::ports::ErrorKind::Connection) error. Lock waits end earlier, at two thirds of it, with the
    /// transient 1222 (`SET LOCK_TIMEOUT`), which keeps the connection.
    pub fn command_timeout(&self) -> Option<Duration> {
        self.command_timeout
    }

    /// The `SET LOCK_TIMEOUT` milliseconds for [`MssqlConfig::command_timeout`] (`-1`: none).
    pub(crate) fn lock_timeout_ms(&self) -> i64 {
        self.command_timeout.map_or(-1, |limit| {
            i64::try_from(limit.as_millis() * 2 / 3).unwrap_or(i64::MAX)
        })
    }

    /// The database named by the connection string.
    pub fn database(&self) -> Option<&str> {
        self.database.as_deref()
    }

    /// Connects to `database` instead (tests give each case a database of its own).
    pub fn set_database(&mut self, database: &str) {
        self.tiberius.database(database);
        self.redacted = format!("{} [database {database}]", self.redacted);
        self.database = Some(database.to_owned());
    }

    /// Runs every session as the database user `user` (`EXECUTE AS USER`, in the session's
    /// first batch, so it holds for the session: Microsoft Learn, "EXECUTE AS (Transact-SQL)":
    /// the context switch remains in effect until the session is dropped, the context is
    /// switched again, or reverted). The store's table names are unqualified, so they resolve
    /// in that user's default schema ("CREATE USER (Transact-SQL)", `DEFAULT_SCHEMA`: the
    /// first schema searched when the server resolves the names of objects for this user).
    /// `sb-inbox verify` runs the store this way in a scratch schema owned by a user without
    /// login. The connecting principal needs `IMPERSONATE` on `user` (db_owner has it).
    pub fn set_execute_as(&mut self, user: &str) {
        self.redacted = format!("{} [as user {user}]", self.redacted);
        self.execute_as = Some(user.to_owned());
    }

    /// The session's `EXECUTE AS USER` statement, the name a Unicode literal with its quotes
    /// doubled (a context switch in `sp_executesql` would end with it, so it cannot be a
    /// bound parameter); empty without [`MssqlConfig::set_execute_as`].
    pub(crate) fn execute_as_statement(&self) -> String {
        self.execute_as.as_ref().map_or_else(String::new, |user| {
            format!(" EXECUTE AS USER = N'{}';", user.replace('\'', "''"))
        })
    }

    /// Uses `source` for the Entra ID access token of each new connection (replacing the one
    /// `Authentication=` chose).
    pub fn set_token_source(&mut self, source: Arc<dyn TokenSource>) {
        self.token = Some(source);
    }

    /// Disables TLS (only for local test servers that cannot do it, such as a mock TDS server).
    pub fn set_encryption_off(&mut self) {
        self.tiberius
            .encryption(tiberius::EncryptionLevel::NotSupported);
    }

    /// True when connections authenticate with Entra ID tokens.
    pub fn uses_entra_id(&self) -> bool {
        self.token.is_some()
    }
}

impl std::str::FromStr for MssqlConfig {
    type Err = StoreError;

    fn from_str(text: &str) -> Result<Self, StoreError> {
        MssqlConfig::parse(text)
    }
}

impl fmt::Display for MssqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for MssqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlConfig")
            .field("connection", &self.redacted)
            .field("entra", &self.entra)
            .finish_non_exhaustive()
    }
}

fn invalid(message: impl fmt::Display) -> StoreError {
    StoreError::configuration(format!("invalid SQL Server connection string: {message}"))
}

/// True for `mssql://…` and `sqlserver://…`.
pub(crate) fn is_url(text: &str) -> bool {
    let lower = text.get(..12).unwrap_or(text).to_ascii_lowercase();
    lower.starts_with("mssql://") || lower.starts_with("sqlserver://")
}

/// True for a string that looks like an ADO.NET SQL Server connection string.
pub(crate) fn is_ado(text: &str) -> bool {
    ado_pairs(text).is_ok_and(|pairs| {
        pairs
            .iter()
            .any(|(key, _)| matches!(key.as_str(), "server" | "data source" | "address"))
    })
}

/// Keys whose values are secrets.
fn is_secret(key: &str) -> bool {
    matches!(key, "password" | "pwd")
}

/// The connection string with secrets replaced by `***`, for logs.
fn redact(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(key, value)| {
            if is_secret(key) {
                format!("{key}=***")
            } else {
                format!("{key}={value}")
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Splits an ADO.NET connection string into lower-cased keys and unquoted values: `;`
/// separates pairs, the first `=` splits one, values may be quoted with `'…'` or `"…"` (a doubled
/// quote embeds one) or `{…}` (tiberius's extension).
pub(crate) fn ado_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([';', ' ', '\t']);
        if rest.is_empty() {
            return Ok(pairs);
        }
        let eq = rest.find('=').ok_or("a key without a value")?;
        let key = rest[..eq].trim().to_ascii_lowercase();
        let after = rest[eq + 1..].trim_start();
        let (value, tail) = match after.chars().next() {
            Some(quote @ ('\'' | '"')) => {
                let mut value = String::new();
                let mut chars = after[1..].char_indices();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    if c == quote {
                        if after[1 + i + 1..].starts_with(quote) {
                            value.push(quote);
                            chars.next();
                        } else {
                            end = Some(1 + i + 1);
                            break;
                        }
                    } else {
                        value.push(c);
                    }
                }
                let end = end.ok_or("an unterminated quote")?;
                (value, &after[end..])
            }
            Some('{') => {
                let close = after.find('}').ok_or("an unterminated brace")?;
                (after[1..close].to_owned(), &after[close + 1..])
            }
            _ => {
                let end = after.find(';').unwrap_or(after.len());
                (after[..end].trim().to_owned(), &after[end..])
            }
        };
        let tail = tail.trim_start();
        if !tail.is_empty() && !tail.starts_with(';') {
            return Err(format!("unexpected text after the value of {key}"));
        }
        pairs.push((key, value));
        rest = tail;
    }
}

/// Percent-decodes a URL component.
fn percent_decode(text: &str) -> Result<String, StoreError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| invalid("bad percent escape in URL"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid("URL component is not UTF-8"))
}

/// Quotes an ADO.NET value with `'`, doubling embedded quotes.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// `mssql://[user[:password]@]host[:port][/database][?key=value&…]` as an ADO.NET string. Query
/// keys are passed on as ADO.NET keys (`encrypt`, `trustServerCertificate`, `authentication`,
/// `applicationName`, …).
fn url_to_ado(url: &str) -> Result<String, StoreError> {
    let (_, rest) = url.split_once("://").ok_or_else(|| invalid("not a URL"))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, database) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => (Some(userinfo), hostport),
        None => (None, authority),
    };
    if hostport.is_empty() {
        return Err(invalid("URL without a host"));
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || hostport.starts_with('[') => {
            let port: u16 = port.parse().map_err(|_| invalid("bad port in URL"))?;
            (host, port)
        }
        _ => (hostport, 1433),
    };
    let mut ado = format!("Server=tcp:{host},{port}");
    if !database.is_empty() {
        ado.push_str(&format!(";Database={}", quote(&percent_decode(database)?)));
    }
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        ado.push_str(&format!(";User Id={}", quote(&percent_decode(user)?)));
        if !password.is_empty() {
            ado.push_str(&format!(";Password={}", quote(&percent_decode(password)?)));
        }
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        let key = percent_decode(key)?;
        let value = percent_decode(&value.replace('+', " "))?;
        ado.push_str(&format!(";{}={}", key, quote(&value)));
    }
    Ok(ado)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ErrorKind;

    #[test]
    fn splits_ado_strings() {
        let pairs = ado_pairs(
            "Server=tcp:h,1433; Database = app ;User Id=u;Password='p;w''d';Encrypt=true;",
        )
        .unwrap();
        assert_eq!(
            pairs,
            [
                ("server".into(), "tcp:h,1433".into()),
                ("database".into(), "app".into()),
                ("user id".into(), "u".into()),
                ("password".into(), "p;w'd".into()),
                ("encrypt".into(), "true".into()),
            ]
        );
        assert_eq!(
            ado_pairs("password={a;b}").unwrap(),
            [("password".to_owned(), "a;b".to_owned())]
        );
        assert!(ado_pairs("password='open").is_err());
        assert!(ado_pairs("novalue").is_err());
    }

    #[test]
    fn ado_string_is_redacted() {
        let config: MssqlConfig =
            "Server=tcp:db,1433;Database=app;User Id=sa;Password='p;w';TrustServerCertificate=true"
                .parse()
                .unwrap();
        let shown = config.to_string();
        assert!(!shown.contains("p;w"), "{shown}");
        assert!(shown.contains("password=***"), "{shown}");
        assert!(!format!("{config:?}").contains("p;w"));
        assert_eq!(config.database(), Some("app"));
        assert!(!config.uses_entra_id());
        assert_eq!(config.tiberius.get_addr(), "db:1433");
    }

    #[test]
    fn url_form() {
        let config: MssqlConfig =
            "sqlserver://sa:p%40ss%3Bw@127.0.0.1:14330/test?encrypt=true&trustServerCertificate=true"
                .parse()
                .unwrap();
        assert_eq!(config.tiberius.get_addr(), "127.0.0.1:14330");
        assert_eq!(config.database(), Some("test"));
        let shown = config.to_string();
        assert!(!shown.contains("p@ss"), "{shown}");
        let plain: MssqlConfig = "mssql://h".parse().unwrap();
        assert_eq!(plain.tiberius.get_addr(), "h:1433");
        assert!("mssql://".parse::<MssqlConfig>().is_err());
        assert!("mssql://h:notaport".parse::<MssqlConfig>().is_err());
    }

    #[test]
    fn recognises_forms() {
        assert!(is_url("MSSQL://h"));
        assert!(is_url("sqlserver://h"));
        assert!(!is_url("postgres://h"));
        assert!(is_ado("Server=tcp:h,1433;Database=d"));
        assert!(is_ado("Data Source=h"));
        assert!(!is_ado("postgres://h"));
        assert!(!is_ado("host=h user=u"));
    }

    #[test]
    fn entra_modes() {
        let config: MssqlConfig = "Server=tcp:x.database.windows.net,1433;Database=d;\
                                   Authentication=Active Directory Default;Encrypt=true"
            .parse()
            .unwrap();
        assert!(config.uses_entra_id());
        let managed: MssqlConfig = "Server=tcp:x,1433;Authentication=ActiveDirectoryManagedIdentity;User Id=11111111-2222-3333-4444-555555555555"
            .parse()
            .unwrap();
        assert!(managed.uses_entra_id());
        let sql: MssqlConfig = "Server=tcp:x,1433;Authentication=SqlPassword;User Id=u;Password=p"
            .parse()
            .unwrap();
        assert!(!sql.uses_entra_id());
        let err = "Server=tcp:x,1433;Authentication=Active Directory Interactive"
            .parse::<MssqlConfig>()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Configuration);
    }

    #[test]
    fn command_and_lock_timeouts() {
        let parse = |extra: &str| {
            format!("Server=tcp:x,1433;User Id=u;Password=p{extra}").parse::<MssqlConfig>()
        };
        let default = parse("").unwrap();
        assert_eq!(default.command_timeout(), Some(DEFAULT_COMMAND_TIMEOUT));
        assert_eq!(default.lock_timeout_ms(), 20_000, "two thirds");
        let nine = parse(";Command Timeout=9").unwrap();
        assert_eq!(nine.command_timeout(), Some(Duration::from_secs(9)));
        assert_eq!(nine.lock_timeout_ms(), 6_000);
        let unlimited = parse(";Command Timeout=0").unwrap();
        assert_eq!(
            (unlimited.command_timeout(), unlimited.lock_timeout_ms()),
            (None, -1)
        );
        assert_eq!(
            parse(";Command Timeout=soon").unwrap_err().kind(),
            ErrorKind::Configuration
        );
    }
}
