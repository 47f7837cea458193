//! The `sb-inbox` command line.

#[cfg(feature = "sqlite")]
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
#[cfg(feature = "mssql")]
use sb_inbox::MssqlStore;
#[cfg(feature = "postgres")]
use sb_inbox::PgStore;
#[cfg(feature = "sqlite")]
use sb_inbox::SqliteStore;
#[cfg(feature = "entra")]
use sb_inbox::entra::{EntraCredential, EntraMode};
use sb_inbox::runtime::Backoff;
use sb_inbox::servicebus::admin::AdminClient;
use sb_inbox::servicebus::{
    ConnectionString, DEFAULT_SERVER_BUSY_WAIT, ProxyConfig, ServiceBusClient,
    ServiceBusSenderPort, Transport, TrustRoots,
};
use sb_inbox::store::StoreUrl;
use sb_inbox::telemetry::{LogFormat, OTEL_ENV_VARS, TelemetryConfig};
use sb_inbox::worker::{ENV_VARS, MOVED, WorkerConfig};
use sb_inbox_cli::inventory::InventoryStore;
use sb_inbox_cli::ops::{self, OpsError, dlq};
use sb_inbox_cli::retry;
use sb_inbox_cli::verify::tokens::{DEFAULT_TOKEN_LIFETIME, MIN_TOKEN_LIFETIME, ShortTokens};
use tokio_util::sync::CancellationToken;

/// sb-inbox: the Idempotent Consumer for Azure Service Bus.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Log lines on stderr: text (for people) or json (one object per line, for collectors).
    #[arg(long, global = true, default_value = "text", value_parser = parse_log_format)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

