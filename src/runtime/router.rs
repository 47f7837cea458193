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
///     .upcast(|v1: OrderPlacedV1| OrderPlacedV2 { order_id: v1.order_id, channel: "web".into() })
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
    /// The route of `New` must be a [`JsonHandler`] of `New` (or any handler whose payload is
    /// `New`); [`RouterBuilder::build`] refuses an upcaster without one.
    #[must_use]
    pub fn upcast<Old, New, F>(mut self, upcast: F) -> Self
    where
        Old: JsonContract,
        New: JsonContract,
        F: Fn(Old) -> New + Send + Sync + 'static,
    {
        self.upcasts.push(PendingUpcast {
            from: Old::contract(),
            to: New::contract(),
            produces: TypeId::of::<New>(),
            upcaster: Box::new(move |body| {
                let new = upcast(decode_json::<Old>(body)?);
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
            Some(Dispatch::Direct(index)) => {
                (*index, None, self.table.routes[*index].decode(contract, body)?)
            }
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
