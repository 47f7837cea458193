//! The `sb-inbox` command line.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sb_inbox::store::StoreUrl;
use sb_inbox::telemetry::{LogFormat, OTEL_ENV_VARS, TelemetryConfig};
use sb_inbox::worker::{ENV_VARS, WorkerConfig};
use sb_inbox::{MssqlStore, PgStore, SqliteStore};
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
    /// Runs the worker (the reference inventory consumer) until SIGTERM or Ctrl-C.
    #[command(after_help = env_help())]
    Run {
        /// worker.toml; every key can be overridden by its environment variable (below).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Applies the store's schema migrations (sql/<provider>/), each once.
    Migrate {
        /// The store: postgres://USER@HOST/DB, an ADO.NET SQL Server connection string
        /// (Server=tcp:HOST,1433;Database=…;…) or mssql://USER:PASSWORD@HOST:1433/DB,
        /// sqlite://PATH or sqlite::memory:.
        #[arg(long, env = "SB_INBOX_STORE", hide_env_values = true)]
        store: String,
    },
}

fn env_help() -> String {
    let mut text = String::from("Environment overrides:\n");
    for (var, key, meaning) in ENV_VARS {
        text.push_str(&format!("  {var:<34} {key:<36} {meaning}\n"));
    }
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
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
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
    match command {
        Command::Demo => demo().await,
        Command::Run { config } => run_worker(config).await,
        Command::Migrate { store } => match migrate(&store).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error:#}");
                ExitCode::FAILURE
            }
        },
    }
}

async fn migrate(store: &str) -> anyhow::Result<()> {
    let url: StoreUrl = store.parse()?;
    let applied = match &url {
        StoreUrl::Postgres(raw) => PgStore::connect(raw, 1).await?.migrate().await,
        StoreUrl::Mssql(raw) => {
            MssqlStore::connect(raw, 1)
                .await
                .with_context(|| format!("connecting to {url}"))?
                .migrate()
                .await
        }
        StoreUrl::Sqlite(path) => SqliteStore::open(path)?.migrate().await,
        StoreUrl::SqliteMemory => SqliteStore::open_in_memory()?.migrate().await,
        _ => anyhow::bail!("unsupported store {url}"),
    }
    .with_context(|| format!("migrating {url}"))?;
    println!("{applied} migration(s) applied to {url}");
    Ok(())
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
    match sb_inbox::worker::run(&config, shutdown).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
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
    let result = sb_inbox::demo::run(sb_inbox::demo::DemoPlan::default(), &progress).await;
    eprintln!();
    match result {
        Ok(report) => {
            println!("\nsb-inbox demo: one business effect per order\n");
            print!("{}", sb_inbox::demo::table(&report));
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
