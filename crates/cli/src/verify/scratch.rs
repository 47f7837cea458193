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
}

impl Entities {
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

/// Where the store's scenarios run: a scratch schema (PostgreSQL) or a scratch file beside the
/// given one (SQLite has no schemas), removed afterwards.
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
