//! `sb-inbox verify`: the article's verification scenarios against the user's own namespace and
//! database, on scratch entities and a scratch schema, with a pass/fail table and a JSON report.
//!
//! # Layout
//! - this file: [`VerifyOptions`], [`run`]: set up, run, always clean up.
//! - [`scratch`]: the scratch entities (management API) or the given ones (checked empty,
//!   purged), the scratch schema or file of the store.
//! - [`scenarios`]: one function per scenario, judged by the runtime's outcomes, the broker's
//!   answers and the store's rows; the latency measurements.
//! - [`report`]: results, the table, the exit code.
//!
//! # What it touches
//! Scratch queues named `sbv-xxxxxxxx-…` are created through the management API (which needs
//! Manage rights) and deleted at the end, also after a failure or Ctrl-C. With `--queue` it
//! uses the given queue instead: it refuses one that holds any message (it would have to purge
//! it afterwards), and purges what it sent. The store's scenarios run in a scratch schema
//! (`sbv_xxxxxxxx`, PostgreSQL) or a scratch file beside the given one (SQLite), dropped at the
//! end; the user's own tables are never read or written.

pub mod child;
pub mod report;
pub mod scenarios;
pub mod scratch;
pub mod tokens;

use sb_inbox::OutboxStore;
use sb_inbox::servicebus::ServiceBusClient;
use sb_inbox::servicebus::admin::{AdminClient, AdminError};
use sb_inbox::store::StoreUrl;
use tokio_util::sync::CancellationToken;

use crate::inventory::InventoryStore;
use report::{Environment, VerifyReport};
use scenarios::Harness;
use scratch::{Entities, ScratchStore};

/// Why verify could not run (a scenario's failure is a result, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A given entity holds messages verify did not send: it touched nothing.
    #[error(
        "{0} holds messages verify did not send; it touched nothing. Give an empty entity, or \
         none (verify then creates scratch entities)"
    )]
    Foreign(String),
    /// The management API refused or failed.
    #[error("{what}: {source}")]
    Admin {
        /// What verify was doing.
        what: String,
        /// The management API's error.
        #[source]
        source: AdminError,
    },
    /// The broker refused or failed.
    #[error("{what}: {detail}")]
    Broker {
        /// What verify was doing.
        what: String,
        /// The client's error.
        detail: String,
    },
    /// The store could not be prepared.
    #[error("{what}: {source}")]
    Store {
        /// What verify was doing.
        what: String,
        /// The store's error.
        #[source]
        source: sb_inbox::StoreError,
    },
    /// The options do not fit together.
    #[error("{0}")]
    Usage(String),
}

/// A fault verify puts into its own scratch store, for tests that show a scenario fails
/// against a broken store (`--break-store`, hidden): no external fault drops a constraint in
/// a schema verify creates itself. PostgreSQL only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreFault {
    /// The inbox's unique key `(consumer, message_id)` dropped.
    InboxUnique,
    /// The business keys' unique key `(consumer, business_key)` dropped.
    BusinessKeyUnique,
    /// The outbox forgets the relay's dispatch mark: a trigger keeps `dispatched_at` NULL, as
    /// a store that acknowledges an update it does not keep would.
    OutboxMarkLost,
}

impl StoreFault {
    /// The statements that break the scratch store (the names in sql/postgres/0001_inbox.sql).
    #[cfg(feature = "postgres")]
    fn statements(self) -> &'static [&'static str] {
        match self {
            StoreFault::InboxUnique => &["ALTER TABLE sb_inbox DROP CONSTRAINT pk_sb_inbox"],
            StoreFault::BusinessKeyUnique => {
                &["ALTER TABLE sb_inbox_business_key DROP CONSTRAINT pk_sb_inbox_business_key"]
            }
            StoreFault::OutboxMarkLost => &[
                "CREATE FUNCTION sbv_forget_dispatch() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN NEW.dispatched_at := NULL; RETURN NEW; END $$",
                "CREATE TRIGGER sbv_forget_dispatch BEFORE UPDATE ON sb_outbox FOR EACH ROW \
                 EXECUTE FUNCTION sbv_forget_dispatch()",
            ],
        }
    }
}

