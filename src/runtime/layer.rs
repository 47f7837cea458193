//! Middleware around handlers, tower-style: a [`Layer`] wraps a handler in another handler.
//!
//! Cross-cutting concerns (a tenant read from the envelope's headers, log fields on the
//! process span, per-contract metrics, a message refused before the business code runs) are
//! written once, as a [`Middleware`], and put around a whole [`Router`](crate::Router) or one
//! of its routes with [`HandlerExt::layer`] and [`around`]. A layer runs inside the message's
//! transaction, after the inbox row is inserted: what it returns is the handler's result, so
//! an error it returns settles the delivery like a handler's (a
//! [`HandlerError::rejected`] dead-letters it, a transient error abandons it), and it sees the
//! inner handler's result before the runtime does.
//!
//! Layers nest like tower's: `h.layer(a).layer(b)` runs `b`, then `a`, then `h`, and their
//! results unwind in the reverse order.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::{
    ConsumerName, Context, Contract, DecodeError, Handled, Handler, HandlerError, Headers,
};
use crate::ports::{Message, Tx};

/// Wraps a handler in another handler: tower's `Layer`, for [`Handler`]s.
pub trait Layer<H> {
    /// The wrapping handler.
    type Handler;

    /// Wraps `inner`.
    fn layer(&self, inner: H) -> Self::Handler;
}

/// [`HandlerExt::layer`] on every handler.
pub trait HandlerExt: Sized {
    /// Wraps `self` in `layer`: `router.layer(around(Tenant))`.
    fn layer<L: Layer<Self>>(self, layer: L) -> L::Handler {
        layer.layer(self)
    }
}

impl<H: Send + Sync + 'static> HandlerExt for H {}

/// What a [`Middleware`] sees of a message: everything in its [`Context`] but the payload
/// (whose type only the handler knows).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Meta<'a> {
    /// The message as received.
    pub message: &'a Message,
    /// The checked logical message id (the inbox key).
    pub logical_id: &'a str,
    /// The consumer this runtime runs as.
    pub consumer: &'a ConsumerName,
    /// The contract the handler is given.
    pub contract: &'a Contract,
    /// The envelope's headers.
    pub headers: &'a Headers,
    /// Earlier deliveries of this message.
    pub delivery_count: u32,
}

impl<'a> Meta<'a> {
    /// The parts of `ctx` a middleware sees.
    pub fn of<P>(ctx: &'a Context<'_, P>) -> Self {
        Meta {
            message: ctx.message,
            logical_id: ctx.logical_id,
            consumer: ctx.consumer,
            contract: ctx.contract,
            headers: ctx.headers,
            delivery_count: ctx.delivery_count,
        }
    }
}

/// The rest of the chain: the inner handler (and the layers inside this one), not started until
/// [`Next::run`] is awaited. Dropping it without running skips the handler.
pub struct Next<'a> {
    inner: Pin<Box<dyn Future<Output = Result<Handled, HandlerError>> + Send + 'a>>,
}

impl Next<'_> {
    /// Runs the inner handler and returns its result.
    ///
    /// # Errors
    /// The inner handler's [`HandlerError`].
    pub async fn run(self) -> Result<Handled, HandlerError> {
        self.inner.await
    }
}

impl std::fmt::Debug for Next<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Next").finish_non_exhaustive()
    }
}

