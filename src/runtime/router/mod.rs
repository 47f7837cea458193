//! [`Router`]: one consumer, several contracts, each with its own typed handler.
//!
//! An endpoint queue often carries several event types (`orders.order-placed`,
//! `orders.order-cancelled`), and v1 and v2 of one type while producers roll out. A router
//! holds one handler per contract (a handler may accept several versions of one name) and
//! [upcasters](RouterBuilder::upcast) that turn an old version into the one a handler takes. It
//! is itself a [`Handler`], so [`Runtime`](crate::Runtime), `Worker::consumer`,
//! `ConfiguredWorker::run`, batching and sessions take it unchanged; the envelope check sees
//! every contract of every route ([`Handler::contracts`]) and rejects the rest before any
//! database work.
//!
//! # Versions
//! A contract version no route accepts is dead-lettered `UnsupportedContractVersion`, whatever
//! [`RuntimeConfig::unknown_contracts`](crate::RuntimeConfig::unknown_contracts) says: the name
//! is ours, so a version we cannot read is a message we own and would lose by completing it.
//! A producer that ships `.v2` before its consumers therefore parks its messages in the
//! dead-letter queue, nothing lost: deploy the consumer that accepts v2 (a route for v2, or a
//! handler for v1..v2), then resubmit them (`sb-inbox dlq resubmit`). The order that avoids the
//! dead letters: consumers first (accepting v1 and v2, or v2 with an upcaster from v1), then
//! the producer.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use super::json::{Json, JsonContract, JsonHandler, decode_json};
use super::{Context, Contract, DecodeError, Handled, Handler, HandlerError};
use crate::ports::Tx;

/// A boxed handler future: what erases each route's own future type.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A decoded body of any route, before it is handed to its handler.
type AnyPayload = Box<dyn Any + Send>;

/// Why a [`RouterBuilder`] refused its routes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    /// Two routes (handlers or upcasters) claim one contract: which should run is ambiguous.
    #[error("two routes accept contract {0}: each contract needs exactly one handler")]
    DuplicateContract(Contract),
    /// An upcaster's target contract is accepted by no handler.
    #[error("the upcaster from {from} produces {to}, which no handler of this router accepts")]
    NoUpcastTarget {
        /// The contract upcast.
        from: Contract,
        /// The contract it becomes.
        to: Contract,
    },
    /// The handler of an upcaster's target contract takes another payload type than the
    /// upcaster produces.
    #[error("the upcaster from {from} produces a type the handler of {to} does not take")]
    UpcastTypeMismatch {
        /// The contract upcast.
        from: Contract,
        /// The contract it becomes.
        to: Contract,
    },
    /// A router with no routes would dead-letter (or complete) everything.
    #[error("a router needs at least one route")]
    Empty,
}

/// Why an upcaster refused to turn an old contract version into the new one: the value has no
/// faithful counterpart in the new version (a field the new one requires and the old one cannot
/// supply, a value the new one forbids). The message is dead-lettered `InvalidPayload` at
/// once, with a description naming both contracts and this reason; redelivery could not
/// change the answer.
///
/// The reason must not quote the payload (it is written into the dead letter's description).
///
/// # Examples
/// ```
/// use sb_inbox::UpcastError;
/// let refused = UpcastError::new("v1 total is negative: v2 has no refunds");
/// assert_eq!(refused.to_string(), "v1 total is negative: v2 has no refunds");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UpcastError(String);

impl UpcastError {
    /// A refusal with this reason (bounded; never quote the payload).
    pub fn new(reason: impl AsRef<str>) -> Self {
        UpcastError(crate::envelope::truncate(reason.as_ref(), 512))
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

/// A route's handler with its payload type erased.
trait Route<T: Tx + 'static>: Send + Sync + 'static {
    fn contracts(&self) -> &[Contract];
    fn payload_type(&self) -> TypeId;
    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<AnyPayload, DecodeError>;
    /// Runs the handler on `ctx`'s payload, presented as `contract`.
    fn handle<'a>(
        &'a self,
        ctx: &'a Context<'a, Routed>,
        contract: &'a Contract,
        tx: &'a mut T,
    ) -> BoxFuture<'a, Result<Handled, HandlerError>>;
}

/// One handler as a [`Route`].
struct Typed<H>(H);

impl<T: Tx + 'static, H: Handler<T>> Route<T> for Typed<H>
where
    H::Payload: 'static,
{
    fn contracts(&self) -> &[Contract] {
        self.0.contracts()
    }

    fn payload_type(&self) -> TypeId {
        TypeId::of::<H::Payload>()
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<AnyPayload, DecodeError> {
        Ok(Box::new(self.0.decode(contract, body)?))
    }

    fn handle<'a>(
        &'a self,
        ctx: &'a Context<'a, Routed>,
        contract: &'a Contract,
        tx: &'a mut T,
    ) -> BoxFuture<'a, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let payload = ctx.payload.take::<H::Payload>()?;
            let inner = Context {
                payload,
                message: ctx.message,
                logical_id: ctx.logical_id,
                consumer: ctx.consumer,
                contract,
                headers: ctx.headers,
                delivery_count: ctx.delivery_count,
            };
            let result = self.0.handle(&inner, tx).await;
            // Put back, so the same context can be handled again (a test's `ContextBuilder`).
            ctx.payload.put(Box::new(inner.payload));
            result
        })
    }
}

