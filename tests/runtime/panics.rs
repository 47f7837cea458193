//! Issue 40, C1: a panic in user code outside `Handler::handle` (an upcaster, validation, an
//! envelope reader) is caught and counted against `max_panics` like a handler's, in plain and
//! batched mode; an upcaster that refuses a value dead-letters it at once. Before, the task
//! unwound, the delivery was released uncounted and came straight back: a loop that never
//! reached `max_panics`, and a batch that went down with all its members.

use std::time::Duration;

use sb_inbox::envelope::{EnvelopeReader, Opened, SubjectVersioned};
use sb_inbox::testing::{MemoryBroker, MemoryReceiver};
use sb_inbox::{
    Clock, Context, Handled, Handler, HandlerError, JsonHandler, Outcome, Rejection, Router,
    Runtime, RuntimeConfig, RuntimeError, SqliteStore, SqliteTx, UpcastError,
};
use sb_inbox_cli::inventory::{OrderPlaced, OrderPlacedV2};
use tokio_util::sync::CancellationToken;

use crate::support::orders::two_line_order;
use crate::support::runtime::{batched, config};
use crate::support::sqlite_store;

/// The service's default max delivery count.
const MAX_DELIVERIES: u32 = 10;

/// The order whose v1 body the upcasters below cannot map.
const POISON: &str = "o-3";

/// Takes v2 orders; the inbox row the runtime inserts is all it leaves.
#[derive(Debug)]
struct PlaceV2;

impl JsonHandler<SqliteTx> for PlaceV2 {
    type Message = OrderPlacedV2;

    async fn handle(
        &self,
        _: &Context<'_, OrderPlacedV2>,
        _: &OrderPlacedV2,
        _: &mut SqliteTx,
    ) -> Result<Handled, HandlerError> {
        Ok(Handled::Processed)
    }
}

/// A router whose v1→v2 upcaster panics on [`POISON`], as one written with `unwrap` or an index
/// does.
fn panicking_router() -> Router<SqliteTx> {
    Router::builder()
        .json(PlaceV2)
        .upcast(|v1: OrderPlaced| {
            if v1.order_id == POISON {
                let channels: Vec<String> = Vec::new();
                // The legacy channel table has no row for this order.
                let channel = channels[std::hint::black_box(0)].clone();
                return Ok(OrderPlacedV2 { order: v1, channel });
            }
            Ok(OrderPlacedV2::from(v1))
        })
        .build()
        .unwrap()
}

/// A router whose upcaster refuses [`POISON`].
fn refusing_router() -> Router<SqliteTx> {
    Router::builder()
        .json(PlaceV2)
        .upcast(|v1: OrderPlaced| {
            if v1.order_id == POISON {
                return Err(UpcastError::new("the order's channel cannot be derived"));
            }
            Ok(OrderPlacedV2::from(v1))
        })
        .build()
        .unwrap()
}

fn broker_with(messages: usize) -> MemoryBroker {
    let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(30), MAX_DELIVERIES);
    for i in 0..messages {
        broker.send(two_line_order(&format!("m-{i}"), &format!("o-{i}")));
    }
    broker
}

/// Runs the receive loop until `broker` holds nothing ready, locked or scheduled, at most 600 s
/// of the paused clock.
async fn drain<H: Handler<SqliteTx>>(
    runtime: &Runtime<MemoryReceiver, SqliteStore, H>,
    broker: &MemoryBroker,
) -> Result<(), RuntimeError> {
    let shutdown = CancellationToken::new();
    let run = async {
        let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
            broker.wait_idle().await;
            shutdown.cancel();
        });
        result
    };
    tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("the queue drains: the panicking message does not loop")
}

async fn runtime_with<H: Handler<SqliteTx>>(
    broker: &MemoryBroker,
    handler: H,
    mut config: RuntimeConfig,
) -> Runtime<MemoryReceiver, SqliteStore, H> {
    let store = sqlite_store("panics", 1).await;
    config.transient_hold_max = Duration::ZERO;
    Runtime::with_clock(broker.receiver(), store, handler, config, Clock::new())
}

