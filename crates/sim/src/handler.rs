//! The simulated business handler: one effect row per committed attempt (no unique constraint,
//! so a second effect of one message shows), one outbox row to the message's own destination,
//! and the planned panics, transient errors and slowness.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use sb_inbox::{Context, Contract, DecodeError, Handled, Handler, HandlerError, OutboxMessage};

use crate::Trace;
use crate::plan::{Plan, draw};
use crate::process::Life;
use crate::store::FaultyTx;

/// The contract of the messages the producer sends.
pub const CONTRACT: &str = "sim.order";
/// The contract of the outgoing messages.
pub const OUT_SUBJECT: &str = "sim.shipped.v1";

/// The destination of message `id`'s outgoing message.
pub fn destination(seed: u64, id: &str) -> &'static str {
    if draw(seed, id, 0, 5) < 0.5 {
        "out-a"
    } else {
        "out-b"
    }
}

/// The outgoing message id of message `id`.
pub fn out_id(id: &str) -> String {
    format!("{id}:out")
}

/// What the handler saw, for the model: attempts, injected faults, concurrency.
#[derive(Debug, Default)]
pub struct Seen {
    /// Per logical id: (attempts, panics, transient errors).
    pub attempts: BTreeMap<String, (u32, u32, u32)>,
    /// The most handlers of one process at once.
    pub max_running: usize,
    /// Deliveries whose logical id was not their message's key (a typed id that lost its type
    /// or its identity on the way, e.g. in a retry copy).
    pub wrong_identity: Vec<String>,
    /// The planned slowness, summed over every attempt. The SQLite store has one writer: a
    /// transaction holds the connection from `begin` to commit, and the handler sleeps inside
    /// it, so these pauses run one after another whatever `concurrency` is (the other handlers
    /// wait in `begin`); the drain bound adds them (`run::DRAIN_BOUND`).
    pub slept: std::time::Duration,
}

/// The handler.
#[derive(Debug, Clone)]
pub struct SimHandler {
    contracts: Vec<Contract>,
    plan: Arc<Plan>,
    trace: Trace,
    /// What it saw.
    pub seen: Arc<Mutex<Seen>>,
    /// Its process's handlers running now (a dead process's never finish, and do not count).
    running: Arc<Mutex<usize>>,
    /// Its process's life: a dead process's handlers stop where they are.
    life: Life,
}

impl SimHandler {
    /// A handler following `plan`.
    pub fn new(plan: Arc<Plan>, trace: Trace) -> Self {
        SimHandler {
            contracts: vec![Contract::new(CONTRACT, 1)],
            plan,
            trace,
            seen: Arc::default(),
            running: Arc::default(),
            life: Life::new(),
        }
    }

    /// The same handler (and model) in a new process living `life`.
    pub fn for_process(&self, life: Life) -> Self {
        SimHandler {
            running: Arc::default(),
            life,
            ..self.clone()
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Leaves the running count however the attempt ends (panic and cancellation included).
struct Running(Arc<Mutex<usize>>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *running = running.saturating_sub(1);
    }
}

/// `sim.order.v1`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Order {
    /// The logical id it carries.
    pub id: String,
}

impl sb_inbox::JsonContract for Order {
    const NAME: &'static str = CONTRACT;
    const VERSION: u32 = 1;
}

/// `sim.order.v0`, upcast to [`Order`].
#[derive(Debug, Clone, serde::Deserialize)]
pub struct OrderV0 {
    /// The logical id it carries.
    pub id: String,
    /// The plan's upcaster panic.
    #[serde(default)]
    pub explode: bool,
}

impl sb_inbox::JsonContract for OrderV0 {
    const NAME: &'static str = CONTRACT;
    const VERSION: u32 = 0;
}

/// The consumer: a router with [`SimHandler`] for `v1` and an upcaster from `v0` that panics
/// where the plan says.
///
/// # Errors
/// The router's refusal (not expected).
// The panic is the plan's: the upcaster's, inside the closure.
#[allow(clippy::panic_in_result_fn)]
pub fn router(
    handler: SimHandler,
    trace: Trace,
) -> Result<sb_inbox::Router<FaultyTx>, sb_inbox::RouterError> {
    sb_inbox::Router::builder()
        .route(handler)
        .upcast::<OrderV0, Order, _>(move |old| {
            if old.explode {
                trace.push(format!("{} upcast panic", old.id));
                panic!("simulated handler panic in the upcaster of {}", old.id);
            }
            Ok(Order { id: old.id })
        })
        .build()
}

impl Handler<FaultyTx> for SimHandler {
    type Payload = Order;

    fn contracts(&self) -> &[Contract] {
        &self.contracts
    }

    fn decode(&self, _: &Contract, body: &[u8]) -> Result<Order, DecodeError> {
        serde_json::from_slice(body).map_err(|e| DecodeError::json(&e))
    }