/// What to verify against.
#[derive(Debug)]
pub struct VerifyOptions {
    /// The namespace.
    pub client: ServiceBusClient,
    /// Its management API (required for scratch entities).
    pub admin: Option<AdminClient>,
    /// The store.
    pub store: StoreUrl,
    /// A given queue (no sessions) instead of scratch entities; verify refuses it unless empty.
    pub queue: Option<String>,
    /// A given queue that requires sessions (with `queue`); without it the session scenario is
    /// skipped.
    pub session_queue: Option<String>,
    /// Test-only: break the scratch store this way before the scenarios.
    pub store_fault: Option<StoreFault>,
    /// The environment the crash scenario's child process needs to reach the namespace as
    /// this process does (`SB_INBOX_SERVICEBUS_*`); secrets go there, never on a command line.
    pub child_env: Vec<(String, String)>,
    /// How long the idle-detach scenario leaves its sender idle (`--idle-secs`); `None` skips
    /// it.
    pub idle: Option<std::time::Duration>,
    /// The token refresh scenario's client (short-lived SAS tokens) and its recorded tokens;
    /// `None` skips it.
    pub token_refresh: Option<TokenRefresh>,
    /// Run only these scenarios (`--scenario`, names of [`scenarios::SCENARIOS`]); the others
    /// are reported skipped. Empty: all.
    pub only: Vec<String>,
}

/// A client of the same namespace whose SAS tokens live `--token-lifetime` (default
/// [`tokens::DEFAULT_TOKEN_LIFETIME`]).
#[derive(Debug, Clone)]
pub struct TokenRefresh {
    /// The client.
    pub client: ServiceBusClient,
    /// Its tokens, as issued.
    pub tokens: std::sync::Arc<tokens::ShortTokens>,
}

/// Sets up, runs every scenario, and removes what it created, also when `stop` is cancelled
/// (Ctrl-C) or a scenario fails.
///
/// # Errors
/// [`VerifyError`] when setting up fails (nothing is left behind then either) or a given entity
/// holds foreign messages.
pub async fn run(
    options: VerifyOptions,
    stop: &CancellationToken,
) -> Result<VerifyReport, VerifyError> {
    let prefix = scratch::run_prefix();
    let mut entities = match (&options.queue, &options.session_queue) {
        (Some(queue), session) => {
            scratch::ensure_empty(&options.client, queue).await?;
            if let Some(session) = session {
                scratch::ensure_empty(&options.client, session).await?;
            }
            Entities {
                queue: queue.clone(),
                session_queue: session.clone(),
                // The relayed event comes back on the given queue: verify reads it from there.
                outbox: queue.clone(),
                lock_queue: queue.clone(),
                scratch: false,
                lock_durations: Vec::new(),
            }
        }
        (None, Some(_)) => {
            return Err(VerifyError::Usage(
                "--session-queue needs --queue (or neither: scratch entities)".to_owned(),
            ));
        }
        (None, None) => {
            let admin = options.admin.as_ref().ok_or_else(|| {
                VerifyError::Usage("scratch entities need the management API".to_owned())
            })?;
            scratch::create(admin, &prefix).await?
        }
    };
    entities.read_lock_durations(options.admin.as_ref()).await;
    tracing::info!(prefix, entities = ?entities.names(), locks = ?entities.lock_durations, "Verification entities ready.");
    let tier = namespace_tier(options.admin.as_ref()).await;
    // Boxed: each store's set-up nests the whole run's future, deep enough to overflow the
    // compiler's layout queries in the binary's async main.
    let result = Box::pin(on_store(&options, &entities, &prefix, stop)).await;
    let mut left = remove_entities(&options, &entities, &prefix).await;
    match result {
        Ok((mut report, store_left)) => {
            report.environment.namespace_tier = tier;
            report.left_behind.extend(store_left);
            report.left_behind.append(&mut left);
            Ok(report)
        }
        Err(error) => {
            for what in &left {
                tracing::error!(%what, "Verify could not remove what it created.");
            }
            Err(error)
        }
    }
}

