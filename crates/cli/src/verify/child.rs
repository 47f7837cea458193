//! The crash scenario's other process: `sb-inbox verify-child` (hidden) processes one delivery
//! with the library's runtime and stops dead right after its transaction committed, before the
//! settlement, until its parent SIGKILLs it. No broker or store fault is needed, so it works
//! against a real namespace.
//!
//! The point between commit and settlement is the runtime's own: the store transaction span
//! records `sb_inbox.transaction.result = commit` once `commit` returned (see
//! `sb_inbox::telemetry::names`), and the settlement follows. A tracing layer on that record
//! prints [`COMMITTED`] and parks the thread. The child runs on one current-thread runtime with
//! that layer as the thread's default subscriber, so parking it freezes every task of the
//! process: the settlement is never sent.

use std::io::Write as _;
use std::time::Duration;

use sb_inbox::servicebus::ServiceBusClient;
use sb_inbox::store::StoreUrl;
use sb_inbox::telemetry::names::{attr, value};
use sb_inbox::{ConsumerName, OutboxStore, Receiver, Runtime, RuntimeConfig};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt as _};

use crate::inventory::{InventoryStore, OrderPlacedConsumer};

/// The lock margin of every runtime verify runs: a renewal this long before the lock runs out
/// (below the 5 s lock of the lock-loss queue).
pub const LOCK_MARGIN: Duration = Duration::from_secs(2);

/// The line the child prints on stdout once its transaction committed.
pub const COMMITTED: &str = "committed";
/// The line a stalling child prints once its handler wrote its rows (the transaction open);
/// it then reads a line from stdin before it goes on.
pub const STALLED: &str = "stalled";
/// The start of the line a child prints when its delivery's processing ended: `outcome X`.
pub const OUTCOME: &str = "outcome ";

/// The reference consumer, which then stalls the whole process (a long GC pause, a frozen VM):
/// it prints [`STALLED`] and blocks its thread, the runtime's only one, until a line arrives on
/// stdin. The lock keeper stalls with it, so the broker's lock runs out meanwhile.
#[derive(Debug)]
struct Stall(OrderPlacedConsumer);

impl<T: crate::inventory::InventoryTx> sb_inbox::Handler<T> for Stall {
    type Payload = <OrderPlacedConsumer as sb_inbox::Handler<T>>::Payload;

    fn contracts(&self) -> &[sb_inbox::Contract] {
        <OrderPlacedConsumer as sb_inbox::Handler<T>>::contracts(&self.0)
    }

    fn decode(
        &self,
        contract: &sb_inbox::Contract,
        body: &[u8],
    ) -> Result<Self::Payload, sb_inbox::DecodeError> {
        <OrderPlacedConsumer as sb_inbox::Handler<T>>::decode(&self.0, contract, body)
    }

    async fn handle(
        &self,
        ctx: &sb_inbox::Context<'_, Self::Payload>,
        tx: &mut T,
    ) -> Result<sb_inbox::Handled, sb_inbox::HandlerError> {
        let handled = self.0.handle(ctx, tx).await?;
        let mut out = std::io::stdout();
        // If the parent cannot read it, it times out and reports that.
        let _ = writeln!(out, "{STALLED}");
        let _ = out.flush();
        // Blocking on purpose: the stall is the whole process's.
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        Ok(handled)
    }
}

/// How long the child waits for its delivery.
const RECEIVE_WAIT: Duration = Duration::from_secs(60);

/// Freezes the thread once a transaction span records a commit.
struct FreezeAfterCommit;

struct CommitSeen(bool);

