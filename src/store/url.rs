//! [`StoreUrl`]: which store a URL or connection string names, printable without its secrets,
//! and refused with the cargo feature to turn on when this build does not include that store.

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
    /// already, so `MssqlStore::connect` (feature `mssql`) accepts it.
    Mssql(String),
    /// A SQLite database file.
    Sqlite(PathBuf),
    /// A private in-memory SQLite database.
    SqliteMemory,
}

/// A store URL with an unknown scheme, or naming a store this build does not include.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported store URL {0}")]
pub struct StoreUrlError(String);

impl StoreUrlError {
    /// An unknown or malformed URL (`text` holds no secret), with the forms that work.
    fn unknown(text: impl fmt::Display) -> Self {
        StoreUrlError(format!(
            "{text}: use postgres://…, mssql://…, Server=tcp:HOST,1433;…, sqlite://PATH or \
             sqlite::memory:"
        ))
    }
}

impl StoreUrl {
    /// The cargo feature that compiles this URL's store in: `postgres`, `mssql` or `sqlite`.
    pub fn feature(&self) -> &'static str {
        match self {
            StoreUrl::Postgres(_) => "postgres",
            StoreUrl::Mssql(_) => "mssql",
            StoreUrl::Sqlite(_) | StoreUrl::SqliteMemory => "sqlite",
        }
    }

    /// True when this build has the URL's store ([`StoreUrl::feature`] was on).
    pub fn compiled_in(&self) -> bool {
        match self {
            StoreUrl::Postgres(_) => cfg!(feature = "postgres"),
            StoreUrl::Mssql(_) => cfg!(feature = "mssql"),
            StoreUrl::Sqlite(_) | StoreUrl::SqliteMemory => cfg!(feature = "sqlite"),
        }
    }

    /// `Ok` when this build has the URL's store; otherwise the error that names the cargo
    /// feature to turn on (a worker configured for a store it was built without stops at
    /// start-up with it).
    ///
    /// # Errors
    /// [`StoreUrlError`] for a store this build does not include.
    pub fn ensure_compiled_in(&self) -> Result<(), StoreUrlError> {
        if self.compiled_in() {
            return Ok(());
        }
        Err(self.not_compiled_in())
    }

    /// The refusal of a URL whose store this build lacks: the URL (without secrets) and the
    /// cargo feature that adds it.
    fn not_compiled_in(&self) -> StoreUrlError {
        StoreUrlError(format!(
            "{self}: this build has no {} store; rebuild with the `{}` cargo feature",
            self.feature(),
            self.feature()
        ))
    }

    /// Which store `url` names, before checking that this build has it.
    fn recognise(url: &str) -> Result<Self, StoreUrlError> {
        if url == "sqlite::memory:" {
            Ok(StoreUrl::SqliteMemory)
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(StoreUrlError::unknown(url));
            }
            Ok(StoreUrl::Sqlite(PathBuf::from(path)))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(url.to_owned()))
        } else if names_mssql(url) {
            check_mssql(url).map(|()| StoreUrl::Mssql(url.to_owned()))
        } else {
            Err(StoreUrlError::unknown(redact(url)))
        }
    }
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreUrlError;

    /// A URL of a store this build does not include is refused, naming the cargo feature.
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let store = Self::recognise(url)?;
        store.ensure_compiled_in()?;
        Ok(store)
    }
}

/// True for an `mssql://` / `sqlserver://` URL or an ADO.NET connection string.
#[cfg(feature = "mssql")]
fn names_mssql(url: &str) -> bool {
    super::mssql::is_url(url) || super::mssql::is_ado(url)
}

/// Without the SQL Server store its parser is not there either: recognised by its look, only
/// to say that this build cannot use it.
#[cfg(not(feature = "mssql"))]
fn names_mssql(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    ["mssql://", "sqlserver://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
        || ["server=", "data source=", "address="]
            .iter()
            .any(|key| lower.contains(key))
}

/// A SQL Server string that does not parse is refused now; the message never quotes the
/// string (it may hold a password).
#[cfg(feature = "mssql")]
fn check_mssql(url: &str) -> Result<(), StoreUrlError> {
    super::MssqlConfig::parse(url)
        .map(drop)
        .map_err(|error| StoreUrlError::unknown(format!("SQL Server connection string ({error})")))
}

/// Nothing to check with: [`StoreUrl::ensure_compiled_in`] refuses it next.
#[cfg(not(feature = "mssql"))]
fn check_mssql(_url: &str) -> Result<(), StoreUrlError> {
    Ok(())
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
            StoreUrl::Mssql(text) => display_mssql(text, f),
            StoreUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            StoreUrl::SqliteMemory => f.write_str("sqlite::memory:"),
        }
    }
}

/// The SQL Server string through its parser's redacting `Display`.
#[cfg(feature = "mssql")]
fn display_mssql(text: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match super::MssqlConfig::parse(text) {
        Ok(config) => fmt::Display::fmt(&config, f),
        Err(_) => f.write_str("<unparseable SQL Server connection string>"),
    }
}

/// Without the parser nothing tells the password apart: the string is not shown.
#[cfg(not(feature = "mssql"))]
fn display_mssql(_text: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    f.write_str("<SQL Server connection string>")
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

    /// Each store's feature is one Cargo.toml declares, and this build (the default features)
    /// has every store.
    #[test]
    #[cfg(all(feature = "postgres", feature = "mssql", feature = "sqlite"))]
    fn each_store_names_its_cargo_feature() {
        let manifest = include_str!("../../Cargo.toml");
        for url in [
            StoreUrl::Postgres("postgres://h/d".to_owned()),
            StoreUrl::Mssql("mssql://h/d".to_owned()),
            StoreUrl::Sqlite("a.db".into()),
            StoreUrl::SqliteMemory,
        ] {
            let declared = format!("\n{} = [", url.feature());
            assert!(manifest.contains(&declared), "{declared}");
            assert_eq!(url.ensure_compiled_in(), Ok(()), "{url}");
        }
        // What a build without the store says (a worker stops at start-up with it).
        let refused = StoreUrl::Postgres("postgres://app:secret@db/d".to_owned()).not_compiled_in();
        assert_eq!(
            refused.to_string(),
            "unsupported store URL postgres://app:***@db/d: this build has no postgres store; \
             rebuild with the `postgres` cargo feature"
        );
    }
}