fn parse_log_format(text: &str) -> Result<LogFormat, String> {
    text.parse()
        .map_err(|e: sb_inbox::telemetry::LogFormatError| e.to_string())
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the article's scenario on the embedded default: the Service Bus emulator in-process,
    /// SQLite, two worker instances, duplicates, a crash window, poison messages. Exits non-zero
    /// unless every order took effect exactly once.
    Demo,
    /// Runs the worker (the reference inventory consumer: orders.order-placed v1 and v2,
    /// orders.order-cancelled.v1) until SIGTERM or Ctrl-C. One process can host several
    /// consumers: `[[consumers]]` entries (name, entity, concurrency, prefetch, envelope,
    /// unknown_contracts) in worker.toml instead of `consumer` and `servicebus.entity`.
    /// `[envelope]` (SB_INBOX_ENVELOPE…) reads MassTransit, NServiceBus, CloudEvents or raw
    /// messages.
    #[command(after_help = env_help())]
    Run {
        /// worker.toml; every key can be overridden by its environment variable (below).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Applies the store's core schema migrations (sql/<provider>/: inbox, business keys,
    /// aggregate versions, outbox), each once; with --inventory also the reference consumer's
    /// tables (inventory_*), which `sb-inbox run` needs. A database that is unavailable (resuming,
    /// failing over, throttling) is waited for, about five minutes at most.
    Migrate {
        /// Also apply the reference inventory consumer's migration (crates/cli/sql/<provider>/0002_inventory.sql).
        #[arg(long)]
        inventory: bool,
        /// The store: postgres://USER@HOST/DB, an ADO.NET SQL Server connection string
        /// (Server=tcp:HOST,1433;Database=…;…) or mssql://USER:PASSWORD@HOST:1433/DB,
        /// sqlite://PATH or sqlite::memory:.
        #[arg(long, env = "SB_INBOX_STORE", hide_env_values = true)]
        store: String,
    },
    /// Publishes orders of the reference contract orders.order-placed.v1, each with a stable
    /// message id (the file's messageId, else order-placed-<orderId>), and prints a summary.
    /// Every order is checked before the first is sent.
    #[command(after_help = SEND_HELP)]
    Send {
        #[command(flatten)]
        broker: BrokerArgs,
        /// A JSON array of orders: [{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 2}],
        /// "messageId": "optional"}, …].
        #[arg(
            long,
            required_unless_present = "generate",
            conflicts_with = "generate"
        )]
        file: Option<PathBuf>,
        /// Generate this many orders (ids gen-<seed>-<i>) instead of reading a file.
        #[arg(long)]
        generate: Option<usize>,
        /// Send this many of the orders a second time with the same message id.
        #[arg(long, default_value_t = 0)]
        duplicates: usize,
        /// Seed for generated orders and for choosing the duplicates (random if not given; the
        /// summary prints it, so a run can be repeated with the same message ids).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Runs the article's verification scenarios against your own namespace and database:
    /// duplicate delivery, a republished message, dead-lettering with its reason read back,
    /// session order, the outbox relayed once, the store's conformance suite, lock loss, a
    /// crash between commit and settlement, a delayed retry (the list in --help). On scratch
    /// queues it creates through the management API (Manage rights) and deletes, or on
    /// --queue, which it refuses unless empty and purges afterwards; the store's part runs in a
    /// scratch schema (PostgreSQL) or file (SQLite), dropped afterwards. Prints a pass/fail
    /// table and the broker round trip, store commit latency and the window they imply. Exit
    /// code 0 only if every scenario passed; 1 if one failed (or verify could not set up or
    /// clean up); 3 if none failed but some were skipped (the table says what they need).
    #[command(after_help = VERIFY_HELP)]
    Verify {
        #[command(flatten)]
        namespace: NamespaceArgs,
        /// The store: postgres://USER@HOST/DB, sqlite://PATH or sqlite::memory:.
        #[arg(long, env = "SB_INBOX_STORE", hide_env_values = true)]
        store: String,
        /// Use this queue (without sessions or duplicate detection) instead of scratch queues:
        /// refused unless it holds no message, active, scheduled or dead-lettered.
        #[arg(long)]
        queue: Option<String>,
        /// With --queue: a queue that requires sessions, for the session scenario (skipped
        /// without it). Refused unless empty, as --queue.
        #[arg(long, requires = "queue")]
        session_queue: Option<String>,
        /// The management API's address (default: https on the namespace's host), e.g. the
        /// sb-emulator's plain --http-listen address http://127.0.0.1:PORT.
        #[arg(long)]
        admin_endpoint: Option<String>,
        /// Also write the results as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
        /// Also write the results as one self-contained HTML page to FILE: scenarios,
        /// timings, round trip, window, namespace tier, database version.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Exit 0 when no scenario failed even if some were skipped (a runner that reads only
        /// the exit code, e.g. the Container Apps job verifyAfterDeploy: with Entra ID
        /// token_refresh is always skipped). The table and reports still say what was skipped.
        #[arg(long)]
        allow_skipped: bool,
        /// Run idle_detach_survival: a sender left idle SECS seconds, then used. 660 against a
        /// namespace (the service detaches links idle for 10 minutes); past an emulator's
        /// --link-idle-timeout.
        #[arg(long, value_name = "SECS")]
        idle_secs: Option<u64>,
        /// Run token_refresh (the token's lifetime plus a few seconds): a sender on SAS tokens
        /// verify signs for --token-lifetime must refresh its token and keep working past the
        /// first one's expiry. Needs --connection with a key.
        #[arg(long)]
        token_refresh: bool,
        /// How long token_refresh's tokens are valid, at least 10. The default, 150, makes the
        /// client refresh 2 minutes after a put as it does an hour-long token; a shorter one
        /// (CI: 20) is refreshed at half its life, still before it expires.
        #[arg(long, value_name = "SECS", requires = "token_refresh",
              default_value_t = DEFAULT_TOKEN_LIFETIME.as_secs(),
              value_parser = clap::value_parser!(u64).range(MIN_TOKEN_LIFETIME.as_secs()..))]
        token_lifetime: u64,
        /// Test-only: drop a unique constraint in verify's scratch schema (PostgreSQL), to
        /// show the scenarios that depend on it fail.
        #[arg(long, hide = true, value_enum)]
        break_store: Option<sb_inbox_cli::verify::StoreFault>,
        /// Run only this scenario (repeatable); the others are reported skipped.
        #[arg(long = "scenario", value_name = "NAME",
              value_parser = clap::builder::PossibleValuesParser::new(sb_inbox_cli::verify::scenarios::SCENARIOS))]
        scenarios: Vec<String>,
    },
    /// verify's crash scenario's other process: processes one delivery of --queue and
    /// freezes after its commit, before its settlement, until verify kills it.
    #[command(hide = true)]
    VerifyChild {
        #[command(flatten)]
        namespace: NamespaceArgs,
        #[arg(long, env = "SB_INBOX_STORE", hide_env_values = true)]
        store: String,
        #[arg(long)]
        queue: String,
        #[arg(long)]
        consumer: String,
        /// Stall after the handler (see verify::child).
        #[arg(long)]
        stall: bool,
        /// The entity's lock duration, as verify read it from the management API.
        #[arg(long, value_name = "MS")]
        lock_duration_ms: Option<u64>,
        /// SQL Server: run the store's sessions as this database user (the scratch schema's).
        #[arg(long, value_name = "USER")]
        store_user: Option<String>,
    },
    /// Operator commands on an entity's dead-letter queue.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// Lists dead letters without locking them: sequence number, message id, logical id,
    /// subject, delivery count, dead-letter reason and description; never the body.
    Peek {
        #[command(flatten)]
        broker: BrokerArgs,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        max: u32,
    },
    /// Sends dead letters back to their entity under a fresh broker message id with the
    /// logical id kept (sb-inbox-logical-id), then completes them: a message that was in fact
    /// processed is completed as a duplicate by the consumer. Fix the cause first, and stay
    /// within the retention's DLQ resubmission window. On a session entity a copy goes to the
    /// end of its session, behind messages sent after the original: the session's order is
    /// broken for it, so resubmit only what does not depend on that order (or replay the
    /// session's later messages after it yourself).
    Resubmit {
        #[command(flatten)]
        broker: BrokerArgs,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        max: usize,
        /// Only the dead letters whose broker or logical message id is this.
        #[arg(long)]
        message_id: Option<String>,
        /// Send the copies here instead of the entity: required for a subscription (the topic
        /// reaches every subscription; a queue it forwards to reaches only it).
        #[arg(long)]
        to: Option<String>,
        /// Stop once no dead letter arrives for this many seconds.
        #[arg(long, default_value_t = 5)]
        wait_secs: u64,
        /// The DLQ resubmission window the dedupe retention covers (the worker's
        /// retention.dlq_resubmit_window_secs): older dead letters are refused and stay.
        #[arg(
            long,
            env = "SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS",
            default_value_t = 604_800
        )]
        window_secs: u64,
        /// worker.toml whose [envelope] the entity's consumer reads (also SB_INBOX_ENVELOPE,
        /// SB_INBOX_ENVELOPE_TYPES, …): copies keep the envelope's logical id (a MassTransit
        /// messageId, an NServiceBus.MessageId), not the broker's. Without it an envelope's
        /// copy is keyed on its broker id, which the inbox does not know.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// Where an operator command goes, and how it authenticates.
