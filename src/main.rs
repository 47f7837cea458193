//! The `sb-inbox` command line.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sb_inbox::store::StoreUrl;
use sb_inbox::{MssqlStore, PgStore, SqliteStore};

/// sb-inbox: the Idempotent Consumer for Azure Service Bus.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Applies the store's schema migrations (sql/<provider>/), each once.
    Migrate {
        /// The store: postgres://USER@HOST/DB, an ADO.NET SQL Server connection string
        /// (Server=tcp:HOST,1433;Database=…;…) or mssql://USER:PASSWORD@HOST:1433/DB,
        /// sqlite://PATH or sqlite::memory:.
        #[arg(long, env = "SB_INBOX_STORE", hide_env_values = true)]
        store: String,
    },
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate { store } => {
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
    }
}