/// The namespace's tier as an SDK sees it (`Premium (2 MU)`), for the report; `None` when the
/// management API does not answer (no Manage rights): the report says "unknown", nothing fails.
async fn namespace_tier(admin: Option<&AdminClient>) -> Option<String> {
    let properties = match admin?.namespace_properties().await {
        Ok(properties) => properties,
        Err(error) => {
            tracing::info!(%error, "The namespace's properties are not readable; the report leaves its tier out.");
            return None;
        }
    };
    let sku = properties.messaging_sku?;
    Some(match properties.messaging_units {
        Some(units) => format!("{sku} ({units} MU)"),
        None => sku,
    })
}

/// Deletes the scratch entities, or purges the given ones.
async fn remove_entities(
    options: &VerifyOptions,
    entities: &Entities,
    prefix: &str,
) -> Vec<String> {
    if entities.scratch {
        let Some(admin) = &options.admin else {
            return Vec::new();
        };
        scratch::delete(admin, &scratch::scratch_names(prefix)).await
    } else {
        let mut left = scratch::purge(&options.client, &entities.queue, false).await;
        if let Some(session) = &entities.session_queue {
            left.extend(scratch::purge(&options.client, session, true).await);
        }
        left
    }
}

/// What `on_store` returns: the report and what could not be removed.
type Verified = Result<(VerifyReport, Vec<String>), VerifyError>;

/// A [`VerifyError::Store`] maker for `what`.
fn store_error(what: &str) -> impl FnOnce(sb_inbox::StoreError) -> VerifyError {
    let what = what.to_owned();
    move |source| VerifyError::Store { what, source }
}

/// Opens the scratch store, runs, and removes the scratch store; the report and what could
/// not be removed.
async fn on_store(
    options: &VerifyOptions,
    entities: &Entities,
    prefix: &str,
    stop: &CancellationToken,
) -> Verified {
    let run = Run {
        options,
        entities,
        prefix,
        stop,
    };
    match &options.store {
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(url) => run.on_postgres(url).await,
        _ if options.store_fault.is_some() => Err(VerifyError::Usage(
            "--break-store works on PostgreSQL only".to_owned(),
        )),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => run.on_sqlite(path).await,
        #[cfg(feature = "sqlite")]
        StoreUrl::SqliteMemory => {
            let store = sb_inbox::SqliteStore::open_in_memory()
                .map_err(store_error("opening an in-memory database"))?;
            prepare(&store).await?;
            let environment = run.environment(
                "sqlite",
                Some(rusqlite::version().to_owned()),
                &ScratchStore::SqliteMemory,
            );
            Ok((run.verify_on(store, environment, None).await, Vec::new()))
        }
        #[cfg(feature = "mssql")]
        StoreUrl::Mssql(text) => run.on_mssql(text).await,
        #[allow(unreachable_patterns, reason = "every store is compiled in by default")]
        other => Err(VerifyError::Usage(format!(
            "verify does not support the store {other} in this build (its feature is off)"
        ))),
    }
}

/// One verification run's settings, for each store's set-up and clean-up.
struct Run<'a> {
    options: &'a VerifyOptions,
    entities: &'a Entities,
    prefix: &'a str,
    stop: &'a CancellationToken,
}

