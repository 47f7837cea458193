//! What verify creates and must remove: scratch entities on the namespace (through the
//! management API) and a scratch schema (PostgreSQL) or file (SQLite) for the store; or the
//! entities a user gave, checked empty before and purged after.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sb_inbox::servicebus::ServiceBusClient;
use sb_inbox::servicebus::admin::{AdminClient, AdminError, EntityProperties};

use super::VerifyError;

/// A verification run's unique prefix: `sbv-` and 8 hex digits, in every scratch name, so
/// what a run left behind (a killed process) is recognisable and never someone else's.
pub fn run_prefix() -> String {
    format!("sbv-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// The entities the scenarios use.
#[derive(Debug, Clone)]
pub struct Entities {
    /// A queue without sessions and without duplicate detection.
    pub queue: String,
    /// A queue that requires sessions, when there is one.
    pub session_queue: Option<String>,
    /// Where the outbox scenario relays to.
    pub outbox: String,
    /// A queue with a short lock, for the lock-loss scenario.
    pub lock_queue: String,
    /// Whether verify created them (and deletes them) or was given them (and purges them).
    pub scratch: bool,
    /// Each entity's lock duration as the management API gave it (none where it did not
    /// answer: no Manage rights).
    pub lock_durations: Vec<(String, Duration)>,
}

impl Entities {
    /// `entity`'s lock duration, when the management API gave it.
    pub fn lock_duration(&self, entity: &str) -> Option<Duration> {
        self.lock_durations
            .iter()
            .find(|(name, _)| name == entity)
            .map(|(_, lock)| *lock)
    }

    /// Reads each entity's lock duration from the management API: a runtime told it bounds
    /// every lock by it (`RuntimeConfig::lock_duration`). Where the API does not answer (no
    /// Manage rights) the runtimes reckon each lock from the broker's timestamps alone, and
    /// the report says so in the lock-loss scenario's result.
    pub async fn read_lock_durations(&mut self, admin: Option<&AdminClient>) {
        let Some(admin) = admin else { return };
        for name in self.names() {
            match admin.entity(&name).await {
                Ok(Some(entity)) => {
                    if let Some(lock) = entity.properties.lock_duration {
                        self.lock_durations.push((name, lock));
                    }
                }
                Ok(None) => {
                    tracing::warn!(entity = %name, "The management API does not know the entity; its lock duration is unknown.")
                }
                Err(error) => {
                    tracing::warn!(entity = %name, %error, "The entity's lock duration is not readable; locks are reckoned from the broker's timestamps alone.")
                }
            }
        }
    }

    /// Every entity, for the report.
    pub fn names(&self) -> Vec<String> {
        let mut names = vec![self.queue.clone()];
        if let Some(session) = &self.session_queue {
            names.push(session.clone());
        }
        for other in [&self.outbox, &self.lock_queue] {
            if !names.contains(other) {
                names.push(other.clone());
            }
        }
        names
    }
}

/// A scratch queue's settings: the service's defaults except a 30 s lock (so a redelivery
/// after a lost lock takes seconds, not a minute) and sessions when asked for. Duplicate
/// detection stays off: the duplicate scenarios need the broker to deliver both copies.
fn scratch_properties(sessions: bool, lock: Duration) -> EntityProperties {
    EntityProperties {
        lock_duration: Some(lock),
        max_delivery_count: Some(10),
        default_message_time_to_live: Some(Duration::from_secs(3600)),
        requires_session: sessions,
        ..EntityProperties::default()
    }
}

/// The lock of the lock-loss queue: short, so the stalled consumer loses it within seconds.
const SHORT_LOCK: Duration = Duration::from_secs(5);

/// The names of a run's scratch queues.
pub fn scratch_names(prefix: &str) -> [String; 4] {
    [
        format!("{prefix}-q"),
        format!("{prefix}-sq"),
        format!("{prefix}-out"),
        format!("{prefix}-lock"),
    ]
}

/// Creates the scratch queues `<prefix>-q`, `<prefix>-sq` (sessions), `<prefix>-out` and
/// `<prefix>-lock` (short lock).
/// What was created before a failure is deleted again.
///
/// # Errors
/// [`VerifyError::Admin`] when one cannot be created.
pub async fn create(admin: &AdminClient, prefix: &str) -> Result<Entities, VerifyError> {
    let [queue, session, outbox, lock] = scratch_names(prefix);
    let entities = Entities {
        queue: queue.clone(),
        session_queue: Some(session.clone()),
        outbox: outbox.clone(),
        lock_queue: lock.clone(),
        scratch: true,
        lock_durations: Vec::new(),
    };
    let long = Duration::from_secs(30);
    let plan = [
        (queue, false, long),
        (session, true, long),
        (outbox, false, long),
        (lock, false, SHORT_LOCK),
    ];
    let mut created = Vec::new();
    for (name, sessions, lock) in plan {
        match admin
            .create(&name, &scratch_properties(sessions, lock))
            .await
        {
            Ok(_) => created.push(name),
            Err(error) => {
                let _left = delete(admin, &created).await;
                return Err(VerifyError::Admin {
                    what: format!("creating scratch queue {name}"),
                    source: error,
                });
            }
        }
    }
    Ok(entities)
}

/// Deletes `names`; returns those that could not be deleted, with why.
pub async fn delete(admin: &AdminClient, names: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for name in names {
        match admin.delete(name).await {
            Ok(()) | Err(AdminError::NotFound(_)) => {}
            Err(error) => left.push(format!("queue {name}: {error}")),
        }
    }
    left
}

/// Refuses a given entity that holds any message (active, scheduled or dead-lettered): those
/// are not verify's, and purging it afterwards would lose them. Peeking locks nothing.
///
/// # Errors
/// [`VerifyError::Foreign`] naming the entity, [`VerifyError::Broker`] when it cannot be peeked.
pub async fn ensure_empty(client: &ServiceBusClient, entity: &str) -> Result<(), VerifyError> {
    for queue in [entity.to_owned(), format!("{entity}/$DeadLetterQueue")] {
        let peeked = client
            .peek(&queue, 0, 1)
            .await
            .map_err(|error| VerifyError::Broker {
                what: format!("peeking {queue}"),
                detail: error.to_string(),
            })?;
        if !peeked.is_empty() {
            return Err(VerifyError::Foreign(queue));
        }
    }
    Ok(())
}

/// Receives and completes whatever is left on a given entity and its dead-letter queue (all
/// of it verify's: it refused the entity unless empty); sessions are drained session by
/// session. Returns what could not be purged.
pub async fn purge(client: &ServiceBusClient, entity: &str, sessions: bool) -> Vec<String> {
    let mut left = Vec::new();
    let quiet = Duration::from_secs(2);
    if sessions {
        loop {
            match client.accept_next_session(entity, quiet).await {
                Ok(Some(session)) => {
                    while let Ok(Some(delivery)) = session.receive(quiet).await {
                        if let Err(error) = delivery.complete().await {
                            left.push(format!("{entity}: {error}"));
                            break;
                        }
                    }
                    session.close().await;
                }
                Ok(None) => break,
                Err(error) => {
                    left.push(format!("{entity}: {error}"));
                    break;
                }
            }
        }
    }
    let mut queues = vec![format!("{entity}/$DeadLetterQueue")];
    if !sessions {
        queues.push(entity.to_owned());
    }
    for queue in queues {
        let receiver = client.receiver(&queue, 0);
        loop {
            match tokio::time::timeout(quiet, receiver.receive_message()).await {
                Ok(Ok(Some(delivery))) => {
                    if let Err(error) = delivery.complete().await {
                        left.push(format!("{queue}: {error}"));
                        break;
                    }
                }
                Ok(Ok(None)) | Err(_) => break,
                Ok(Err(error)) => {
                    left.push(format!("{queue}: {error}"));
                    break;
                }
            }
        }
        receiver.close().await;
    }
    left
}

/// Where the store's scenarios run: a scratch schema (PostgreSQL, SQL Server) or a scratch
/// file beside the given one (SQLite has no schemas), removed afterwards.
#[derive(Debug, Clone)]
pub enum ScratchStore {
    /// A schema of the given database; the URL sets its search path.
    #[cfg(feature = "postgres")]
    Postgres {
        /// The user's URL.
        admin_url: String,
        /// The schema.
        schema: String,
        /// The URL whose sessions use the schema.
        url: String,
    },
    /// A scratch database file in the given file's folder.
    #[cfg(feature = "sqlite")]
    SqliteFile(PathBuf),
    /// A private in-memory database: nothing to remove.
    #[cfg(feature = "sqlite")]
    SqliteMemory,
    /// A schema of the given SQL Server database, owned by a user of its name without login
    /// as whom the store's sessions run.
    #[cfg(feature = "mssql")]
    Mssql {
        /// The schema (and its user).
        schema: String,
    },
}

impl ScratchStore {
    /// Its name for the report.
    pub fn describe(&self) -> String {
        match self {
            #[cfg(feature = "postgres")]
            ScratchStore::Postgres { schema, .. } => format!("schema {schema}"),
            #[cfg(feature = "sqlite")]
            ScratchStore::SqliteFile(path) => format!("file {}", path.display()),
            #[cfg(feature = "sqlite")]
            ScratchStore::SqliteMemory => "in memory".to_owned(),
            #[cfg(feature = "mssql")]
            ScratchStore::Mssql { schema } => format!("schema {schema}"),
        }
    }
}

/// `sbv_xxxxxxxx`: the run prefix as an unquoted SQL identifier.
pub fn schema_name(prefix: &str) -> String {
    prefix.replace('-', "_")
}

/// The URL with `search_path` set to `schema` for every session (libpq's `options`).
#[cfg(feature = "postgres")]
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// The scratch file for a SQLite database at `path`: same folder, so the same file system
/// and locking as the user's.
#[cfg(feature = "sqlite")]
pub fn sqlite_scratch(path: &Path, prefix: &str) -> PathBuf {
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
    folder
        .unwrap_or_else(|| Path::new("."))
        .join(format!("{prefix}.verify.db"))
}

/// Removes a SQLite scratch file and its journal files.
#[cfg(feature = "sqlite")]
pub fn remove_sqlite(path: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let mut names = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        names.push(PathBuf::from(name));
    }
    for name in names {
        match std::fs::remove_file(&name) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => left.push(format!("file {}: {error}", name.display())),
        }
    }
    left
}