/// 200 v1 orders through a router whose upcaster panics on one, plain and in batches of 16:
/// the one is abandoned twice and dead-lettered `HandlerPanicked` on its third delivery
/// (`max_panics` 3), the 199 others are processed, nothing loops.
#[tokio::test(start_paused = true)]
async fn a_panicking_upcaster_is_counted_and_dead_lettered_after_max_panics() {
    for config in [config("panics"), batched("panics", 16)] {
        let batch = config.batch_size;
        let broker = broker_with(200);
        let runtime = runtime_with(&broker, panicking_router(), config).await;
        drain(&runtime, &broker).await.unwrap();
        let dead = broker.dead_letters();
        assert_eq!(dead.len(), 1, "batch {batch}: {dead:#?}");
        assert_eq!(dead[0].message.message_id.as_deref(), Some("m-3"));
        assert_eq!(dead[0].reason, "HandlerPanicked");
        assert!(
            dead[0].description.contains("decoding panicked")
                && dead[0].description.contains("index out of bounds"),
            "{}",
            dead[0].description
        );
        let stats = runtime.stats().snapshot();
        assert_eq!(
            (stats.processed, stats.panicked),
            (199, 2),
            "batch {batch}: {stats:?}"
        );
        assert_eq!(
            broker.counts().released,
            0,
            "batch {batch}: never uncounted"
        );
        assert_eq!(runtime.slots().stuck(), 0);
    }
}

/// A batch with a member whose upcaster panics: that member alone is out, the others commit.
#[tokio::test(start_paused = true)]
async fn a_batch_member_whose_upcaster_panics_is_taken_out_alone() {
    let broker = broker_with(16);
    let runtime = runtime_with(&broker, panicking_router(), batched("panics", 16)).await;
    let deliveries = std::iter::from_fn(|| broker.try_receive()).collect();
    let reports = runtime.process_batch(deliveries).await;
    for (i, report) in reports.iter().enumerate() {
        let expected = if i == 3 {
            Outcome::HandlerPanicked
        } else {
            Outcome::Processed
        };
        assert_eq!(report.outcome, expected, "member {i}");
    }
}

/// An upcaster that refuses a value: dead-lettered `InvalidPayload` on its first delivery, the
/// description naming both contracts and the reason; the others are processed.
#[tokio::test(start_paused = true)]
async fn a_refused_upcast_is_dead_lettered_at_once_naming_the_contract() {
    for config in [config("panics"), batched("panics", 16)] {
        let broker = broker_with(200);
        let runtime = runtime_with(&broker, refusing_router(), config).await;
        drain(&runtime, &broker).await.unwrap();
        let dead = broker.dead_letters();
        assert_eq!(dead.len(), 1, "{dead:#?}");
        assert_eq!(dead[0].reason, "InvalidPayload");
        assert_eq!(dead[0].delivery_count, 0, "on its first delivery");
        assert_eq!(
            dead[0].description,
            "upcast from orders.order-placed.v1 to orders.order-placed.v2 refused: the order's \
             channel cannot be derived"
        );
        let stats = runtime.stats().snapshot();
        assert_eq!((stats.processed, stats.panicked), (199, 0), "{stats:?}");
    }
}

/// An envelope reader that panics on one message: counted and dead-lettered like a handler's
/// panic.
#[derive(Debug)]
struct PanickingReader;

impl EnvelopeReader for PanickingReader {
    fn kind(&self) -> &'static str {
        "subject"
    }

    // The panic is the point: a reader with a bug the runtime must survive.
    #[allow(clippy::panic_in_result_fn)]
    fn open<'m>(&self, message: &'m sb_inbox::Message) -> Result<Opened<'m>, Rejection> {
        if message.message_id.as_deref() == Some("m-5") {
            panic!("reader bug");
        }
        SubjectVersioned.open(message)
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_envelope_reader_is_counted_too() {
    let broker = broker_with(20);
    let mut config = config("panics");
    config.envelope = std::sync::Arc::new(PanickingReader);
    let runtime = runtime_with(
        &broker,
        sb_inbox_cli::inventory::router(None).unwrap(),
        config,
    )
    .await;
    drain(&runtime, &broker).await.unwrap();
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].message.message_id.as_deref(), Some("m-5"));
    assert_eq!(dead[0].reason, "HandlerPanicked");
    assert_eq!(runtime.stats().snapshot().processed, 19);
}