impl Run<'_> {
    fn environment(
        &self,
        store: &str,
        database_version: Option<String>,
        scratch: &ScratchStore,
    ) -> Environment {
        environment(
            self.options,
            self.entities,
            store,
            database_version,
            scratch,
        )
    }

    async fn verify_on<S>(
        &self,
        store: S,
        environment: Environment,
        child: Option<scenarios::ChildStore>,
    ) -> VerifyReport
    where
        S: InventoryStore + OutboxStore + Clone,
    {
        verify_on(
            self.options,
            self.entities,
            self.prefix,
            store,
            environment,
            child,
            self.stop,
        )
        .await
    }

    /// A scratch schema of the given database (its URL's `search_path`), dropped with
    /// everything in it.
    #[cfg(feature = "postgres")]
    async fn on_postgres(&self, url: &str) -> Verified {
        let schema = scratch::schema_name(self.prefix);
        let admin = sb_inbox::PgStore::connect(url, 1)
            .await
            .map_err(store_error("connecting to the store"))?;
        // The schema name is verify's own (`sbv_` and hex digits), never input: an identifier
        // cannot be a bound parameter.
        admin
            .query(&format!("CREATE SCHEMA {schema}"), &[])
            .await
            .map_err(store_error("creating the scratch schema"))?;
        let version = admin
            .query("SELECT version()", &[])
            .await
            .ok()
            .and_then(|rows| {
                rows.first()
                    .and_then(|row| row.try_get::<_, String>(0).ok())
            });
        let scoped = scratch::with_search_path(url, &schema);
        let scratch = ScratchStore::Postgres {
            admin_url: url.to_owned(),
            schema: schema.clone(),
            url: scoped.clone(),
        };
        let result = match self.open_postgres(&scoped).await {
            Ok(store) => {
                let environment = self.environment("postgres", version, &scratch);
                let child = Some(scenarios::ChildStore::url(scoped));
                Ok(self.verify_on(store, environment, child).await)
            }
            Err(error) => Err(error),
        };
        // Dropped whatever happened above: the scratch schema is the store's only trace.
        let left = match admin
            .query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"), &[])
            .await
        {
            Ok(_) => Vec::new(),
            Err(error) => vec![format!("schema {schema}: {error}")],
        };
        result.map(|report| (report, left))
    }

    /// The scratch schema's store, migrated (and broken, with `--break-store`).
    #[cfg(feature = "postgres")]
    async fn open_postgres(&self, scoped: &str) -> Result<sb_inbox::PgStore, VerifyError> {
        let store = sb_inbox::PgStore::connect(scoped, 4)
            .await
            .map_err(store_error("connecting to the scratch schema"))?;
        prepare(&store).await?;
        if let Some(fault) = self.options.store_fault {
            tracing::warn!(
                ?fault,
                "Breaking the scratch store on purpose (--break-store)."
            );
            // Constants, never input; created in the scratch schema (the search path) and
            // dropped with it.
            for statement in fault.statements() {
                store
                    .query(statement, &[])
                    .await
                    .map_err(store_error("breaking the scratch store"))?;
            }
        }
        Ok(store)
    }

    /// A scratch file beside the given one, removed with its journals.
    #[cfg(feature = "sqlite")]
    async fn on_sqlite(&self, path: &std::path::Path) -> Verified {
        let file = scratch::sqlite_scratch(path, self.prefix);
        let scratch = ScratchStore::SqliteFile(file.clone());
        let opened = async {
            let store = sb_inbox::SqliteStore::open(&file)
                .map_err(store_error("creating the scratch database file"))?;
            prepare(&store).await?;
            Ok::<_, VerifyError>(store)
        }
        .await;
        let result = match opened {
            Ok(store) => {
                let version = Some(rusqlite::version().to_owned());
                let environment = self.environment("sqlite", version, &scratch);
                let child = Some(scenarios::ChildStore::url(format!(
                    "sqlite://{}",
                    file.display()
                )));
                Ok(self.verify_on(store, environment, child).await)
            }
            Err(error) => Err(error),
        };
        let left = scratch::remove_sqlite(&file);
        result.map(|report| (report, left))
    }

    /// A scratch schema of the given SQL Server database, owned by a user without login as
    /// whom the store's sessions run (see [`scratch::MSSQL_CREATE`]); dropped with everything
    /// in it and the user.
    #[cfg(feature = "mssql")]
    async fn on_mssql(&self, text: &str) -> Verified {
        let schema = scratch::schema_name(self.prefix);
        let config = sb_inbox::store::MssqlConfig::parse(text)
            .map_err(store_error("reading the store's connection string"))?;
        let admin = sb_inbox::MssqlStore::connect_with(config.clone(), 1)
            .await
            .map_err(store_error("connecting to the store"))?;
        scratch::mssql_create(&admin, &schema)
            .await
            .map_err(store_error("creating the scratch schema and its user"))?;
        let version = admin
            .query("SELECT @@VERSION", &[])
            .await
            .ok()
            .and_then(|rows| {
                rows.first()
                    .and_then(|row| row.get::<&str, _>(0).map(str::to_owned))
            });
        let scratch = ScratchStore::Mssql {
            schema: schema.clone(),
        };
        let mut scoped = config;
        scoped.set_execute_as(&schema);
        let opened = async {
            let store = sb_inbox::MssqlStore::connect_with(scoped, 4)
                .await
                .map_err(store_error("connecting as the scratch schema's user"))?;
            prepare(&store).await?;
            Ok::<_, VerifyError>(store)
        }
        .await;
        let result = match opened {
            Ok(store) => {
                let environment = self.environment("mssql", version, &scratch);
                let child = Some(scenarios::ChildStore {
                    url: text.to_owned(),
                    execute_as: Some(schema.clone()),
                });
                // The store's sessions end with it, before its user is dropped.
                Ok(self.verify_on(store, environment, child).await)
            }
            Err(error) => Err(error),
        };
        let left = match scratch::mssql_drop(&admin, &schema).await {
            Ok(()) => Vec::new(),
            Err(error) => vec![format!("schema {schema} and its user: {error}")],
        };
        result.map(|report| (report, left))
    }
}