#[derive(Debug, clap::Args)]
struct BrokerArgs {
    /// The entity: a queue, or TOPIC/Subscriptions/SUBSCRIPTION for dlq commands (send takes a
    /// queue or a topic).
    #[arg(long)]
    entity: String,
    #[command(flatten)]
    namespace: NamespaceArgs,
}

impl BrokerArgs {
    fn client(&self) -> anyhow::Result<ServiceBusClient> {
        self.namespace.client()
    }
}

/// The namespace and how to reach and authenticate to it.
#[derive(Debug, clap::Args)]
struct NamespaceArgs {
    /// A Service Bus connection string (SAS, or the emulator's).
    #[arg(long, env = "SB_INBOX_SERVICEBUS_CONNECTION", hide_env_values = true)]
    connection: Option<String>,
    /// Or the namespace NAME.servicebus.windows.net, with Microsoft Entra ID (Azure CLI login,
    /// managed or workload identity; AZURE_CLIENT_ID selects a user-assigned identity).
    #[arg(long, env = "SB_INBOX_SERVICEBUS_NAMESPACE")]
    namespace: Option<String>,
    /// amqp (TCP, port 5671) or websockets (wss://HOST:443/$servicebus/websocket, for networks
    /// that block 5671); default: the connection string's TransportType, else amqp. WebSockets
    /// go through the HTTP proxy HTTPS_PROXY names unless NO_PROXY lists the host, as the
    /// worker's.
    #[arg(long, env = "SB_INBOX_SERVICEBUS_TRANSPORT")]
    transport: Option<Transport>,
    /// PEM bundle of extra CAs trusted for amqps/wss (an inspecting proxy's, a test
    /// emulator's), as the worker's servicebus.ca_file; default: SSL_CERT_FILE.
    #[arg(long, env = "SB_INBOX_SERVICEBUS_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// true: also trust the operating system's certificate store (default: Mozilla's roots
    /// only), as the worker's servicebus.native_roots.
    #[arg(
        long,
        env = "SB_INBOX_SERVICEBUS_NATIVE_ROOTS",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = parse_flag
    )]
    native_roots: Option<bool>,
    /// After the service answers busy, every operation waits this long (0 to 600000; default
    /// 10000), as the worker's servicebus.server_busy_wait_ms.
    #[arg(
        long,
        env = "SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS",
        value_parser = clap::value_parser!(u64).range(0..=600_000)
    )]
    server_busy_wait_ms: Option<u64>,
}

/// `true`/`1`/`yes` or `false`/`0`/`no`, the words the worker's configuration takes for a flag.
fn parse_flag(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(format!("{text:?} is not true or false")),
    }
}

impl NamespaceArgs {
    /// The client as the worker builds it (`ConfiguredWorker`): the address, then the
    /// server-busy wait, the trust roots and the WebSocket proxy from the same settings, so one
    /// environment serves the worker and the operator commands.
    fn client(&self) -> anyhow::Result<ServiceBusClient> {
        self.configure(self.address()?)
    }

    /// `client` with the settings every client of these arguments takes.
    fn configure(&self, client: ServiceBusClient) -> anyhow::Result<ServiceBusClient> {
        let busy_wait = self
            .server_busy_wait_ms
            .map_or(DEFAULT_SERVER_BUSY_WAIT, Duration::from_millis);
        // The variables curl and the official SDKs' HTTP stacks read, as the worker does.
        let proxy = ProxyConfig::from_env_vars(|name| std::env::var(name).ok())
            .context("invalid HTTPS_PROXY / NO_PROXY")?;
        let client = client
            .with_server_busy_wait(busy_wait)
            .with_trust(&self.trust_roots())
            .context(
                "invalid --ca-file (SB_INBOX_SERVICEBUS_CA_FILE, else SSL_CERT_FILE) or \
                 --native-roots (SB_INBOX_SERVICEBUS_NATIVE_ROOTS)",
            )?
            .with_proxy(&proxy);
        Ok(client)
    }

