//! The world of one run: the broker (the real emulator), the database, the simulated network
//! and the clocks, which outlive every process of the consumer.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions};
use sb_inbox::SqliteStore;
use sb_inbox::servicebus::{ConnectionString, RetryOptions, ServiceBusClient};
use sb_servicebus::{Connector, WallClock};
use tokio::time::Instant;

use crate::Trace;
use crate::net::Net;
use crate::plan::{self, Plan};
use crate::process::Life;
use crate::store::FaultyStore;

/// The namespace: the consumed queue (requiring sessions in session mode; with retention a
/// short TTL, expired messages dead-lettered, and a low max delivery count) and the two outbox
/// destinations.
pub(crate) fn config_json(plan: &Plan) -> String {
    let lock = sb_emulator::format_iso8601_duration(plan::LOCK_DURATION);
    let q = |name: &str, sessions: bool, (ttl, max_delivery): (Option<Duration>, u32)| {
        let ttl = ttl.map_or(String::new(), |ttl| {
            format!(
                r#","DefaultMessageTimeToLive":"{}","DeadLetteringOnMessageExpiration":true"#,
                sb_emulator::format_iso8601_duration(ttl)
            )
        });
        format!(
            r#"{{"Name":"{name}","Properties":{{"LockDuration":"{lock}","MaxDeliveryCount":{max_delivery}{ttl}{}}}}}"#,
            if sessions {
                r#","RequiresSession":true"#
            } else {
                ""
            }
        )
    };
    let plain = (None, plan::MAX_DELIVERY_COUNT);
    format!(
        r#"{{"UserConfig":{{"Namespaces":[{{"Name":"sim","Queues":[{},{},{}],"Topics":[]}}],"Logging":{{"Type":"File"}}}}}}"#,
        q("orders", plan.sessions.is_some(), plan.orders_limits()),
        q("out-a", false, plain),
        q("out-b", false, plain)
    )
}

/// Everything one run shares.
pub(crate) struct World {
    pub(crate) plan: Arc<Plan>,
    pub(crate) trace: Trace,
    pub(crate) net: Net,
    pub(crate) emulator: Arc<Emulator>,
    pub(crate) store: FaultyStore,
    pub(crate) clock_step_ms: Arc<AtomicI64>,
    pub(crate) start: Instant,
    /// The wall-clock time at `start`, in whole seconds: every clock of the run starts here.
    pub(crate) anchor: SystemTime,
}

pub(crate) async fn world(plan: Arc<Plan>) -> Result<World, Box<dyn std::error::Error>> {
    // Whole seconds: every instant of the run is then a whole number of milliseconds from it.
    let anchor =
        UNIX_EPOCH + Duration::from_secs(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs());
    let start = Instant::now();
    // The database's clock reads the run's time too (inbox rows age there; retention).
    crate::dbclock::install();
    crate::dbclock::anchor(start, anchor);
    let broker = Broker::with_clock(
        Config::from_json(&config_json(&plan))?,
        sb_emulator::Clock::anchored_at(anchor),
    )?;
    let emulator = Emulator::without_listener(
        broker,
        EmulatorOptions {
            fault_seed: Some(plan.seed),
            ..EmulatorOptions::default()
        },
    );
    let store = SqliteStore::open_in_memory()?;
    store.migrate().await?;
    store
        .with_connection(|c| {
            c.execute_batch(
                "CREATE TABLE sim_effects (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, attempt INTEGER NOT NULL);
                 CREATE TABLE sim_checks (v INTEGER NOT NULL CHECK (v >= 0));",
            )
        })
        .await?;
    let trace = Trace::new();
    Ok(World {
        trace: trace.clone(),
        net: Net::new(plan.seed ^ 0x0e7),
        emulator: Arc::new(emulator),
        store: FaultyStore {
            inner: store,
            faults: Arc::default(),
            trace,
            life: Life::new(),
        },
        clock_step_ms: Arc::default(),
        start,
        anchor,
        plan,
    })
}

impl World {
    /// A client of a process living `life` whose connections run over the simulated network to
    /// the emulator, reading the (steppable) simulated host clock. Once the process died it
    /// connects no more (its attempts wait forever).
    pub(crate) fn client(
        &self,
        salt: u64,
        life: Life,
    ) -> Result<ServiceBusClient, Box<dyn std::error::Error>> {
        let cs: ConnectionString = format!(
            "Endpoint=sb://sim.servicebus.local;SharedAccessKeyName={};SharedAccessKey={};UseDevelopmentEmulator=true",
            sb_emulator::KEY_NAME,
            sb_emulator::KEY
        )
        .parse()?;
        let (net, emulator, trace) = (self.net.clone(), self.emulator.clone(), self.trace.clone());
        let connector = Connector::new(move |host: &str| {
            let client_end = (!life.is_dead()).then(|| {
                let (client_end, server_end) = net.connect(salt);
                trace.push(format!("client {salt} connects"));
                emulator.serve_stream(server_end, host);
                client_end
            });
            async move {
                match client_end {
                    Some(end) => Ok(end),
                    None => std::future::pending().await,
                }
            }
        });
        let (start, step, anchor) = (self.start, self.clock_step_ms.clone(), self.anchor);
        let wall = WallClock::new(move || {
            let t = anchor + start.elapsed();
            let step = step.load(Ordering::Acquire);
            let by = Duration::from_millis(step.unsigned_abs());
            if step >= 0 {
                t + by
            } else {
                t.checked_sub(by).unwrap_or(t)
            }
        });
        Ok(ServiceBusClient::from_connection_string(&cs)
            .with_connector(connector)
            .with_clock(wall)
            .with_retry(RetryOptions::default().with_jitter_seed(self.plan.seed ^ salt)))
    }
}

/// Whether `SIM_SKIP` names the fault kind `kind` (`net`, `broker`, `store`, `clock`,
/// `process`).
pub(crate) fn skip_kind(kind: &str) -> bool {
    std::env::var("SIM_SKIP").is_ok_and(|skip| skip.split(',').any(|k| k.trim() == kind))
}