    async fn handle(
        &self,
        ctx: &Context<'_, Order>,
        tx: &mut FaultyTx,
    ) -> Result<Handled, HandlerError> {
        // A dead process runs no more of its handlers: nothing after its crash is seen.
        self.life.alive().await;
        // The model's name of the message is the one its body carries; the runtime's key for
        // it must be the plan's (typed ids included), in every copy.
        let id = ctx.payload.id.clone();
        let attempt = ctx.delivery_count;
        let key = draw_key(ctx);
        let index = self.plan.index_of(&id);
        self.check_identity(ctx, &id, index);
        let panicky = index.is_some_and(|i| self.plan.panicky.contains(&i));
        let _running = self.enter(&id);
        self.inject_faults(&id, attempt, key, panicky).await?;
        self.write_effects(tx, &id, attempt, index).await?;
        self.trace.push(format!("{id} #{attempt} handled"));
        Ok(Handled::Processed)
    }
}

/// The key the plan's draws for this delivery use: its delivery count and its retry copy.
fn draw_key(ctx: &Context<'_, Order>) -> u32 {
    // A retry copy is delivered afresh (delivery count 1 again): keyed on the delivery count
    // alone, every copy repeated the original's first draws, so a message transient at
    // `#0` was transient on every copy and no copy ever succeeded (seed 4403's chain).
    let copy = match ctx
        .message
        .application_properties
        .get(sb_inbox::runtime::RETRY_ATTEMPT_PROPERTY)
    {
        Some(sb_inbox::PropertyValue::Long(n)) => u32::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    ctx.delivery_count
        .saturating_add(copy.saturating_mul(1 << 16))
}

impl SimHandler {
    /// Records a delivery whose logical id is not the plan's key for the message.
    fn check_identity(&self, ctx: &Context<'_, Order>, id: &str, index: Option<usize>) {
        // The model's name of the message is the one its body carries; the runtime's key for
        // it must be the plan's (typed ids included), in every copy.
        let expected = index.map(|i| self.plan.key(i));
        if expected.as_deref() != Some(ctx.logical_id()) {
            let what = format!(
                "{id}: delivered with logical id {:?} (broker message id {:?}), expected {expected:?}",
                ctx.logical_id(),
                ctx.message.message_id
            );
            self.trace.push(&what);
            self.seen().wrong_identity.push(what);
        }
    }

    /// Counts an attempt and one more handler running; the guard counts it out when dropped.
    fn enter(&self, id: &str) -> Running {
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *running += 1;
        let mut seen = self.seen();
        seen.max_running = seen.max_running.max(*running);
        seen.attempts.entry(id.to_owned()).or_default().0 += 1;
        Running(self.running.clone())
    }

    /// The plan's faults for this attempt: a panic, a transient error, a pause.
    async fn inject_faults(
        &self,
        id: &str,
        attempt: u32,
        key: u32,
        panicky: bool,
    ) -> Result<(), HandlerError> {
        let seed = self.plan.seed;
        let faults = self.plan.handler;
        if panicky || draw(seed, id, key, 1) < faults.panic {
            let mut seen = self.seen();
            seen.attempts.entry(id.to_owned()).or_default().1 += 1;
            drop(seen);
            self.trace.push(format!("{id} #{attempt} panic"));
            panic!("simulated handler panic on {id}");
        }
        if draw(seed, id, key, 2) < faults.transient {
            let mut seen = self.seen();
            seen.attempts.entry(id.to_owned()).or_default().2 += 1;
            drop(seen);
            self.trace.push(format!("{id} #{attempt} transient"));
            return Err(HandlerError::transient("simulated transient failure"));
        }
        if draw(seed, id, key, 3) < faults.slow {
            let pause = faults.slow_max.mul_f64(draw(seed, id, key, 4));
            self.seen().slept += pause;
            tokio::time::sleep(pause).await;
            self.life.alive().await;
        }
        Ok(())
    }

    /// The attempt's work in the delivery's transaction: its effect row and its outbox message
    /// (and, for a swallowing message, a failed statement it ignores).
    async fn write_effects(
        &self,
        tx: &mut FaultyTx,
        id: &str,
        attempt: u32,
        index: Option<usize>,
    ) -> Result<(), HandlerError> {
        let seed = self.plan.seed;
        tx.execute(
            "INSERT INTO sim_effects (id, attempt) VALUES (?1, ?2)",
            (id, attempt),
        )
        .await
        .map_err(HandlerError::from)?;
        let mut out =
            OutboxMessage::new(destination(seed, id), OUT_SUBJECT, id.as_bytes().to_vec());
        out.message_id = out_id(id);
        sb_inbox::Tx::append_outbox(tx, &out).await?;
        if index.is_some_and(|i| self.plan.swallowing.contains(&i)) {
            // User code that catches a store error and goes on: the transaction remembers the
            // failed statement and the runtime must not commit this delivery's work.
            let swallowed = tx
                .execute("INSERT INTO sim_checks (v) VALUES (?1)", (-1,))
                .await;
            self.trace
                .push(format!("{id} #{attempt} swallowed {:?}", swallowed.err()));
        }
        // A commit fault injected into this transaction is pinned on the messages it holds.
        tx.holds(id);
        Ok(())
    }
}