    /// A client of the connection string's namespace whose SAS tokens live `lifetime`,
    /// configured as [`NamespaceArgs::client`] (verify's token refresh scenario).
    fn short_token_client(
        &self,
        lifetime: Duration,
    ) -> anyhow::Result<sb_inbox_cli::verify::TokenRefresh> {
        let Some(connection) = &self.connection else {
            anyhow::bail!("--token-refresh needs --connection with a key");
        };
        let mut cs: ConnectionString = connection
            .parse()
            .context("invalid --connection (SB_INBOX_SERVICEBUS_CONNECTION)")?;
        if let Some(transport) = self.transport {
            cs = cs.with_transport(transport);
        }
        let sb_inbox::servicebus::Credential::Key { name, key } = cs.credential() else {
            anyhow::bail!("--token-refresh needs a connection string with a key, not a signature");
        };
        let tokens = std::sync::Arc::new(ShortTokens::new(name.clone(), key.clone(), lifetime));
        let client = ServiceBusClient::new(cs.amqp_url(), cs.host(), tokens.clone());
        Ok(sb_inbox_cli::verify::TokenRefresh {
            client: self.configure(client)?,
            tokens,
        })
    }

    /// The environment that gives a child process (verify's crash scenario) these settings.
    fn child_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        let mut set = |name: &str, value: String| env.push((name.to_owned(), value));
        if let Some(connection) = &self.connection {
            set("SB_INBOX_SERVICEBUS_CONNECTION", connection.clone());
        }
        if let Some(namespace) = &self.namespace {
            set("SB_INBOX_SERVICEBUS_NAMESPACE", namespace.clone());
        }
        if let Some(transport) = self.transport {
            let name = match transport {
                Transport::AmqpWebSockets => "websockets",
                _ => "amqp",
            };
            set("SB_INBOX_SERVICEBUS_TRANSPORT", name.to_owned());
        }
        if let Some(ca_file) = &self.ca_file {
            set("SB_INBOX_SERVICEBUS_CA_FILE", ca_file.display().to_string());
        }
        if let Some(native_roots) = self.native_roots {
            set("SB_INBOX_SERVICEBUS_NATIVE_ROOTS", native_roots.to_string());
        }
        if let Some(wait) = self.server_busy_wait_ms {
            set("SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS", wait.to_string());
        }
        env
    }

    /// Mozilla's roots, plus `--ca-file` (else `SSL_CERT_FILE`, as the worker) and the OS store
    /// with `--native-roots`.
    fn trust_roots(&self) -> TrustRoots {
        let mut roots = TrustRoots::new();
        let ca_file = self.ca_file.clone().or_else(|| {
            std::env::var_os("SSL_CERT_FILE")
                .filter(|path| !path.is_empty())
                .map(PathBuf::from)
        });
        if let Some(path) = ca_file {
            roots = roots.with_ca_file(path);
        }
        if self.native_roots == Some(true) {
            roots = roots.with_native_roots();
        }
        roots
    }

    /// The client for `--connection` or `--namespace`, before the settings every client takes.
    fn address(&self) -> anyhow::Result<ServiceBusClient> {
        match (&self.connection, &self.namespace) {
            (Some(connection), None) => {
                let mut cs: ConnectionString = connection
                    .parse()
                    .context("invalid --connection (SB_INBOX_SERVICEBUS_CONNECTION)")?;
                if let Some(transport) = self.transport {
                    cs = cs.with_transport(transport);
                }
                Ok(ServiceBusClient::from_connection_string(&cs))
            }
            #[cfg(feature = "entra")]
            (None, Some(host)) if host.contains('.') && !host.contains('/') => {
                let client_id = std::env::var("AZURE_CLIENT_ID")
                    .ok()
                    .filter(|id| !id.is_empty());
                Ok(ServiceBusClient::with_entra_over(
                    host,
                    EntraCredential::new(EntraMode::Default, client_id),
                    self.transport.unwrap_or_default(),
                ))
            }
            #[cfg(not(feature = "entra"))]
            (None, Some(host)) if host.contains('.') && !host.contains('/') => anyhow::bail!(
                "--namespace {host} takes Entra ID tokens, and this build has no `entra` cargo \
                 feature: use --connection"
            ),
            (None, Some(host)) => anyhow::bail!(
                "--namespace {host:?} is not a host name like NAME.servicebus.windows.net"
            ),
            (Some(_), Some(_)) => anyhow::bail!(
                "give --connection (SB_INBOX_SERVICEBUS_CONNECTION) or --namespace \
                 (SB_INBOX_SERVICEBUS_NAMESPACE), not both"
            ),
            (None, None) => anyhow::bail!(
                "give --connection (SB_INBOX_SERVICEBUS_CONNECTION) or --namespace \
                 (SB_INBOX_SERVICEBUS_NAMESPACE)"
            ),
        }
    }
}

