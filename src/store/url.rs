use std::fmt;
use std::path::PathBuf;

/// A store named by URL: `postgres://…`, `mssql://…` / `sqlserver://…`, an ADO.NET SQL Server
/// connection string (`Server=tcp:host,1433;Database=…;…`), `sqlite://PATH` or
/// `sqlite::memory:`.
///
/// `Display` hides passwords, so a URL can be logged.
///
/// # Examples
/// ```
/// use sb_inbox::store::StoreUrl;
/// let url: StoreUrl = "postgres://app:secret@db/test".parse()?;
/// assert_eq!(url.to_string(), "postgres://app:***@db/test");
/// assert!(matches!("sqlite::memory:".parse()?, StoreUrl::SqliteMemory));
/// let mssql: StoreUrl = "Server=tcp:db,1433;Database=app;User Id=sa;Password=secret".parse()?;
/// assert!(matches!(mssql, StoreUrl::Mssql(_)));
/// assert!(!mssql.to_string().contains("secret"));
/// # Ok::<(), sb_inbox::store::StoreUrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// A PostgreSQL connection URL.
    Postgres(String),
    /// A SQL Server / Azure SQL connection string (ADO.NET) or `mssql://` URL; parsed once
    /// already, so [`super::MssqlStore::connect`] accepts it.
    Mssql(String),
    /// A SQLite database file.
    Sqlite(PathBuf),
    /// A private in-memory SQLite database.
    SqliteMemory,
}

/// A store URL with an unknown scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported store URL {0}: use postgres://…, mssql://…, Server=tcp:HOST,1433;…, sqlite://PATH or sqlite::memory:"
)]
pub struct StoreUrlError(String);

impl std::str::FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if url == "sqlite::memory:" {
            Ok(StoreUrl::SqliteMemory)
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(StoreUrlError(url.to_owned()));
            }
            Ok(StoreUrl::Sqlite(PathBuf::from(path)))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(url.to_owned()))
        } else if super::mssql::is_url(url) || super::mssql::is_ado(url) {
            // The message of a parse error never quotes the string (it may hold a password).
            super::MssqlConfig::parse(url)
                .map(|_| StoreUrl::Mssql(url.to_owned()))
                .map_err(|error| StoreUrlError(format!("SQL Server connection string ({error})")))
        } else {
            Err(StoreUrlError(redact(url)))
        }
    }
}

/// Replaces the password of `scheme://user:password@host` with `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparseable>".to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Postgres(url) => f.write_str(&redact(url)),
            StoreUrl::Mssql(text) => match super::MssqlConfig::parse(text) {
                Ok(config) => fmt::Display::fmt(&config, f),
                Err(_) => f.write_str("<unparseable SQL Server connection string>"),
            },
            StoreUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            StoreUrl::SqliteMemory => f.write_str("sqlite::memory:"),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_redacts() {
        let url: StoreUrl = "postgresql://u:p%40ss@h:5432/d?sslmode=disable"
            .parse()
            .unwrap();
        assert_eq!(
            url.to_string(),
            "postgresql://u:***@h:5432/d?sslmode=disable"
        );
        assert!(!format!("{url:?}").contains("p%40ss"));
        assert_eq!(
            "sqlite://a/b.db".parse::<StoreUrl>().unwrap(),
            StoreUrl::Sqlite("a/b.db".into())
        );
        assert!("sqlite://".parse::<StoreUrl>().is_err());
        let err = "mysql://root:pw@h/d".parse::<StoreUrl>().unwrap_err();
        assert!(!err.to_string().contains("pw"));
        for text in [
            "mssql://sa:Pa55word@h:1433/d?trustServerCertificate=true",
            "Server=tcp:h,1433;Database=d;User Id=sa;Password=Pa55word;Encrypt=true",
        ] {
            let url: StoreUrl = text.parse().unwrap();
            assert!(matches!(url, StoreUrl::Mssql(_)), "{text}");
            assert!(!url.to_string().contains("Pa55word"), "{url}");
            assert!(!format!("{url:?}").contains("Pa55word"));
        }
        let err = "Server=tcp:h,1433;Password='Pa55word"
            .parse::<StoreUrl>()
            .unwrap_err();
        assert!(!err.to_string().contains("Pa55word"), "{err}");
    }
}
