//! `sb-emulator`: an Azure Service Bus emulator for development and tests.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sb_emulator::{
    Broker, Clock, Config, Emulator, EmulatorOptions, Error, SharedAccessPolicy, TlsIdentity,
    TlsListen,
};

/// Azure Service Bus emulator (AMQP 1.0 over plain TCP, and plain WebSockets) for development
/// and tests.
///
/// Prints the connection string as the first line on stdout, logs to stderr, and stops cleanly
/// on SIGTERM or Ctrl-C. Not for production: production is Azure Service Bus.
///
/// Strict by default, like the service: `open` advertises max-frame-size 65536, channel-max
/// 4999 and idle-time-out 120000 ms and closes connections silent for longer; entity links idle
/// for 10 minutes are force-detached; links are detached when the token that authorised them
/// expires. Faults the service produces at random can be injected per operation (--fault);
/// others have flags of their own (--management-fault, --settlement-timeouts,
/// --detach-receive-links-after, --throttle, --attach-delay, --clock-step).
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Microsoft emulator Config.json (namespace, queues, topics, subscriptions, rules). Without
    /// it, the built-in config (queue.1, orders, topic.1/subscription.1) is used. Extension:
    /// `"SharedAccessPolicies": [{"Name": "listener", "Key": "…", "Rights": ["Listen"]}]` on the
    /// namespace adds keys with Listen / Send / Manage rights beside RootManageSharedAccessKey
    /// (all rights): a Send-only key cannot receive, a Listen-only key cannot send, rule
    /// operations need Manage; refused with `amqp:unauthorized-access` and the service's
    /// "'Listen' claim(s) are required" text.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port. Never 5672 in tests.
    #[arg(long, default_value = "127.0.0.1:5672")]
    listen: String,
    /// Accept JWTs on $cbs without validating them.
    #[arg(long)]
    accept_jwt: bool,
    /// Force-detach an entity link with no transfer, flow or disposition for SECS seconds, with
    /// `amqp:link:detach-forced` and the service's text ("… AmqpMessageConsumer.IdleTimerExpired:
    /// Idle timeout: 00:10:00."). The service uses 600; 0 turns it off (the service cannot).
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    link_idle_timeout: u64,
    /// Honour a put token for at most SECS seconds, whatever its own expiry, so clients' token
    /// refresh is testable in seconds. A link whose token expired without a fresh put-token is
    /// detached with `amqp:unauthorized-access`; new attaches are refused.
    #[arg(long, value_name = "SECS")]
    max_token_lifetime: Option<u64>,
    /// Inject a fault with probability P per operation; repeatable. `detach-link=P`: per
    /// transfer or disposition, detach a random live entity link with
    /// `com.microsoft:server-busy`. `busy-settle=P`: per disposition, answer
    /// `rejected{com.microsoft:server-busy}` and leave the message locked. `drop-connection=P`:
    /// per transfer, close the connection with `amqp:connection:forced`. `cbs-busy=P`: per
    /// put-token, answer 503 without granting (the service's `$cbs` during a gateway upgrade;
    /// the SDKs retry 408/500/503). `end-session=P`: per transfer, end the link's AMQP session
    /// with `amqp:internal-error` while the connection stays (.NET rebuilds the session).
    #[arg(long = "fault", value_name = "NAME=P")]
    faults: Vec<sb_emulator::FaultSpec>,
    /// Answer the next N management requests (default 1) with FAULT instead of handling them,
    /// on the HTTP management API and on the AMQP `<entity>/$management` nodes (lock renewal,
    /// peek, settlement by lock token), each surface counting its own N; repeatable, applied in
    /// order. `busy`: HTTP 503, `$management` 503 with `com.microsoft:server-busy` (.NET's
    /// administration client reads 503 as ServiceBusy, `HttpRequestAndResponse.ThrowIfRequestFailed`;
    /// its AMQP side maps the reply's server-busy to `ServerBusyException`,
    /// `AmqpExceptionHelper.ToMessagingContractException`; both retried). `throttled`: HTTP
    /// 429 (retried by Azure.Core, `ResponseClassifier`), `$management` as `busy` with the
    /// throttling text. `timeout`: 408, `com.microsoft:timeout`. `internal-error`: 500,
    /// `amqp:internal-error`. `stall`: never answered (the client's timeout must end it).
    #[arg(long = "management-fault", value_name = "FAULT[xN]")]
    management_faults: Vec<sb_emulator::ManagementFaultSpec>,
    /// Leave the next N link dispositions (complete, abandon, dead-letter, defer on a receive
    /// link) unanswered and unapplied, so the client's settlement times out and the message
    /// stays locked until the lock runs out or the client settles it again (by lock token on
    /// `$management`, say). The service can lose a disposition's answer: the SDKs bound the
    /// wait ("Update disposition request timed out", Azure/azure-sdk-for-java#41967;
    /// azure-amqp waited forever before 2.3.3, Azure/azure-amqp#114).
    #[arg(long, value_name = "N", default_value_t = 0)]
    settlement_timeouts: usize,
    /// Force-detach every receive link MS milliseconds after its attach (re-attached links
    /// too), with `amqp:link:detach-forced` and the service's "… is force detached. Code:
    /// consumer(…). Details: InnerMessageReceiver was closed." (what the service sends when it
    /// closes its side of a consumer, e.g. on a gateway or broker node move:
    /// Azure/azure-sdk-for-js#22963, Azure/azure-sdk-for-java#6280). Sender links are kept.
    #[arg(long, value_name = "MS")]
    detach_receive_links_after: Option<u64>,
    /// Also serve AMQP over WebSockets on ADDR: plain `ws` (no TLS), path
    /// `/$servicebus/websocket`, subprotocol `AMQPWSB10`, as the SDKs' `AmqpOverWebsocket`
    /// transport speaks it (the service itself serves `wss` on 443). Its connection string
    /// (`…;TransportType=AmqpWebSockets;`) is printed as the second line on stdout.
    #[arg(long, value_name = "ADDR")]
    websocket_listen: Option<String>,
    /// Throttle the namespace for SECS seconds from the first settlement attempt: every
    /// disposition and send is answered `rejected{com.microsoft:server-busy}` and every
    /// `$management` request 503 with that condition, as a throttled namespace answers
    /// ("…being throttled. Error code : 50002", Microsoft's "Throttling operations on Azure
    /// Service Bus"); the SDKs then wait 10 s (.NET) or 4 s (Java) before retrying.
    #[arg(long, value_name = "SECS")]
    throttle: Option<u64>,
    /// Also serve AMQP over TLS (`amqps`), over secure WebSockets (`wss`, path
    /// `/$servicebus/websocket`) and the HTTPS management API (Atom entries under
    /// `https://HOST:PORT/<entity>?api-version=2021-05`, what the SDKs'
    /// `ServiceBusAdministrationClient` calls) on ADDR, one port for all three (the service
    /// uses 5671 and 443).
    /// The certificate is generated for `localhost` and 127.0.0.1 by a CA written to
    /// `--tls-dir`, or given with `--tls-cert`/`--tls-key`. Its `amqps` and `wss` connection
    /// strings follow the other ones on stdout.
    #[arg(long, value_name = "ADDR")]
    tls_listen: Option<String>,
    /// Also serve the management API in plain HTTP on ADDR (for tests and TLS-terminating
    /// fronts; the SDKs themselves only speak HTTPS to it).
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
    /// Folder for the generated CA (`ca.pem`, what clients trust), server certificate and key
    /// (default: `sb-emulator-tls` in the system's temporary folder); printed on start.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["tls_cert", "tls_key"])]
    tls_dir: Option<PathBuf>,
    /// PEM certificate chain for the TLS listener (server certificate first), instead of a
    /// generated one.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Seed of the fault draws (default: from the clock, logged at start), to replay a run.
    #[arg(long, value_name = "N")]
    fault_seed: Option<u64>,
    /// Put the broker MS milliseconds away: every connection's bytes are read and written MS
    /// later, in order, in each direction (a round trip costs 2 × MS), on every listener. In-region
    /// Azure is 1–3 ms round trip plus the namespace's service time; cross-region 40–80 ms.
    /// 0 (the default) adds nothing.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    latency: u64,
    // Link-level service behaviours (issue 29).
    /// Answer each entity attach MS milliseconds late, as the service can while an entity
    /// moves between nodes or a session accept waits: a client that gave up meanwhile gets
    /// the answer anyway and must detach the link (else it holds a session lock nobody
    /// renews).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    attach_delay: u64,
    /// Keep the message locks of a connection that ended until they expire. The service drops
    /// them with the connection (Microsoft Learn, "Message transfers, locks, and
    /// settlement": "the lock is dropped since Service Bus doesn't support recovery of existing
    /// AMQP links on a different connection"), and so does the emulator unless this is set.
    #[arg(long)]
    keep_locks_on_connection_loss: bool,
    /// Run the broker's clock SECS seconds ahead of the host's (behind it when negative): every
    /// broker timestamp (locked-until, session locked-until, enqueued time, scheduled time) is
    /// shifted, as a broker's clock is from a drifting client host's.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    clock_offset: i64,
    /// Step the broker's clock while it runs: `SECS@AFTER` steps it by SECS seconds (back when
    /// negative) AFTER seconds from the start, as an NTP correction or a resumed VM steps a
    /// host's clock; every broker timestamp from then on moves with it. Repeatable.
    #[arg(long, value_name = "SECS@AFTER", value_parser = parse_clock_step, allow_hyphen_values = true)]
    clock_step: Vec<(i64, u64)>,
}