const VERIFY_HELP: &str = "Scenarios: duplicate_delivery, republished_message, dead_letter_reason,
session_order, outbox_relayed_once, store_conformance, lock_loss_fenced,
crash_between_commit_and_settlement, delayed_retry, idle_detach_survival, token_refresh (the last
two are reported skipped unless asked for: idle_detach_survival with --idle-secs, token_refresh
with --token-refresh).

Examples:
  sb-inbox verify --connection \"$SB_CONNECTION\" --store postgres://app@db/app --report verify.json
  sb-inbox verify --namespace my-ns.servicebus.windows.net --store sqlite://./verify.db --idle-secs 660
  sb-inbox verify --connection \"$SB_CONNECTION\" --queue verify --store sqlite::memory:";

const SEND_HELP: &str = "Examples:
  sb-inbox send --entity orders --file orders.json
  sb-inbox send --entity orders --generate 100 --duplicates 10 --seed 42";

fn env_help() -> String {
    let mut text = String::from("Environment overrides:\n");
    for (var, key, meaning) in ENV_VARS {
        text.push_str(&format!("  {var:<34} {key:<36} {meaning}\n"));
    }
    text.push_str(&format!(
        "\nThe reference consumer's own (no worker.toml key):\n  {:<34} {:<36} {}\n",
        sb_inbox_cli::run::OUTBOX_DESTINATION_VAR,
        "(outbox.destination before)",
        "queue or topic its stock-reserved events go to; unset = none"
    ));
    text.push_str("\nMoved keys (the old place is still read, with a warning):\n");
    for moved in MOVED {
        text.push_str(&format!("  {:<34} -> {}\n", moved.old, moved.new.file));
    }
    text.push_str(
        "\nWith servicebus.namespace the worker authenticates with Microsoft Entra ID: workload\n\
         identity (AZURE_FEDERATED_TOKEN_FILE), else managed identity (IDENTITY_ENDPOINT; AZURE_CLIENT_ID\n\
         selects a user-assigned one), else the Azure CLI / Azure Developer CLI login.\n",
    );
    text.push_str("\nTelemetry (OpenTelemetry over OTLP/gRPC; no endpoint = logs only):\n");
    for (var, meaning) in OTEL_ENV_VARS {
        text.push_str(&format!("  {var:<50} {meaning}\n"));
    }
    text
}

#[tokio::main]
async fn main() -> ExitCode {
    // Exactly one rustls crypto provider in this binary: ring (SQL Server TLS, Entra ID token
    // requests and the AMQP connection all use the process default). An Err means one is
    // installed already, which can only be this same provider.
    // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange); ring is kept
    // on purpose: the project's one provider, lighter to build than aws-lc-rs.
    #[allow(deprecated)]
    let ring = rustls::crypto::ring::default_provider();
    if ring.install_default().is_err() {
        tracing::debug!("A rustls crypto provider was installed already.");
    }
    let cli = Cli::parse();
    let env = |name: &str| std::env::var(name).ok();
    let mut telemetry_config = match TelemetryConfig::from_env(&env) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    telemetry_config.log_format = cli.log_format;
    // The demo's expected warnings (refused settlements, poison messages) would bury its table.
    if matches!(cli.command, Command::Demo) && env("RUST_LOG").is_none() {
        telemetry_config.log_filter = "error".to_owned();
    }
    let telemetry = match sb_inbox::telemetry::init(&telemetry_config) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("error: telemetry: {error}");
            return ExitCode::from(2);
        }
    };
    if telemetry.exporting() {
        tracing::info!(endpoint = ?telemetry_config.endpoint, service = %telemetry_config.service_name, "Exporting spans and metrics over OTLP.");
    }
    let code = run(cli.command).await;
    // Flushing waits for the collector: off the async threads.
    if tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .is_err()
    {
        eprintln!("warning: telemetry shutdown panicked");
    }
    code
}

async fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Demo => return demo().await,
        Command::Run { config } => return run_worker(config).await,
        Command::Migrate { store, inventory } => migrate(&store, inventory).await,
        Command::Send {
            broker,
            file,
            generate,
            duplicates,
            seed,
        } => send(&broker, file, generate, duplicates, seed).await,
        Command::Verify {
            namespace,
            store,
            queue,
            session_queue,
            admin_endpoint,
            report,
            html,
            allow_skipped,
            idle_secs,
            token_refresh,
            token_lifetime,
            break_store,
            scenarios,
        } => {
            let given = GivenEntities {
                token_refresh: token_refresh.then(|| Duration::from_secs(token_lifetime)),
                queue,
                session_queue,
                store_fault: break_store,
                idle: idle_secs.map(Duration::from_secs),
                only: scenarios,
            };
            let files = ReportFiles {
                json: report,
                html,
                allow_skipped,
            };
            return verify(&namespace, &store, given, admin_endpoint.as_deref(), files).await;
        }
        Command::VerifyChild {
            namespace,
            store,
            queue,
            consumer,
            stall,
            lock_duration_ms,
            store_user,
        } => {
            let child = ChildArgs {
                queue,
                consumer,
                stall,
                lock: lock_duration_ms.map(Duration::from_millis),
                store_user,
            };
            return verify_child(&namespace, &store, child).await;
        }
        Command::Dlq { command } => return run_dlq(command).await,
    };
    exit_code(result)
}