/// Code around a handler, for any payload: put it around a handler with [`around`].
///
/// # Examples
/// A tenant from the envelope's headers, as a log field on the process span, and a refusal of
/// messages without one; a per-contract counter; both around a router, the second around one
/// route only:
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::{Mutex, PoisonError};
/// use tracing::Instrument as _;
/// use sb_inbox::runtime::{Meta, Middleware, Next, around};
/// use sb_inbox::{Handled, HandlerError, HandlerExt, PropertyValue, Router, Tx};
/// # use sb_inbox::{Context, JsonContract, JsonHandler};
/// # #[derive(serde::Deserialize)] struct OrderPlaced {}
/// # impl JsonContract for OrderPlaced { const NAME: &'static str = "orders.order-placed"; const VERSION: u32 = 1; }
/// # struct Placed;
/// # impl<T: Tx> JsonHandler<T> for Placed {
/// #     type Message = OrderPlaced;
/// #     async fn handle(&self, _: &Context<'_, OrderPlaced>, _: &OrderPlaced, _: &mut T) -> Result<Handled, HandlerError> { Ok(Handled::Processed) }
/// # }
///
/// struct Tenant;
///
/// impl Middleware for Tenant {
///     async fn call(&self, meta: Meta<'_>, next: Next<'_>) -> Result<Handled, HandlerError> {
///         let Some(PropertyValue::String(tenant)) = meta.headers.get("tenant") else {
///             // Dead-lettered HandlerRejected; the handler never runs.
///             return Err(HandlerError::rejected("the message names no tenant"));
///         };
///         // Every log line of the handler carries the tenant.
///         next.run().instrument(tracing::info_span!("tenant", tenant = %tenant)).await
///     }
/// }
///
/// /// Handled messages per contract; in a service, an OpenTelemetry counter labelled with the
/// /// contract (a bounded label: the router's contracts only).
/// #[derive(Default)]
/// struct Counted(Mutex<BTreeMap<String, u64>>);
///
/// impl Middleware for Counted {
///     async fn call(&self, meta: Meta<'_>, next: Next<'_>) -> Result<Handled, HandlerError> {
///         let result = next.run().await;
///         if result.is_ok() {
///             let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
///             *counts.entry(meta.contract.to_string()).or_default() += 1;
///         }
///         result
///     }
/// }
///
/// # fn main() -> Result<(), sb_inbox::RouterError> {
/// let router = Router::<sb_inbox::testing::RecordingTx>::builder()
///     .route(sb_inbox::Json::new(Placed).layer(around(Counted::default())))
///     .build()?
///     .layer(around(Tenant));
/// # let _ = router;
/// # Ok(()) }
/// ```
pub trait Middleware: Send + Sync + 'static {
    /// Runs around the handler: call `next.run().await` to run it (or not, to refuse the
    /// message), and return its result or another one.
    ///
    /// # Errors
    /// A [`HandlerError`], settled as a handler's.
    fn call(
        &self,
        meta: Meta<'_>,
        next: Next<'_>,
    ) -> impl Future<Output = Result<Handled, HandlerError>> + Send;
}

/// A [`Middleware`] as a [`Layer`].
pub fn around<M: Middleware>(middleware: M) -> Around<M> {
    Around(Arc::new(middleware))
}

/// The [`Layer`] of a [`Middleware`]: see [`around`].
#[derive(Debug)]
pub struct Around<M>(Arc<M>);

impl<M> Clone for Around<M> {
    fn clone(&self) -> Self {
        Around(self.0.clone())
    }
}

impl<M: Middleware, H> Layer<H> for Around<M> {
    type Handler = Layered<M, H>;

    fn layer(&self, inner: H) -> Layered<M, H> {
        Layered {
            middleware: self.0.clone(),
            inner,
        }
    }
}

/// A handler with a [`Middleware`] around it.
#[derive(Debug)]
pub struct Layered<M, H> {
    middleware: Arc<M>,
    inner: H,
}

impl<M, H: Clone> Clone for Layered<M, H> {
    fn clone(&self) -> Self {
        Layered {
            middleware: self.middleware.clone(),
            inner: self.inner.clone(),
        }
    }
}

impl<T: Tx, M: Middleware, H: Handler<T>> Handler<T> for Layered<M, H> {
    type Payload = H::Payload;