impl Visit for CommitSeen {
    fn record_str(&mut self, field: &Field, text: &str) {
        if field.name() == attr::TRANSACTION_RESULT && text == value::COMMIT {
            self.0 = true;
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for FreezeAfterCommit {
    fn on_record(
        &self,
        _span: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: Context<'_, S>,
    ) {
        let mut seen = CommitSeen(false);
        values.record(&mut seen);
        if seen.0 {
            let mut out = std::io::stdout();
            // If the parent cannot read it, it times out and reports that.
            let _ = writeln!(out, "{COMMITTED}");
            let _ = out.flush();
            // The crash: nothing of this process runs again; the parent kills it.
            loop {
                std::thread::park();
            }
        }
    }
}

/// Runs the child to its freeze (or to an error, printed; the exit code is then 1). Blocks
/// the calling thread: call it off the async runtime.
pub fn run(
    client: ServiceBusClient,
    store: StoreUrl,
    queue: String,
    consumer: String,
    stall: bool,
    lock_duration: Option<Duration>,
    #[cfg_attr(not(feature = "mssql"), allow(unused_variables))] store_user: Option<String>,
) -> u8 {
    let subscriber = tracing_subscriber::registry().with(FreezeAfterCommit);
    let _default = tracing::subscriber::set_default(subscriber);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            println!("error: {error}");
            return 1;
        }
    };
    let result = runtime.block_on(async {
        match store {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => {
                let store = sb_inbox::PgStore::connect(&url, 1)
                    .await
                    .map_err(|e| e.to_string())?;
                process_one(client, store, &queue, &consumer, stall, lock_duration).await
            }
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(path) => {
                let store = sb_inbox::SqliteStore::open(&path).map_err(|e| e.to_string())?;
                process_one(client, store, &queue, &consumer, stall, lock_duration).await
            }
            #[cfg(feature = "mssql")]
            StoreUrl::Mssql(text) => {
                let mut config =
                    sb_inbox::store::MssqlConfig::parse(&text).map_err(|e| e.to_string())?;
                if let Some(user) = &store_user {
                    config.set_execute_as(user);
                }
                let store = sb_inbox::MssqlStore::connect_with(config, 1)
                    .await
                    .map_err(|e| e.to_string())?;
                process_one(client, store, &queue, &consumer, stall, lock_duration).await
            }
            #[allow(unreachable_patterns, reason = "every store is compiled in by default")]
            other => Err(format!("the child cannot open {other}")),
        }
    });
    match result {
        Ok(outcome) => {
            println!("{OUTCOME}{outcome}");
            0
        }
        Err(error) => {
            println!("error: {error}");
            1
        }
    }
}

async fn process_one<S>(
    client: ServiceBusClient,
    store: S,
    queue: &str,
    consumer: &str,
    stall: bool,
    lock_duration: Option<Duration>,
) -> Result<String, String>
where
    S: InventoryStore + OutboxStore + Clone,
{
    let receiver = client.receiver(queue, 0);
    let consumer = ConsumerName::new(consumer).map_err(|e| e.to_string())?;
    let mut config = RuntimeConfig::new(consumer);
    config.lock_margin = LOCK_MARGIN;
    // As the parent read it from the management API (`--lock-duration-ms`): without it a
    // message that waited in the queue on a broker whose clock is ahead of this host's looks
    // locked for longer than it is, and the stalled commit would not be fenced.
    config.lock_duration = lock_duration;
    let delivery = match tokio::time::timeout(RECEIVE_WAIT, receiver.receive()).await {
        Ok(Ok(Some(delivery))) => delivery,
        Ok(Ok(None)) => return Err("the receiver closed".to_owned()),
        Ok(Err(error)) => return Err(format!("receiving: {error}")),
        Err(_) => return Err(format!("nothing delivered within {RECEIVE_WAIT:?}")),
    };
    let outcome = if stall {
        let runtime = Runtime::new(
            receiver.clone(),
            store,
            Stall(OrderPlacedConsumer::new()),
            config,
        );
        runtime.process(delivery).await.outcome
    } else {
        let runtime = Runtime::new(receiver.clone(), store, OrderPlacedConsumer::new(), config);
        runtime.process(delivery).await.outcome
    };
    Ok(format!("{outcome:?}"))
}
