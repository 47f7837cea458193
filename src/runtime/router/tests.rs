//! The router end to end: routes, upcasts, refusals, and a router under the runtime.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Mutex;

use super::*;
use crate::envelope::DeadLetterReason;
use crate::ports::Message;
use crate::runtime::clock::Clock;
use crate::runtime::consumer::ConsumerName;
use crate::runtime::handler::{Context, DecodeError, Handled, Handler, HandlerError};
use crate::runtime::json::{Json, JsonContract, JsonHandler};
use crate::runtime::outcome::Outcome;
use crate::runtime::unknown::UnknownContracts;
use crate::runtime::{Runtime, RuntimeConfig};
use crate::store::{SqliteStore, SqliteTx};
use crate::testing::MemoryBroker;

/// What the handlers saw, in order.
type Seen = Arc<Mutex<Vec<String>>>;

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PlacedV1 {
    order_id: String,
}
impl JsonContract for PlacedV1 {
    const NAME: &'static str = "orders.order-placed";
    const VERSION: u32 = 1;
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PlacedV2 {
    order_id: String,
    channel: String,
}
impl JsonContract for PlacedV2 {
    const NAME: &'static str = "orders.order-placed";
    const VERSION: u32 = 2;

    fn validate(&self) -> Result<(), DecodeError> {
        if self.channel.is_empty() {
            return Err(DecodeError::new("channel must be set"));
        }
        Ok(())
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cancelled {
    order_id: String,
}
impl JsonContract for Cancelled {
    const NAME: &'static str = "orders.order-cancelled";
    const VERSION: u32 = 1;
}

struct Placed(Seen);
impl<T: Tx> JsonHandler<T> for Placed {
    type Message = PlacedV2;
    async fn handle(
        &self,
        ctx: &Context<'_, PlacedV2>,
        order: &PlacedV2,
        _: &mut T,
    ) -> Result<Handled, HandlerError> {
        let seen = format!(
            "placed {} {} {}",
            ctx.contract, order.order_id, order.channel
        );
        self.0.lock().unwrap().push(seen);
        Ok(Handled::Processed)
    }
}

struct Cancel(Seen);
impl<T: Tx> JsonHandler<T> for Cancel {
    type Message = Cancelled;
    async fn handle(
        &self,
        ctx: &Context<'_, Cancelled>,
        order: &Cancelled,
        _: &mut T,
    ) -> Result<Handled, HandlerError> {
        let seen = format!("cancelled {} {}", ctx.contract, order.order_id);
        self.0.lock().unwrap().push(seen);
        Ok(Handled::Processed)
    }
}

/// `payments.payment-captured` v1..v3 in one handler: the version picks the decoder.
#[derive(Debug)]
enum Captured {
    /// v1: whole units.
    Units(i64),
    /// v2 and v3: cents (v3 adds a currency).
    Cents(i64, Option<String>),
}

struct Payments {
    seen: Seen,
    contracts: Vec<Contract>,
}

impl Payments {
    fn new(seen: Seen) -> Self {
        let contracts = (1..=3)
            .map(|v| Contract::new("payments.payment-captured", v))
            .collect();
        Payments { seen, contracts }
    }
}

impl<T: Tx> Handler<T> for Payments {
    type Payload = Captured;

    fn contracts(&self) -> &[Contract] {
        &self.contracts
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<Captured, DecodeError> {
        #[derive(serde::Deserialize)]
        struct V1 {
            units: i64,
        }
        #[derive(serde::Deserialize)]
        struct V3 {
            cents: i64,
            currency: Option<String>,
        }
        let json = |e: serde_json::Error| DecodeError::json(&e);
        match contract.version() {
            1 => Ok(Captured::Units(
                serde_json::from_slice::<V1>(body).map_err(json)?.units,
            )),
            _ => {
                let v3: V3 = serde_json::from_slice(body).map_err(json)?;
                Ok(Captured::Cents(v3.cents, v3.currency))
            }
        }
    }

    async fn handle(
        &self,
        ctx: &Context<'_, Captured>,
        _: &mut T,
    ) -> Result<Handled, HandlerError> {
        let cents = match &ctx.payload {
            Captured::Units(units) => units * 100,
            Captured::Cents(cents, _) => *cents,
        };
        let currency = match &ctx.payload {
            Captured::Cents(_, Some(currency)) => currency.as_str(),
            _ => "EUR",
        };
        let seen = format!("captured {} {cents} {currency}", ctx.contract);
        self.seen.lock().unwrap().push(seen);
        Ok(Handled::Processed)
    }
}

fn router(seen: &Seen) -> Router<SqliteTx> {
    Router::builder()
        .json(Placed(seen.clone()))
        .upcast(|v1: PlacedV1| {
            Ok(PlacedV2 {
                order_id: v1.order_id,
                channel: "legacy".to_owned(),
            })
        })
        .json(Cancel(seen.clone()))
        .route(Payments::new(seen.clone()))
        .build()
        .unwrap()
}

struct Setup {
    broker: MemoryBroker,
    runtime: Runtime<crate::testing::MemoryReceiver, SqliteStore, Router<SqliteTx>>,
    seen: Seen,
}

async fn setup(unknown: UnknownContracts) -> Setup {
    let store = SqliteStore::open_in_memory().unwrap();
    store.migrate().await.unwrap();
    let broker = MemoryBroker::new(Clock::new());
    let seen = Seen::default();
    let config =
        RuntimeConfig::new(ConsumerName::new("orders").unwrap()).with_unknown_contracts(unknown);
    let runtime = Runtime::new(broker.receiver(), store, router(&seen), config);
    Setup {
        broker,
        runtime,
        seen,
    }
}

impl Setup {
    async fn outcome(&self, id: &str, subject: &str, body: &str) -> Outcome {
        self.broker.send(Message::new(id, subject, body.to_owned()));
        let delivery = self.broker.try_receive().unwrap();
        self.runtime.process(delivery).await.outcome
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn each_contract_and_version_reaches_its_handler_and_v1_is_upcast() {
    let s = setup(UnknownContracts::DeadLetter).await;
    let cases = [
        (
            "m-1",
            "orders.order-placed.v2",
            r#"{"orderId":"o-1","channel":"app"}"#,
        ),
        ("m-2", "orders.order-placed.v1", r#"{"orderId":"o-2"}"#),
        ("m-3", "orders.order-cancelled.v1", r#"{"orderId":"o-1"}"#),
        ("m-4", "payments.payment-captured.v1", r#"{"units":5}"#),
        ("m-5", "payments.payment-captured.v2", r#"{"cents":250}"#),
        (
            "m-6",
            "payments.payment-captured.v3",
            r#"{"cents":99,"currency":"CHF"}"#,
        ),
    ];
    for (id, subject, body) in cases {
        assert_eq!(
            s.outcome(id, subject, body).await,
            Outcome::Processed,
            "{subject}"
        );
    }
    assert_eq!(
        s.seen(),
        [
            "placed orders.order-placed.v2 o-1 app",
            // Upcast: decoded as v1, handed to the v2 handler as v2.
            "placed orders.order-placed.v2 o-2 legacy",
            "cancelled orders.order-cancelled.v1 o-1",
            "captured payments.payment-captured.v1 500 EUR",
            "captured payments.payment-captured.v2 250 EUR",
            "captured payments.payment-captured.v3 99 CHF",
        ]
    );
    // A redelivered id is a duplicate: the handler does not run again.
    assert_eq!(
        s.outcome("m-2", "orders.order-placed.v1", r#"{"orderId":"o-2"}"#)
            .await,
        Outcome::Duplicate(crate::ports::DuplicateScope::Inbox)
    );
    assert_eq!(s.seen().len(), 6);
    let mut contracts = s.runtime.handler().contracts().to_vec();
    contracts.sort_by_key(ToString::to_string);
    let listed: Vec<String> = contracts.iter().map(ToString::to_string).collect();
    assert_eq!(
        listed,
        [
            "orders.order-cancelled.v1",
            "orders.order-placed.v1",
            "orders.order-placed.v2",
            "payments.payment-captured.v1",
            "payments.payment-captured.v2",
            "payments.payment-captured.v3",
        ]
    );
}

#[tokio::test]
async fn bad_bodies_of_a_route_or_an_upcast_are_invalid_payload() {
    let s = setup(UnknownContracts::DeadLetter).await;
    let invalid = Outcome::Permanent(DeadLetterReason::InvalidPayload);
    // Not a v1 body: the upcaster's decode fails, not the v2 handler's.
    assert_eq!(
        s.outcome("m-1", "orders.order-placed.v1", r#"{"id":1}"#)
            .await,
        invalid
    );
    // A v2 body that breaks v2's rule.
    let body = r#"{"orderId":"o-1","channel":""}"#;
    assert_eq!(
        s.outcome("m-2", "orders.order-placed.v2", body).await,
        invalid
    );
    assert_eq!(
        s.outcome("m-3", "payments.payment-captured.v1", "{").await,
        invalid
    );
    assert!(s.seen().is_empty());
    let reasons: Vec<String> = s
        .broker
        .dead_letters()
        .into_iter()
        .map(|d| d.reason)
        .collect();
    assert_eq!(reasons, ["InvalidPayload"; 3]);
}

#[tokio::test]
async fn an_unknown_contract_dead_letters_by_default_and_completes_when_configured() {
    let unknown = ("m-1", "billing.invoice-sent.v1", r#"{"invoiceId":"i-1"}"#);
    let newer = ("m-2", "orders.order-placed.v3", r#"{"orderId":"o-1"}"#);

    let s = setup(UnknownContracts::DeadLetter).await;
    assert_eq!(
        s.outcome(unknown.0, unknown.1, unknown.2).await,
        Outcome::Permanent(DeadLetterReason::UnsupportedContract)
    );
    assert_eq!(
        s.outcome(newer.0, newer.1, newer.2).await,
        Outcome::Permanent(DeadLetterReason::UnsupportedContractVersion)
    );
    let reasons: Vec<String> = s
        .broker
        .dead_letters()
        .into_iter()
        .map(|d| d.reason)
        .collect();
    assert_eq!(
        reasons,
        ["UnsupportedContract", "UnsupportedContractVersion"]
    );
    assert_eq!(s.runtime.stats().snapshot().ignored, 0);

    let s = setup(UnknownContracts::Complete).await;
    assert_eq!(
        s.outcome(unknown.0, unknown.1, unknown.2).await,
        Outcome::Ignored
    );
    // A version of a known name is ours: dead-lettered either way.
    assert_eq!(
        s.outcome(newer.0, newer.1, newer.2).await,
        Outcome::Permanent(DeadLetterReason::UnsupportedContractVersion)
    );
    let counts = s.broker.counts();
    assert_eq!((counts.completed, counts.dead_lettered), (1, 1));
    let reasons: Vec<String> = s
        .broker
        .dead_letters()
        .into_iter()
        .map(|d| d.reason)
        .collect();
    assert_eq!(reasons, ["UnsupportedContractVersion"]);
    let stats = s.runtime.stats().snapshot();
    assert_eq!((stats.ignored, stats.permanent, stats.processed), (1, 1, 0));
    assert!(s.seen().is_empty());
    // Completed without a transaction: the inbox holds no row for it, so a later handler
    // for the contract would still process a redelivery.
    let store = s.runtime.store();
    let mut tx = crate::ports::Store::begin(store).await.unwrap();
    crate::ports::StoreTx::insert_inbox(&mut tx, "orders", "m-1")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_batch_routes_and_completes_unknown_contracts_too() {
    let s = setup(UnknownContracts::Complete).await;
    s.broker.send(Message::new(
        "m-1",
        "orders.order-cancelled.v1",
        r#"{"orderId":"o-1"}"#,
    ));
    s.broker
        .send(Message::new("m-2", "billing.invoice-sent.v1", "{}"));
    s.broker.send(Message::new(
        "m-3",
        "orders.order-placed.v1",
        r#"{"orderId":"o-2"}"#,
    ));
    let deliveries = (0..3).map(|_| s.broker.try_receive().unwrap()).collect();
    let outcomes: Vec<Outcome> = s
        .runtime
        .process_batch(deliveries)
        .await
        .into_iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(
        outcomes,
        [Outcome::Processed, Outcome::Ignored, Outcome::Processed]
    );
    assert_eq!(s.broker.counts().completed, 3);
    assert_eq!(
        s.seen(),
        [
            "cancelled orders.order-cancelled.v1 o-1",
            "placed orders.order-placed.v2 o-2 legacy"
        ]
    );
}

#[test]
fn the_builder_refuses_ambiguous_or_dangling_routes() {
    let seen = Seen::default();
    let twice = Router::<SqliteTx>::builder()
        .json(Placed(seen.clone()))
        .json(Placed(seen.clone()))
        .build()
        .unwrap_err();
    assert_eq!(
        twice,
        RouterError::DuplicateContract(Contract::new("orders.order-placed", 2))
    );
    assert!(
        twice.to_string().contains("orders.order-placed.v2"),
        "{twice}"
    );

    // An upcaster of a contract a handler takes already.
    let shadowed = Router::<SqliteTx>::builder()
        .json(Placed(seen.clone()))
        .route(Json::new(V1Handler))
        .upcast(|v1: PlacedV1| {
            Ok(PlacedV2 {
                order_id: v1.order_id,
                channel: "x".into(),
            })
        })
        .build()
        .unwrap_err();
    assert_eq!(
        shadowed,
        RouterError::DuplicateContract(Contract::new("orders.order-placed", 1))
    );

    let dangling = Router::<SqliteTx>::builder()
        .json(Cancel(seen.clone()))
        .upcast(|v1: PlacedV1| {
            Ok(PlacedV2 {
                order_id: v1.order_id,
                channel: "x".into(),
            })
        })
        .build()
        .unwrap_err();
    assert!(
        matches!(dangling, RouterError::NoUpcastTarget { .. }),
        "{dangling}"
    );

    // The route of v2 takes another type than the upcaster produces.
    let mismatch = Router::<SqliteTx>::builder()
        .json(Placed(seen.clone()))
        .upcast(|c: Cancelled| {
            Ok(OtherV2 {
                order_id: c.order_id,
            })
        })
        .build()
        .unwrap_err();
    assert!(
        matches!(mismatch, RouterError::UpcastTypeMismatch { .. }),
        "{mismatch}"
    );

    assert_eq!(
        Router::<SqliteTx>::builder().build().unwrap_err(),
        RouterError::Empty
    );
}

#[tokio::test]
async fn a_context_handled_twice_sees_its_payload_both_times() {
    let seen = Seen::default();
    let router = router_for_recording(&seen);
    let message = Message::new("m-1", "orders.order-placed.v1", r#"{"orderId":"o-1"}"#);
    let ctx = crate::testing::ContextBuilder::new("orders", message).unwrap();
    for _ in 0..2 {
        let mut tx = crate::testing::RecordingTx::new();
        let handled = ctx.handle(&router, &mut tx).await;
        assert_eq!(handled.unwrap(), Handled::Processed);
    }
    assert_eq!(seen.lock().unwrap().len(), 2);
}

fn router_for_recording(seen: &Seen) -> Router<crate::testing::RecordingTx> {
    Router::builder()
        .json(Placed(seen.clone()))
        .upcast(|v1: PlacedV1| {
            Ok(PlacedV2 {
                order_id: v1.order_id,
                channel: "legacy".into(),
            })
        })
        .build()
        .unwrap()
}

struct V1Handler;
impl<T: Tx> JsonHandler<T> for V1Handler {
    type Message = PlacedV1;
    async fn handle(
        &self,
        _: &Context<'_, PlacedV1>,
        _: &PlacedV1,
        _: &mut T,
    ) -> Result<Handled, HandlerError> {
        Ok(Handled::Processed)
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OtherV2 {
    #[allow(dead_code)]
    order_id: String,
}
impl JsonContract for OtherV2 {
    const NAME: &'static str = "orders.order-placed";
    const VERSION: u32 = 2;
}