/// Decodes the old version of an upcast contract and converts it.
type Upcaster = Box<dyn Fn(&[u8]) -> Result<AnyPayload, DecodeError> + Send + Sync>;

/// How a contract is dispatched.
enum Dispatch {
    /// Decoded and handled by route `0`.
    Direct(usize),
    /// Decoded by the upcaster, handled by route `to` as contract `as_contract`.
    Upcast {
        upcaster: Upcaster,
        to: usize,
        as_contract: Contract,
    },
}

/// A router's payload: the body decoded by the route that will handle it, opaque outside the
/// router. Handlers behind a router see their own payload type.
pub struct Routed {
    route: usize,
    /// The contract the handler is shown: the upcast target, or `None` for the envelope's.
    upcast: Option<Contract>,
    value: Mutex<Option<AnyPayload>>,
}

impl Routed {
    fn take<P: 'static>(&self) -> Result<P, HandlerError> {
        let value = self
            .value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match value.map(|v| v.downcast::<P>()) {
            Some(Ok(payload)) => Ok(*payload),
            // Unreachable through the router's own decode; kept as an error, not a panic.
            Some(Err(_)) => Err(HandlerError::transient(
                "router: the decoded payload is not the route's type",
            )),
            None => Err(HandlerError::transient(
                "router: the payload is being handled already (the same context handled twice at once)",
            )),
        }
    }

    fn put(&self, value: AnyPayload) {
        *self.value.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
    }
}

impl fmt::Debug for Routed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Routed")
            .field("route", &self.route)
            .field("upcast", &self.upcast)
            .finish_non_exhaustive()
    }
}

struct Table<T: Tx + 'static> {
    routes: Vec<Box<dyn Route<T>>>,
    dispatch: HashMap<Contract, Dispatch>,
    contracts: Vec<Contract>,
}

/// One consumer, several contracts, each with its own handler: a [`Handler`] that dispatches
/// on the contract. Built with [`Router::builder`]; cheap to clone (the routes are shared), so
/// one router serves every consumer a worker hosts.
///
/// # Examples
/// ```
/// # #![allow(dead_code)]
/// use sb_inbox::{Context, Handled, HandlerError, JsonContract, JsonHandler, Router, Tx};
///
/// #[derive(serde::Deserialize)]
/// #[serde(rename_all = "camelCase")]
/// struct OrderPlacedV1 { order_id: String }
/// impl JsonContract for OrderPlacedV1 {
///     const NAME: &'static str = "orders.order-placed";
///     const VERSION: u32 = 1;
/// }
///
/// #[derive(serde::Deserialize)]
/// #[serde(rename_all = "camelCase")]
/// struct OrderPlacedV2 { order_id: String, channel: String }
/// impl JsonContract for OrderPlacedV2 {
///     const NAME: &'static str = "orders.order-placed";
///     const VERSION: u32 = 2;
/// }
///
/// #[derive(serde::Deserialize)]
/// #[serde(rename_all = "camelCase")]
/// struct OrderCancelled { order_id: String }
/// impl JsonContract for OrderCancelled {
///     const NAME: &'static str = "orders.order-cancelled";
///     const VERSION: u32 = 1;
/// }
///
/// struct Placed;
/// impl<T: Tx + 'static> JsonHandler<T> for Placed {
///     type Message = OrderPlacedV2;
///     async fn handle(&self, ctx: &Context<'_, OrderPlacedV2>, order: &OrderPlacedV2, tx: &mut T)
///         -> Result<Handled, HandlerError> {
///         tx.claim_business_key(ctx.consumer.as_str(), &format!("order:{}", order.order_id), ctx.logical_id()).await?;
///         Ok(Handled::Processed)
///     }
/// }
///
/// struct Cancelled;
/// impl<T: Tx + 'static> JsonHandler<T> for Cancelled {
///     type Message = OrderCancelled;
///     async fn handle(&self, _: &Context<'_, OrderCancelled>, _: &OrderCancelled, _: &mut T)
///         -> Result<Handled, HandlerError> {
///         Ok(Handled::Processed)
///     }
/// }
///
/// # fn main() -> Result<(), sb_inbox::RouterError> {
/// let router = Router::<sb_inbox::testing::RecordingTx>::builder()
///     .json(Placed)
///     // v1 bodies decode as v1, become v2, and reach `Placed`.
///     // An upcaster may refuse a value v2 cannot express (`UpcastError`): dead-lettered at once.
///     .upcast(|v1: OrderPlacedV1| Ok(OrderPlacedV2 { order_id: v1.order_id, channel: "web".into() }))
///     .json(Cancelled)
///     .build()?;
/// # let _ = router;
/// # Ok(()) }
/// ```
pub struct Router<T: Tx + 'static> {
    table: Arc<Table<T>>,
}