/// `SECS@AFTER` of `--clock-step`.
fn parse_clock_step(text: &str) -> Result<(i64, u64), String> {
    let (secs, after) = text
        .split_once('@')
        .ok_or_else(|| format!("expected SECS@AFTER, got {text:?}"))?;
    let secs = secs
        .trim()
        .parse()
        .map_err(|e| format!("SECS in {text:?}: {e}"))?;
    let after = after
        .trim()
        .parse()
        .map_err(|e| format!("AFTER in {text:?}: {e}"))?;
    Ok((secs, after))
}

const BUILT_IN: &str = include_str!("../config/Config.json");

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    let args = Args::parse();
    let (broker, policies) = match broker(&args) {
        Ok(built) => built,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let emulator = match Emulator::start(broker, options(&args, policies)).await {
        Ok(emulator) => emulator,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Armed before the connection string is printed: no client can be earlier.
    arm_faults(&emulator, &args);
    print_endpoints(&emulator);
    wait_for_signal().await;
    tracing::info!("Shutting down.");
    emulator.shutdown().await;
    ExitCode::SUCCESS
}

/// Logs to stderr (stdout carries the connection strings), filtered by `RUST_LOG`.
fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// The broker of `--config` (or the built-in config) on the clock `--clock-offset` and
/// `--clock-step` describe, with the namespace's shared access policies; or why not.
fn broker(args: &Args) -> Result<(Broker, Vec<SharedAccessPolicy>), String> {
    let text = match &args.config {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?,
        None => BUILT_IN.to_owned(),
    };
    let config = Config::from_json(&text).map_err(|e| Error::from(e).to_string())?;
    let policies = config.namespace.shared_access_policies.clone();
    let clock = stepped_clock(args.clock_offset, &args.clock_step);
    let broker = Broker::with_clock(config, clock).map_err(|e| e.to_string())?;
    Ok((broker, policies))
}

/// The broker's clock: `offset` seconds from the host's, stepped by each `(secs, after)`.
fn stepped_clock(offset: i64, steps: &[(i64, u64)]) -> Clock {
    let clock = Clock::shifted(offset).steppable();
    for &(secs, after) in steps {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(after)).await;
            clock.step(secs);
            tracing::info!(secs, "Stepped the broker's clock (--clock-step).");
        });
    }
    clock
}