/// Migrates the scratch store: the core tables and the reference consumer's.
async fn prepare<S: InventoryStore + MigrateAll>(store: &S) -> Result<(), VerifyError> {
    store
        .migrate_all()
        .await
        .map_err(|source| VerifyError::Store {
            what: "migrating the scratch store".to_owned(),
            source,
        })
}

/// The core migrations and the reference consumer's, for each store.
trait MigrateAll {
    async fn migrate_all(&self) -> Result<(), sb_inbox::StoreError>;
}

#[cfg(feature = "postgres")]
impl MigrateAll for sb_inbox::PgStore {
    async fn migrate_all(&self) -> Result<(), sb_inbox::StoreError> {
        self.migrate().await?;
        self.migrate_inventory().await.map(drop)
    }
}

#[cfg(feature = "mssql")]
impl MigrateAll for sb_inbox::MssqlStore {
    async fn migrate_all(&self) -> Result<(), sb_inbox::StoreError> {
        self.migrate().await?;
        self.migrate_inventory().await.map(drop)
    }
}

#[cfg(feature = "sqlite")]
impl MigrateAll for sb_inbox::SqliteStore {
    async fn migrate_all(&self) -> Result<(), sb_inbox::StoreError> {
        self.migrate().await?;
        self.migrate_inventory().await.map(drop)
    }
}

fn environment(
    options: &VerifyOptions,
    entities: &Entities,
    store: &str,
    database_version: Option<String>,
    scratch: &ScratchStore,
) -> Environment {
    Environment {
        namespace: options.client.host().to_owned(),
        entities: if entities.scratch { "scratch" } else { "given" }.to_owned(),
        entity_names: entities.names(),
        store: store.to_owned(),
        database_version,
        // Filled in by `run`, which asks the management API once.
        namespace_tier: None,
        scratch_store: scratch.describe(),
        tool_version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// Measures, then runs every scenario on `store`.
async fn verify_on<S>(
    options: &VerifyOptions,
    entities: &Entities,
    prefix: &str,
    store: S,
    environment: Environment,
    child_store: Option<scenarios::ChildStore>,
    stop: &CancellationToken,
) -> VerifyReport
where
    S: InventoryStore + OutboxStore + Clone,
{
    let measurements = scenarios::measure(&options.client, &entities.queue, &store, prefix).await;
    let harness = Harness {
        client: options.client.clone(),
        store,
        entities: entities.clone(),
        prefix: prefix.to_owned(),
        idle: options.idle,
        token_refresh: options.token_refresh.clone(),
        only: options.only.clone(),
        child: child_store.and_then(|store| {
            let program = std::env::current_exe().ok()?;
            Some(scenarios::ChildCommand {
                program,
                env: options.child_env.clone(),
                store,
            })
        }),
    };
    let scenarios = harness.run_all(stop).await;
    VerifyReport {
        scenarios,
        measurements,
        environment,
        left_behind: Vec::new(),
    }
}