impl<T: Tx + 'static> Clone for Router<T> {
    fn clone(&self) -> Self {
        Router {
            table: self.table.clone(),
        }
    }
}

impl<T: Tx + 'static> fmt::Debug for Router<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field("contracts", &self.table.contracts)
            .finish_non_exhaustive()
    }
}

impl<T: Tx + 'static> Router<T> {
    /// A builder with no routes.
    pub fn builder() -> RouterBuilder<T> {
        RouterBuilder {
            routes: Vec::new(),
            upcasts: Vec::new(),
        }
    }
}

/// An upcaster waiting for [`RouterBuilder::build`] to find its target route.
struct PendingUpcast {
    from: Contract,
    to: Contract,
    produces: TypeId,
    upcaster: Upcaster,
}

/// Collects a [`Router`]'s routes; [`RouterBuilder::build`] checks that every contract has
/// exactly one of them.
pub struct RouterBuilder<T: Tx + 'static> {
    routes: Vec<Box<dyn Route<T>>>,
    upcasts: Vec<PendingUpcast>,
}

impl<T: Tx + 'static> fmt::Debug for RouterBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouterBuilder")
            .field("routes", &self.routes.len())
            .field("upcasts", &self.upcasts.len())
            .finish()
    }
}

impl<T: Tx + 'static> RouterBuilder<T> {
    /// Routes every contract `handler` accepts ([`Handler::contracts`]: one, or several
    /// versions of one name) to it. The handler may be layered
    /// ([`HandlerExt::layer`](crate::HandlerExt::layer)): the layer then wraps this route only.
    #[must_use]
    pub fn route<H>(mut self, handler: H) -> Self
    where
        H: Handler<T>,
        H::Payload: 'static,
    {
        self.routes.push(Box::new(Typed(handler)));
        self
    }

    /// Routes the contract of a [`JsonHandler`]'s message to it: `.route(Json::new(handler))`.
    #[must_use]
    pub fn json<H: JsonHandler<T>>(self, handler: H) -> Self {
        self.route(Json::new(handler))
    }

    /// Accepts `Old`'s contract by converting it: a body of `Old`'s contract is decoded (and
    /// validated) as `Old`, turned into `New` by `upcast`, validated as `New`, and handed to the
    /// route of `New`'s contract, whose handler sees `New`'s contract in
    /// [`Context::contract`] (the message's own subject still names `Old`). A body that does
    /// not decode as `Old` is `InvalidPayload`, as for any route.
    ///
    /// `upcast` may refuse a value with no faithful counterpart in `New` ([`UpcastError`]):
    /// the message is dead-lettered `InvalidPayload` at once, the description naming both
    /// contracts and the reason. (An upcaster that panics instead is caught and counted like a
    /// handler's panic: abandoned, then dead-lettered `HandlerPanicked` after
    /// [`RuntimeConfig::max_panics`](crate::RuntimeConfig::max_panics) deliveries.)
    ///
    /// The route of `New` must be a [`JsonHandler`] of `New` (or any handler whose payload is
    /// `New`); [`RouterBuilder::build`] refuses an upcaster without one.
    #[must_use]
    pub fn upcast<Old, New, F>(mut self, upcast: F) -> Self
    where
        Old: JsonContract,
        New: JsonContract,
        F: Fn(Old) -> Result<New, UpcastError> + Send + Sync + 'static,
    {
        let (from, to) = (Old::contract(), New::contract());
        let refused = format!("upcast from {from} to {to} refused");
        self.upcasts.push(PendingUpcast {
            from,
            to,
            produces: TypeId::of::<New>(),
            upcaster: Box::new(move |body| {
                let new = upcast(decode_json::<Old>(body)?)
                    .map_err(|error| DecodeError::new(format!("{refused}: {error}")))?;
                new.validate()?;
                Ok(Box::new(new))
            }),
        });
        self
    }

    /// The router.
    ///
    /// # Errors
    /// [`RouterError::DuplicateContract`] when two routes or upcasters claim one contract;
    /// [`RouterError::NoUpcastTarget`] or [`RouterError::UpcastTypeMismatch`] for an upcaster
    /// whose target no handler takes; [`RouterError::Empty`] without routes.
    pub fn build(self) -> Result<Router<T>, RouterError> {
        if self.routes.is_empty() {
            return Err(RouterError::Empty);
        }
        let mut dispatch = HashMap::new();
        let mut contracts = Vec::new();
        for (index, route) in self.routes.iter().enumerate() {
            for contract in route.contracts() {
                if dispatch
                    .insert(contract.clone(), Dispatch::Direct(index))
                    .is_some()
                {
                    return Err(RouterError::DuplicateContract(contract.clone()));
                }
                contracts.push(contract.clone());
            }
        }
        for pending in self.upcasts {
            let target = match dispatch.get(&pending.to) {
                Some(Dispatch::Direct(index)) => *index,
                _ => {
                    return Err(RouterError::NoUpcastTarget {
                        from: pending.from,
                        to: pending.to,
                    });
                }
            };
            if self.routes[target].payload_type() != pending.produces {
                return Err(RouterError::UpcastTypeMismatch {
                    from: pending.from,
                    to: pending.to,
                });
            }
            if dispatch.contains_key(&pending.from) {
                return Err(RouterError::DuplicateContract(pending.from));
            }
            contracts.push(pending.from.clone());
            dispatch.insert(
                pending.from,
                Dispatch::Upcast {
                    upcaster: pending.upcaster,
                    to: target,
                    as_contract: pending.to,
                },
            );
        }
        Ok(Router {
            table: Arc::new(Table {
                routes: self.routes,
                dispatch,
                contracts,
            }),
        })
    }
}

