//! `sb-emulator`: an Azure Service Bus emulator for development and tests.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Azure Service Bus emulator (AMQP 1.0, plain TCP) for development and tests.
///
/// Prints the connection string as the first line on stdout, logs to stderr, and stops cleanly
/// on SIGTERM or Ctrl-C. Not for production: production is Azure Service Bus.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Microsoft emulator Config.json (namespace, queues, topics, subscriptions, rules). Without
    /// it, the built-in config (queue.1, orders, topic.1/subscription.1) is used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port. Never 5672 in tests.
    #[arg(long, default_value = "127.0.0.1:5672")]
    listen: String,
    /// Accept JWTs on $cbs without validating them.
    #[arg(long)]
    accept_jwt: bool,
}

const BUILT_IN: &str = include_str!("../config/Config.json");

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let text = match &args.config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("error: cannot read {}: {error}", path.display());
                return ExitCode::from(2);
            }
        },
        None => BUILT_IN.to_owned(),
    };
    let broker = match sb_emulator::Config::from_json(&text)
        .map_err(sb_emulator::Error::from)
        .and_then(sb_emulator::Broker::new)
    {
        Ok(broker) => broker,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let options = sb_emulator::EmulatorOptions {
        listen: args.listen,
        accept_jwt: args.accept_jwt,
        ..Default::default()
    };
    let emulator = match sb_emulator::Emulator::start(broker, options).await {
        Ok(emulator) => emulator,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", emulator.connection_string());
    wait_for_signal().await;
    tracing::info!("Shutting down.");
    emulator.shutdown().await;
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