/// Creates the SQL Server scratch schema `@P1`, owned by a database user of the same name
/// without login whose default schema it is: the store's unqualified table names resolve
/// there once a session runs as that user (`MssqlConfig::set_execute_as`). The name is bound,
/// quoted by `QUOTENAME` on the server, and each DDL runs in a batch of its own (`CREATE
/// SCHEMA` must be a batch's first statement). Microsoft Learn: "CREATE USER (Transact-SQL)"
/// (`WITHOUT LOGIN`, `DEFAULT_SCHEMA`), "CREATE SCHEMA (Transact-SQL)" (`AUTHORIZATION`: the
/// principal that owns it, which then may alter it), "CREATE TABLE (Transact-SQL)"
/// (permissions: `CREATE TABLE` in the database and `ALTER` on the schema). The connecting
/// principal needs `ALTER ANY USER`, `CREATE SCHEMA` and `IMPERSONATE` on the new user:
/// db_owner has all three.
#[cfg(feature = "mssql")]
pub const MSSQL_CREATE: &str = "DECLARE @name sysname = @P1;
DECLARE @q nvarchar(300) = QUOTENAME(@name);
DECLARE @sql nvarchar(max) = N'CREATE USER ' + @q + N' WITHOUT LOGIN WITH DEFAULT_SCHEMA = ' + @q;
EXEC sys.sp_executesql @sql;
SET @sql = N'CREATE SCHEMA ' + @q + N' AUTHORIZATION ' + @q;
EXEC sys.sp_executesql @sql;
SET @sql = N'GRANT CREATE TABLE TO ' + @q;
EXEC sys.sp_executesql @sql;";