    fn contracts(&self) -> &[Contract] {
        self.inner.contracts()
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<H::Payload, DecodeError> {
        self.inner.decode(contract, body)
    }

    async fn handle(
        &self,
        ctx: &Context<'_, H::Payload>,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let next = Next {
            inner: Box::pin(self.inner.handle(ctx, tx)),
        };
        self.middleware.call(Meta::of(ctx), next).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::envelope::DeadLetterReason;
    use crate::ports::{Message, PropertyValue};
    use crate::runtime::clock::Clock;
    use crate::runtime::json::{Json, JsonContract, JsonHandler};
    use crate::runtime::outcome::Outcome;
    use crate::runtime::router::Router;
    use crate::runtime::{Runtime, RuntimeConfig};
    use crate::store::{SqliteStore, SqliteTx};
    use crate::testing::MemoryBroker;

    type Log = Arc<Mutex<Vec<String>>>;

    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Placed {
        order_id: String,
    }
    impl JsonContract for Placed {
        const NAME: &'static str = "orders.order-placed";
        const VERSION: u32 = 1;
    }

    #[derive(serde::Deserialize)]
    struct Cancelled {}
    impl JsonContract for Cancelled {
        const NAME: &'static str = "orders.order-cancelled";
        const VERSION: u32 = 1;
    }

    struct PlacedHandler(Log);
    impl<T: Tx> JsonHandler<T> for PlacedHandler {
        type Message = Placed;
        async fn handle(
            &self,
            ctx: &Context<'_, Placed>,
            order: &Placed,
            tx: &mut T,
        ) -> Result<Handled, HandlerError> {
            tx.claim_business_key(ctx.consumer.as_str(), &order.order_id, ctx.logical_id())
                .await?;
            self.0.lock().unwrap().push("handler".to_owned());
            Ok(Handled::Processed)
        }
    }

    struct CancelledHandler(Log);
    impl<T: Tx> JsonHandler<T> for CancelledHandler {
        type Message = Cancelled;
        async fn handle(
            &self,
            _: &Context<'_, Cancelled>,
            _: &Cancelled,
            _: &mut T,
        ) -> Result<Handled, HandlerError> {
            self.0.lock().unwrap().push("cancel handler".to_owned());
            Ok(Handled::Processed)
        }
    }

    /// Logs its name on the way in and the result on the way out.
    struct Trace(&'static str, Log);
    impl Middleware for Trace {
        async fn call(&self, meta: Meta<'_>, next: Next<'_>) -> Result<Handled, HandlerError> {
            self.1
                .lock()
                .unwrap()
                .push(format!("{} in {}", self.0, meta.contract));
            let result = next.run().await;
            let seen = match &result {
                Ok(handled) => format!("{} out {handled:?}", self.0),
                Err(error) => format!("{} out error permanent={}", self.0, error.is_permanent()),
            };
            self.1.lock().unwrap().push(seen);
            result
        }
    }

    /// Refuses a message without a `tenant` header; the handler never runs.
    struct Tenant(Log);
    impl Middleware for Tenant {
        async fn call(&self, meta: Meta<'_>, next: Next<'_>) -> Result<Handled, HandlerError> {
            match meta.headers.get("tenant") {
                Some(PropertyValue::String(tenant)) => {
                    self.0.lock().unwrap().push(format!("tenant {tenant}"));
                    next.run().await
                }
                _ => Err(HandlerError::rejected("the message names no tenant")),
            }
        }
    }

    #[tokio::test]
    async fn layers_run_outermost_first_see_the_result_and_can_refuse() {
        let log = Log::default();
        let router = Router::<SqliteTx>::builder()
            .route(Json::new(PlacedHandler(log.clone())).layer(around(Trace("route", log.clone()))))
            .json(CancelledHandler(log.clone()))
            .build()
            .unwrap()
            .layer(around(Tenant(log.clone())))
            .layer(around(Trace("outer", log.clone())));
        let store = SqliteStore::open_in_memory().unwrap();
        store.migrate().await.unwrap();
        let broker = MemoryBroker::new(Clock::new());
        let config =
            RuntimeConfig::new(crate::runtime::consumer::ConsumerName::new("orders").unwrap());
        let runtime = Runtime::new(broker.receiver(), store, router, config);
        let run = |message: Message| {
            broker.send(message);
            let delivery = broker.try_receive().unwrap();
            let runtime = &runtime;
            async move { runtime.process(delivery).await.outcome }
        };

        let placed = Message::new("m-1", "orders.order-placed.v1", r#"{"orderId":"o-1"}"#)
            .with_property("tenant", "acme");
        assert_eq!(run(placed).await, Outcome::Processed);
        assert_eq!(
            std::mem::take(&mut *log.lock().unwrap()),
            [
                "outer in orders.order-placed.v1",
                "tenant acme",
                "route in orders.order-placed.v1",
                "handler",
                "route out Processed",
                "outer out Processed",
            ]
        );

        // The route's layer wraps that route only.
        let cancelled =
            Message::new("m-2", "orders.order-cancelled.v1", "{}").with_property("tenant", "acme");
        assert_eq!(run(cancelled).await, Outcome::Processed);
        assert_eq!(
            std::mem::take(&mut *log.lock().unwrap()),
            [
                "outer in orders.order-cancelled.v1",
                "tenant acme",
                "cancel handler",
                "outer out Processed",
            ]
        );

        // Refused by the tenant layer: dead-lettered, the handler never ran, the outer layer
        // saw the refusal.
        let anonymous = Message::new("m-3", "orders.order-placed.v1", r#"{"orderId":"o-3"}"#);
        assert_eq!(
            run(anonymous).await,
            Outcome::Permanent(DeadLetterReason::HandlerRejected)
        );
        assert_eq!(
            std::mem::take(&mut *log.lock().unwrap()),
            [
                "outer in orders.order-placed.v1",
                "outer out error permanent=true",
            ]
        );
        let dead = broker.dead_letters();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].description, "the message names no tenant");

        // A layer's error is the handler's error: a duplicate found inside is still one.
        let again = Message::new("m-4", "orders.order-placed.v1", r#"{"orderId":"o-1"}"#)
            .with_property("tenant", "acme");
        assert_eq!(
            run(again).await,
            Outcome::Duplicate(crate::ports::DuplicateScope::BusinessKey)
        );
        assert_eq!(
            log.lock().unwrap().last().map(String::as_str),
            Some("outer out error permanent=false")
        );
    }
}
