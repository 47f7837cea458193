//! [`Router`]: one consumer, several contracts, each with its own typed handler.
//!
//! An endpoint queue often carries several event types (`orders.order-placed`,
//! `orders.order-cancelled`), and v1 and v2 of one type while producers roll out. A router
//! holds one handler per contract (a handler may accept several versions of one name) and
//! [upcasters](RouterBuilder::upcast) that turn an old version into the one a handler takes. It
//! is itself a [`Handler`], so [`Runtime`](crate::runtime::Runtime), `Worker::consumer`,
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
//!
//! # Layout
//! - here: [`Router`] and [`RouterError`];
//! - `table`: the routing table, each contract to its route (a handler with its payload type
//!   erased, the [`Routed`] payload it decodes into), and [`RouterBuilder`], which fills and
//!   checks it;
//! - `upcast`: upcasters, an old contract version turned into the one a handler takes
//!   ([`RouterBuilder::upcast`], [`UpcastError`]);
//! - `handler`: the router as a [`Handler`]: decode by the contract's route, hand the payload
//!   to that route's handler.
//!
//! The files lean one way: `upcast` and `handler` add to the table, the table names neither.
//!
//! [`Handler`]: super::Handler
//! [`Handler::contracts`]: super::Handler::contracts

mod handler;
mod table;
#[cfg(test)]
mod tests;
mod upcast;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::envelope::Contract;
use crate::ports::Tx;

use table::Table;
pub use table::{Routed, RouterBuilder};
pub use upcast::UpcastError;

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

/// One consumer, several contracts, each with its own handler: a [`Handler`] that dispatches
/// on the contract. Built with [`Router::builder`]; cheap to clone (the routes are shared), so
/// one router serves every consumer a worker hosts.
///
/// [`Handler`]: super::Handler
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
        RouterBuilder::new()
    }
}