/// `Ok` is success; an error is printed and fails.
fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `dlq peek` and `dlq resubmit`; exit code 2 when resubmit's worker.toml does not load.
async fn run_dlq(command: DlqCommand) -> ExitCode {
    let result = match command {
        DlqCommand::Peek { broker, max } => dlq_peek(&broker, max).await,
        DlqCommand::Resubmit {
            broker,
            max,
            message_id,
            to,
            wait_secs,
            window_secs,
            config,
        } => {
            let envelope = match WorkerConfig::load_envelope(config.as_deref(), &|name| {
                std::env::var(name).ok()
            }) {
                Ok(envelope) => envelope,
                Err(errors) => {
                    eprintln!("{errors}");
                    return ExitCode::from(2);
                }
            };
            let mut options = dlq::ResubmitOptions::new(max);
            options.envelope = envelope;
            options.message_id = message_id;
            options.idle = Duration::from_secs(wait_secs);
            options.window = Duration::from_secs(window_secs);
            dlq_resubmit(&broker, to.as_deref(), &options).await
        }
    };
    exit_code(result)
}

/// What `verify-child` runs besides its namespace and store (see `sb_inbox_cli::verify::child`).
struct ChildArgs {
    queue: String,
    consumer: String,
    stall: bool,
    lock: Option<Duration>,
    store_user: Option<String>,
}

/// `verify-child`: exit code 2 when the namespace or store does not parse, else the child's.
async fn verify_child(namespace: &NamespaceArgs, store: &str, args: ChildArgs) -> ExitCode {
    let setup = || -> anyhow::Result<_> { Ok((namespace.client()?, store.parse()?)) };
    let (client, store) = match setup() {
        Ok(setup) => setup,
        Err(error) => {
            println!("error: {error:#}");
            return ExitCode::from(2);
        }
    };
    // Its own thread: it freezes that thread on purpose (see verify::child).
    let child = std::thread::spawn(move || {
        let ChildArgs {
            queue,
            consumer,
            stall,
            lock,
            store_user,
        } = args;
        sb_inbox_cli::verify::child::run(client, store, queue, consumer, stall, lock, store_user)
    });
    let code = tokio::task::spawn_blocking(move || child.join().unwrap_or(1))
        .await
        .unwrap_or(1);
    ExitCode::from(code)
}

/// The management API client for the namespace's credentials and trust, at `endpoint` when
/// given.
fn admin_client(namespace: &NamespaceArgs, endpoint: Option<&str>) -> anyhow::Result<AdminClient> {
    let proxy = ProxyConfig::from_env_vars(|name| std::env::var(name).ok())
        .context("invalid HTTPS_PROXY / NO_PROXY")?;
    let trust = namespace.trust_roots();
    let admin = match (&namespace.connection, &namespace.namespace) {
        (Some(connection), _) => {
            let cs: ConnectionString = connection
                .parse()
                .context("invalid --connection (SB_INBOX_SERVICEBUS_CONNECTION)")?;
            AdminClient::from_connection_string(&cs)?.with_trust(&trust)?
        }
        #[cfg(feature = "entra")]
        (None, Some(host)) => {
            let client_id = std::env::var("AZURE_CLIENT_ID")
                .ok()
                .filter(|id| !id.is_empty());
            let tokens = sb_inbox::servicebus::EntraProvider::new(EntraCredential::new(
                EntraMode::Default,
                client_id,
            ));
            AdminClient::for_namespace(host, std::sync::Arc::new(tokens), &trust)?
        }
        _ => anyhow::bail!(
            "give --connection (SB_INBOX_SERVICEBUS_CONNECTION) or --namespace \
             (SB_INBOX_SERVICEBUS_NAMESPACE)"
        ),
    };
    let admin = admin.with_proxy(&proxy);
    Ok(match endpoint {
        Some(url) => admin
            .with_endpoint(url)
            .context("invalid --admin-endpoint")?,
        None => admin,
    })
}

/// `verify`'s entity options, and its test-only store fault.
struct GivenEntities {
    queue: Option<String>,
    session_queue: Option<String>,
    store_fault: Option<sb_inbox_cli::verify::StoreFault>,
    idle: Option<Duration>,
    /// token_refresh's token lifetime, when asked for.
    token_refresh: Option<Duration>,
    /// `--scenario`: the scenarios to run (empty: all).
    only: Vec<String>,
}

/// Where `verify` writes its report besides the table, and how its exit code reads skips.
struct ReportFiles {
    json: Option<PathBuf>,
    html: Option<PathBuf>,
    allow_skipped: bool,
}