/// Drops the SQL Server scratch schema `@P1`, everything in it, and its user: a schema that
/// holds objects cannot be dropped, nor a user that owns one (Microsoft Learn, "DROP SCHEMA
/// (Transact-SQL)": "The schema that is being dropped must not contain any objects";
/// "DROP USER (Transact-SQL)": a user that owns securables cannot be dropped). Foreign keys go
/// first (a referenced table cannot be dropped), then the tables and any views, procedures,
/// functions and sequences (indexes, constraints and triggers go with their tables). Each part
/// is skipped when absent, so it also cleans up after a create that failed half way.
#[cfg(feature = "mssql")]
pub const MSSQL_DROP: &str = "DECLARE @name sysname = @P1;
DECLARE @q nvarchar(300) = QUOTENAME(@name);
DECLARE @sql nvarchar(max) = N'';
SELECT @sql = @sql + ISNULL(STRING_AGG(CAST(N'ALTER TABLE ' + @q + N'.'
       + QUOTENAME(OBJECT_NAME(parent_object_id)) + N' DROP CONSTRAINT ' + QUOTENAME(name)
       + N'; ' AS nvarchar(max)), N''), N'')
  FROM sys.foreign_keys WHERE schema_id = SCHEMA_ID(@name);
SELECT @sql = @sql + ISNULL(STRING_AGG(CAST(N'DROP ' + CASE type WHEN 'U' THEN N'TABLE'
       WHEN 'V' THEN N'VIEW' WHEN 'P' THEN N'PROCEDURE' WHEN 'SO' THEN N'SEQUENCE'
       ELSE N'FUNCTION' END + N' ' + @q + N'.' + QUOTENAME(name) + N'; ' AS nvarchar(max)),
       N''), N'')
  FROM sys.objects
 WHERE schema_id = SCHEMA_ID(@name) AND type IN ('U', 'V', 'P', 'SO', 'FN', 'IF', 'TF');