/// How the emulator serves, from the flags and the config's `policies`.
fn options(args: &Args, policies: Vec<SharedAccessPolicy>) -> EmulatorOptions {
    EmulatorOptions {
        listen: args.listen.clone(),
        accept_jwt: args.accept_jwt,
        max_token_lifetime: args.max_token_lifetime.map(Duration::from_secs),
        faults: args.faults.clone(),
        fault_seed: args.fault_seed,
        websocket_listen: args.websocket_listen.clone(),
        http_listen: args.http_listen.clone(),
        tls_listen: args.tls_listen.clone().map(|addr| TlsListen {
            addr,
            identity: tls_identity(args),
        }),
        policies,
        latency: Duration::from_millis(args.latency),
        throttle: args.throttle.map(Duration::from_secs),
        attach_delay: Duration::from_millis(args.attach_delay),
        keep_locks_on_connection_loss: args.keep_locks_on_connection_loss,
        ..Default::default()
    }
    .with_link_idle_timeout(Duration::from_secs(args.link_idle_timeout))
}

/// The TLS listener's certificate: the given files, or one generated into `--tls-dir`.
fn tls_identity(args: &Args) -> TlsIdentity {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => TlsIdentity::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => TlsIdentity::Generate(
            args.tls_dir
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("sb-emulator-tls")),
        ),
    }
}

/// The faults the flags inject from the start.
fn arm_faults(emulator: &Emulator, args: &Args) {
    for &spec in &args.management_faults {
        emulator.inject_management_fault(spec);
    }
    if args.settlement_timeouts > 0 {
        emulator.leave_settlements_unanswered(args.settlement_timeouts);
    }
    if let Some(ms) = args.detach_receive_links_after {
        emulator.force_detach_new_receive_links(Some(Duration::from_millis(ms)));
    }
}

/// The connection strings on stdout, one a line (plain, then WebSocket, `amqps`, `wss`); the
/// HTTP management address and the TLS CA on stderr.
fn print_endpoints(emulator: &Emulator) {
    println!("{}", emulator.connection_string());
    let more = [
        emulator.websocket_connection_string(),
        emulator.tls_connection_string(),
        emulator.tls_websocket_connection_string(),
    ];
    for line in more.into_iter().flatten() {
        println!("{line}");
    }
    if let Some(http) = emulator.http_addr() {
        eprintln!("HTTP management API: http://{http}/");
    }
    if let Some(ca) = emulator.tls_ca_file() {
        eprintln!(
            "TLS CA (trust it to verify the TLS listener): {}",
            ca.display()
        );
    }
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
