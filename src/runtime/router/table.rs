//! The routing table: each contract to the route that decodes and handles it (directly, or
//! through an upcaster), the [`Routed`] payload a route decodes into and takes back out, and
//! [`RouterBuilder`], which fills the table and refuses ambiguous or dangling routes.

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::{AnyPayload, BoxFuture, Router, RouterError};
use crate::envelope::Contract;
use crate::ports::Tx;
use crate::runtime::handler::{Context, DecodeError, Handled, Handler, HandlerError};
use crate::runtime::json::{Json, JsonHandler};

/// A route's handler with its payload type erased.
pub(super) trait Route<T: Tx + 'static>: Send + Sync + 'static {
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
pub(super) type Upcaster = Box<dyn Fn(&[u8]) -> Result<AnyPayload, DecodeError> + Send + Sync>;

/// An upcaster waiting for [`RouterBuilder::build`] to find its target route.
pub(super) struct PendingUpcast {
    pub(super) from: Contract,
    pub(super) to: Contract,
    pub(super) produces: TypeId,
    pub(super) upcaster: Upcaster,
}

/// A router's payload: the body decoded by the route that will handle it, opaque outside the
/// router. Handlers behind a router see their own payload type.
pub struct Routed {
    /// The route that decoded it, and will handle it.
    pub(super) route: usize,
    /// The contract the handler is shown: the upcast target, or `None` for the envelope's.
    pub(super) upcast: Option<Contract>,
    pub(super) value: Mutex<Option<AnyPayload>>,
}

impl Routed {
    pub(super) fn take<P: 'static>(&self) -> Result<P, HandlerError> {
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

    pub(super) fn put(&self, value: AnyPayload) {
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

/// How a contract is dispatched.
pub(super) enum Dispatch {
    /// Decoded and handled by route `0`.
    Direct(usize),
    /// Decoded by the upcaster, handled by route `to` as contract `as_contract`.
    Upcast {
        upcaster: Upcaster,
        to: usize,
        as_contract: Contract,
    },
}

/// A built router's routes, how each contract reaches one, and every contract accepted.
pub(super) struct Table<T: Tx + 'static> {
    pub(super) routes: Vec<Box<dyn Route<T>>>,
    pub(super) dispatch: HashMap<Contract, Dispatch>,
    pub(super) contracts: Vec<Contract>,
}

/// Collects a [`Router`]'s routes; [`RouterBuilder::build`] checks that every contract has
/// exactly one of them.
pub struct RouterBuilder<T: Tx + 'static> {
    pub(super) routes: Vec<Box<dyn Route<T>>>,
    pub(super) upcasts: Vec<PendingUpcast>,
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
    /// No routes yet: what [`Router::builder`] returns.
    pub(super) fn new() -> Self {
        RouterBuilder {
            routes: Vec::new(),
            upcasts: Vec::new(),
        }
    }

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