IF SCHEMA_ID(@name) IS NOT NULL SET @sql = @sql + N'DROP SCHEMA ' + @q + N'; ';
IF DATABASE_PRINCIPAL_ID(@name) IS NOT NULL SET @sql = @sql + N'DROP USER ' + @q + N';';
EXEC sys.sp_executesql @sql;";

/// Creates the SQL Server scratch schema and its user `name` (see [`MSSQL_CREATE`]); what a
/// failed create left is dropped again.
///
/// # Errors
/// The store's error when the server refuses (no rights, say).
#[cfg(feature = "mssql")]
pub async fn mssql_create(
    admin: &sb_inbox::MssqlStore,
    name: &str,
) -> Result<(), sb_inbox::StoreError> {
    if let Err(error) = admin.execute(MSSQL_CREATE, &[&name]).await {
        if let Err(left) = mssql_drop(admin, name).await {
            tracing::error!(%left, schema = name, "The half-created scratch schema could not be dropped.");
        }
        return Err(error);
    }
    Ok(())
}

/// Drops the SQL Server scratch schema, its objects and its user `name` (see [`MSSQL_DROP`]).
///
/// # Errors
/// The store's error when the server refuses.
#[cfg(feature = "mssql")]
pub async fn mssql_drop(
    admin: &sb_inbox::MssqlStore,
    name: &str,
) -> Result<(), sb_inbox::StoreError> {
    admin.execute(MSSQL_DROP, &[&name]).await.map(drop)
}