async fn verify(
    namespace: &NamespaceArgs,
    store: &str,
    given: GivenEntities,
    admin_endpoint: Option<&str>,
    files: ReportFiles,
) -> ExitCode {
    let setup = || -> anyhow::Result<sb_inbox_cli::verify::VerifyOptions> {
        Ok(sb_inbox_cli::verify::VerifyOptions {
            client: namespace.client()?,
            admin: Some(admin_client(namespace, admin_endpoint)?),
            store: store.parse()?,
            queue: given.queue,
            session_queue: given.session_queue,
            store_fault: given.store_fault,
            child_env: namespace.child_env(),
            idle: given.idle,
            token_refresh: match given.token_refresh {
                Some(lifetime) => Some(namespace.short_token_client(lifetime)?),
                None => None,
            },
            only: given.only,
        })
    };
    let options = match setup() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("error: {error:#}");
            return ExitCode::from(2);
        }
    };
    // Ctrl-C or SIGTERM ends the scenarios early; what verify created is still removed.
    let stop = CancellationToken::new();
    let signal = tokio::spawn({
        let stop = stop.clone();
        async move {
            wait_for_signal().await;
            tracing::warn!("Signal received; verify removes what it created and stops.");
            stop.cancel();
        }
    });
    let result = sb_inbox_cli::verify::run(options, &stop).await;
    signal.abort();
    let report = match result {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: {}", with_causes(&error));
            return ExitCode::FAILURE;
        }
    };
    println!("\nsb-inbox verify: {}\n", report.environment.namespace);
    print!("{}", report.table());
    if let Some(path) = files.json {
        let written = serde_json::to_vec_pretty(&report)
            .map_err(anyhow::Error::from)
            .and_then(|json| std::fs::write(&path, json).map_err(anyhow::Error::from));
        if let Err(error) = written {
            eprintln!("error: writing {}: {error:#}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = files.html
        && let Err(error) = std::fs::write(&path, report.html())
    {
        eprintln!("error: writing {}: {error}", path.display());
        return ExitCode::FAILURE;
    }
    let code = report.exit_code();
    if files.allow_skipped && code == sb_inbox_cli::verify::report::EXIT_SKIPPED {
        return ExitCode::SUCCESS;
    }
    ExitCode::from(code)
}

async fn send(
    broker: &BrokerArgs,
    file: Option<PathBuf>,
    generate: Option<usize>,
    duplicates: usize,
    seed: Option<u64>,
) -> anyhow::Result<()> {
    let seed = seed.unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let orders = match (&file, generate) {
        (Some(path), _) => ops::send::orders_from_file(path)?,
        (None, Some(count)) => ops::send::generate(count, seed),
        (None, None) => anyhow::bail!("give --file or --generate"),
    };
    let messages = ops::send::with_duplicates(&orders, duplicates, seed)?;
    let client = broker.client()?;
    let published = ops::send::publish(
        &ServiceBusSenderPort::new(client.clone()),
        &broker.entity,
        messages,
    )
    .await;
    let published = published.map_err(|error| match error {
        OpsError::Partial { done, total, error } => anyhow::anyhow!(
            "sending to {} failed after {done} of {total} message(s) were accepted: {error}",
            broker.entity
        ),
        other => other.into(),
    })?;
    println!(
        "sent {} message(s) to {}: {} order(s), {} duplicate(s) with the same message id, seed {seed}",
        published.sent,
        broker.entity,
        published.distinct,
        published.sent - published.distinct,
    );
    Ok(())
}

async fn dlq_peek(broker: &BrokerArgs, max: u32) -> anyhow::Result<()> {
    let client = broker.client()?;
    let queue = dlq::dead_letter_queue(&broker.entity);
    let peeked = client.peek(&queue, 0, max).await;
    let peeked = peeked.with_context(|| format!("peeking {queue}"))?;
    for message in &peeked {
        println!("{}", dlq::describe(message));
    }
    println!("{} dead letter(s) in {queue}", peeked.len());
    Ok(())
}

async fn dlq_resubmit(
    broker: &BrokerArgs,
    to: Option<&str>,
    options: &dlq::ResubmitOptions,
) -> anyhow::Result<()> {
    let destination = dlq::resubmit_destination(&broker.entity, to)?;
    let client = broker.client()?;
    let queue = dlq::dead_letter_queue(&broker.entity);
    let receiver = client.receiver(&queue, 0);
    // The idle window (--wait-secs) is the dead-letter queue's silence: connecting and
    // attaching, seconds against a real namespace, must not use it up and report nothing
    // resubmitted.
    let result = match receiver.attach_now().await {
        Ok(()) => {
            dlq::resubmit(
                &receiver,
                &ServiceBusSenderPort::new(client.clone()),
                &destination,
                options,
            )
            .await
        }
        Err(error) => Err(OpsError::Partial {
            done: 0,
            total: options.max,
            error: format!("attaching to {queue}: {error}"),
        }),
    };
    receiver.close().await;
    let report = result.with_context(|| format!("resubmitting from {queue} to {destination}"))?;
    for done in &report.resubmitted {
        println!(
            "resubmitted message_id={:?} as {:?} logical_id={:?}",
            done.from, done.to, done.logical_id
        );
    }
    for (id, why) in &report.left {
        println!("left message_id={id:?}: {why}");
    }
    println!(
        "{} dead letter(s) resubmitted from {queue} to {destination}, {} left",
        report.resubmitted.len(),
        report.left.len()
    );
    Ok(())
}

async fn migrate(store: &str, inventory: bool) -> anyhow::Result<()> {
    let url: StoreUrl = store.parse()?;
    // A database that is resuming (serverless auto-pause, 40613), failing over or throttling is
    // waited for, as the worker's store open does; migrations are idempotent, so a retry
    // re-applies only what is missing.
    let backoff = Backoff::new(retry::FIRST_DELAY, retry::MAX_DELAY);
    let applied = retry::until_available(
        retry::MIGRATE_ATTEMPTS,
        backoff,
        || migrate_once(&url, inventory),
        |error, delay| {
            tracing::warn!(%error, retry_in = ?delay, "The database is not available yet; migrate retries.");
        },
    )
    .await
    .with_context(|| format!("migrating {url}"))?;
    println!("{applied} migration(s) applied to {url}");
    Ok(())
}

/// One attempt: connect, then apply what is missing.
async fn migrate_once(url: &StoreUrl, inventory: bool) -> Result<usize, sb_inbox::StoreError> {
    match url {
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(raw) => migrate_store(PgStore::connect(raw, 1).await?, inventory).await,
        #[cfg(feature = "mssql")]
        StoreUrl::Mssql(raw) => migrate_store(MssqlStore::connect(raw, 1).await?, inventory).await,
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => migrate_store(SqliteStore::open(path)?, inventory).await,
        #[cfg(feature = "sqlite")]
        StoreUrl::SqliteMemory => migrate_store(SqliteStore::open_in_memory()?, inventory).await,
        // The parse refuses a store this build lacks (naming its cargo feature).
        _ => Err(sb_inbox::StoreError::configuration(format!(
            "unsupported store {url}"
        ))),
    }
}

/// The core migrations, then the reference consumer's when asked for.
async fn migrate_store<S: MigrateCore + InventoryStore>(
    store: S,
    inventory: bool,
) -> Result<usize, sb_inbox::StoreError> {
    let core = store.migrate_core().await?;
    let reference = if inventory {
        store.migrate_inventory().await?
    } else {
        0
    };
    Ok(core + reference)
}

/// `migrate` of each store, under one name.
trait MigrateCore {
    async fn migrate_core(&self) -> Result<usize, sb_inbox::StoreError>;
}

#[cfg(feature = "postgres")]
impl MigrateCore for PgStore {
    async fn migrate_core(&self) -> Result<usize, sb_inbox::StoreError> {
        self.migrate().await
    }
}

#[cfg(feature = "mssql")]
impl MigrateCore for MssqlStore {
    async fn migrate_core(&self) -> Result<usize, sb_inbox::StoreError> {
        self.migrate().await
    }
}

#[cfg(feature = "sqlite")]
impl MigrateCore for SqliteStore {
    async fn migrate_core(&self) -> Result<usize, sb_inbox::StoreError> {
        self.migrate().await
    }
}

async fn run_worker(path: Option<PathBuf>) -> ExitCode {
    let config = match WorkerConfig::load(path.as_deref(), &|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("error: {errors}");
            return ExitCode::from(2);
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            wait_for_signal().await;
            tracing::info!("Signal received; draining.");
            shutdown.cancel();
        }
    });
    let events = sb_inbox_cli::run::outbox_destination(&|name| std::env::var(name).ok());
    match sb_inbox_cli::run::run(&config, events.as_deref(), shutdown).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", with_causes(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its sources on one line, each cause once: a variant that already shows its
/// source in its own text does not repeat it.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

async fn wait_for_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// The demo runs on SQLite: a build without it says so.
#[cfg(not(feature = "sqlite"))]
async fn demo() -> ExitCode {
    eprintln!("error: the demo runs on SQLite, and this build has no `sqlite` cargo feature");
    ExitCode::FAILURE
}

#[cfg(feature = "sqlite")]
async fn demo() -> ExitCode {
    eprintln!("sb-inbox demo: Service Bus emulator in-process, SQLite, two worker instances.");
    let progress = |done: u64, total: u64| {
        const WIDTH: u64 = 40;
        let filled = (done * WIDTH)
            .checked_div(total)
            .unwrap_or(WIDTH)
            .min(WIDTH);
        let filled = usize::try_from(filled).unwrap_or(0);
        let bar = format!("{}{}", "#".repeat(filled), "-".repeat(40 - filled));
        let mut err = std::io::stderr();
        let _ = write!(err, "\r  [{bar}] {done}/{total} messages settled");
        let _ = err.flush();
    };
    let result = sb_inbox_cli::demo::run(sb_inbox_cli::demo::DemoPlan::default(), &progress).await;
    eprintln!();
    match result {
        Ok(report) => {
            println!("\nsb-inbox demo: one business effect per order\n");
            print!("{}", sb_inbox_cli::demo::table(&report));
            println!("\n  database: {}", report.database.display());
            if report.is_correct() {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: the effect count is wrong");
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