impl<T: Tx + 'static> Handler<T> for Router<T> {
    type Payload = Routed;

    fn contracts(&self) -> &[Contract] {
        &self.table.contracts
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<Routed, DecodeError> {
        let (route, upcast, value) = match self.table.dispatch.get(contract) {
            Some(Dispatch::Direct(index)) => (
                *index,
                None,
                self.table.routes[*index].decode(contract, body)?,
            ),
            Some(Dispatch::Upcast {
                upcaster,
                to,
                as_contract,
            }) => (*to, Some(as_contract.clone()), upcaster(body)?),
            // The envelope check admits only listed contracts; a caller that skipped it.
            None => {
                return Err(DecodeError::new(format!(
                    "no route for contract {contract}"
                )));
            }
        };
        Ok(Routed {
            route,
            upcast,
            value: Mutex::new(Some(value)),
        })
    }

    async fn handle(&self, ctx: &Context<'_, Routed>, tx: &mut T) -> Result<Handled, HandlerError> {
        let route = &self.table.routes[ctx.payload.route];
        let contract = ctx.payload.upcast.as_ref().unwrap_or(ctx.contract);
        route.handle(ctx, contract, tx).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::testing::MemoryBroker;
    use crate::{
        Clock, ConsumerName, DeadLetterReason, Message, Outcome, Runtime, RuntimeConfig,
        SqliteStore, SqliteTx, UnknownContracts,
    };

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
        let config = RuntimeConfig::new(ConsumerName::new("orders").unwrap())
            .with_unknown_contracts(unknown);
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
            Outcome::Duplicate(crate::DuplicateScope::Inbox)
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
        let mut tx = crate::Store::begin(store).await.unwrap();
        crate::StoreTx::insert_inbox(&mut tx, "orders", "m-1")
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
}
