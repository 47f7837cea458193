//! The reference consumer from the article: `inventory.order-placed.v1` consumes
//! `orders.order-placed.v1` and reserves stock, one reservation per order.
//!
//! It is written the way a user writes a consumer: on the public API only. The business
//! statements are per store ([`InventoryTx`]); everything else is the runtime's.
//!
//! Each order also claims the business key `order:<order id>`, so a producer that republishes
//! the same order under a new message id is recognised as a duplicate too. With an events
//! destination ([`OrderPlacedConsumer::with_events`]) it also writes `inventory.stock-reserved.v1`
//! to the outbox in the same transaction; the outbox relay publishes it.
//!
//! `sb-inbox run` hosts it as a [`Router`] ([`router`]): `orders.order-placed.v2` (v1 plus the
//! sales channel) reserves, v1 bodies are upcast to v2 ([`OrderPlacedV2::from`]), and
//! `orders.order-cancelled.v1` releases the reservation. [`OrderPlacedConsumer`] is the v1
//! route alone, as the article has it (the runtime tests and benches host it).

mod sql;

use std::future::Future;

use serde::{Deserialize, Serialize};

use sb_inbox::{
    Context, Contract, DecodeError, Handled, Handler, HandlerError, JsonContract, JsonHandler,
    OutboxMessage, Router, RouterError, Store, StoreError, Tx,
};

/// The consumer name.
pub const CONSUMER: &str = "inventory.order-placed.v1";
/// The contract consumed.
pub const CONTRACT: &str = "orders.order-placed.v1";

/// The newer version of the order contract, which the reference worker's router handles.
pub const CONTRACT_V2: &str = "orders.order-placed.v2";
/// The cancellation contract the reference worker's router handles.
pub const CANCELLED_CONTRACT: &str = "orders.order-cancelled.v1";

/// The event written to the outbox for each reservation.
pub const EVENT_CONTRACT: &str = "inventory.stock-reserved.v1";

/// `inventory.stock-reserved.v1`: the stock of an order is reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StockReserved {
    /// The order.
    pub order_id: String,
    /// What was reserved.
    pub lines: Vec<OrderLine>,
    /// The order's sales channel, when it came as `orders.order-placed.v2` (an additive field:
    /// absent for v1 orders hosted by [`OrderPlacedConsumer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

/// `orders.order-placed.v1`. Fields it does not know are ignored (tolerant reading), so a
/// producer that adds one does not dead-letter its orders here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderPlaced {
    /// The order.
    pub order_id: String,
    /// What to reserve.
    pub lines: Vec<OrderLine>,
}

impl OrderPlaced {
    /// The consumer's own rules beyond the JSON shape: an order id of 1 to 64 characters and
    /// at least one line.
    ///
    /// # Errors
    /// [`DecodeError`] naming the rule broken (never quoting values).
    pub fn validate(&self) -> Result<(), DecodeError> {
        if self.order_id.is_empty() || self.order_id.len() > 64 {
            return Err(DecodeError::new("orderId must be 1 to 64 characters"));
        }
        if self.lines.is_empty() {
            return Err(DecodeError::new("an order needs at least one line"));
        }
        Ok(())
    }

    /// Units per SKU, each SKU once, in SKU order: the order in which a transaction must lock
    /// stock rows. Two orders that lock shared rows in one global order wait for each other
    /// instead of deadlocking (each deadlock costs PostgreSQL's `deadlock_timeout`, 1 s by
    /// default, and a retry).
    pub fn stock_by_sku(&self) -> std::collections::BTreeMap<&str, i64> {
        let mut units = std::collections::BTreeMap::new();
        for line in &self.lines {
            *units.entry(line.sku.as_str()).or_insert(0) += i64::from(line.quantity);
        }
        units
    }
}

impl JsonContract for OrderPlaced {
    const NAME: &'static str = "orders.order-placed";
    const VERSION: u32 = 1;

    fn validate(&self) -> Result<(), DecodeError> {
        OrderPlaced::validate(self)
    }
}

/// The channel an order upcast from v1 is given: v1 did not say.
pub const UNKNOWN_CHANNEL: &str = "unknown";

/// `orders.order-placed.v2`: v1 plus the sales channel (`web`, `store`, …), required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderPlacedV2 {
    /// The order, as in v1.
    #[serde(flatten)]
    pub order: OrderPlaced,
    /// Where it was placed: 1 to 32 characters.
    pub channel: String,
}

impl JsonContract for OrderPlacedV2 {
    const NAME: &'static str = "orders.order-placed";
    const VERSION: u32 = 2;

    fn validate(&self) -> Result<(), DecodeError> {
        self.order.validate()?;
        if self.channel.is_empty() || self.channel.len() > 32 {
            return Err(DecodeError::new("channel must be 1 to 32 characters"));
        }
        Ok(())
    }
}

/// The upcaster: a v1 order is a v2 order from an [`UNKNOWN_CHANNEL`].
impl From<OrderPlaced> for OrderPlacedV2 {
    fn from(order: OrderPlaced) -> Self {
        OrderPlacedV2 {
            order,
            channel: UNKNOWN_CHANNEL.to_owned(),
        }
    }
}

/// `orders.order-cancelled.v1`: release the order's reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderCancelled {
    /// The order: 1 to 64 characters.
    pub order_id: String,
}

impl JsonContract for OrderCancelled {
    const NAME: &'static str = "orders.order-cancelled";
    const VERSION: u32 = 1;

    fn validate(&self) -> Result<(), DecodeError> {
        if self.order_id.is_empty() || self.order_id.len() > 64 {
            return Err(DecodeError::new("orderId must be 1 to 64 characters"));
        }
        Ok(())
    }
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    /// Stock keeping unit.
    pub sku: String,
    /// Units to reserve (positive).
    pub quantity: i32,
}

/// The business statements of the inventory consumer, per store.
pub trait InventoryTx: Tx {
    /// Records the reservation of `order` under the delivery's logical id (the inbox key) and
    /// adds its quantities to the reserved stock.
    fn reserve(
        &mut self,
        logical_id: &str,
        order: &OrderPlaced,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims the business key `key` for `logical_id` ([`Tx::claim_business_key`]), then
    /// reserves `order` ([`InventoryTx::reserve`]). PostgreSQL sends both in one round trip
    /// ([`sb_inbox::PgTx::claim_business_key_then`]); a key claimed before fails as the claim
    /// alone does, and nothing is reserved.
    fn claim_and_reserve(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
        order: &OrderPlaced,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            self.claim_business_key(consumer, key, logical_id).await?;
            self.reserve(logical_id, order).await
        }
    }

    /// Releases the reservation of `order_id`: its lines are deleted and their units taken off
    /// the reserved stock, SKU by SKU in SKU order (as [`OrderPlaced::stock_by_sku`] locks
    /// them). `false` when the order holds no reservation.
    fn release_reservation(
        &mut self,
        order_id: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What the inventory tables hold, for reports and verification.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InventoryCounts {
    /// Reservations (one per order).
    pub reservations: i64,
    /// Reserved units over all SKUs.
    pub reserved_units: i64,
    /// Units of all reservation lines: equals `reserved_units` unless an effect repeated.
    pub line_units: i64,
    /// Inbox rows of this consumer.
    pub inbox_rows: i64,
}

/// The inventory schema's migration (`crates/cli/sql/<provider>/0002_inventory.sql`). It keeps version 2,
/// the number it had when it was part of the core migrations, so databases that applied it
/// then are not migrated again.
pub const MIGRATION_VERSION: i64 = 2;

/// The inventory schema and reads of a store.
pub trait InventoryStore: Store<Tx: InventoryTx> {
    /// Applies the inventory tables' migration if not applied yet (through the store's
    /// `apply_migrations` hook); returns how many ran (0 or 1). The store's core migrations
    /// must be applied first.
    fn migrate_inventory(&self) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Whether the inventory migration is recorded: without it the reference worker stays not
    /// ready and retries, rather than dead-letter every order on a missing table.
    fn inventory_migrated(&self) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts reservations, units and inbox rows.
    fn inventory_counts(&self) -> impl Future<Output = Result<InventoryCounts, StoreError>> + Send;
}

/// The consumer.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
/// use sb_inbox::testing::MemoryBroker;
/// use sb_inbox::{ConsumerName, Message, Runtime, RuntimeConfig, SqliteStore};
///
/// let store = SqliteStore::open_in_memory()?;
/// store.migrate().await?;
/// store.migrate_inventory().await?;
/// let broker = MemoryBroker::new(sb_inbox::Clock::new());
/// broker.send(Message::new("m-1", "orders.order-placed.v1", r#"{"orderId":"o-1","lines":[{"sku":"A","quantity":2}]}"#));
/// let config = RuntimeConfig::new(ConsumerName::new(sb_inbox_cli::inventory::CONSUMER)?);
/// let runtime = Runtime::new(broker.receiver(), store.clone(), OrderPlacedConsumer::new(), config);
/// let delivery = broker.try_receive().expect("a message");
/// runtime.process(delivery).await;
/// assert_eq!(store.inventory_counts().await?.reservations, 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct OrderPlacedConsumer {
    contracts: Vec<Contract>,
    events: Option<String>,
}

impl OrderPlacedConsumer {
    /// The consumer of `orders.order-placed.v1`.
    pub fn new() -> Self {
        OrderPlacedConsumer {
            contracts: vec![OrderPlaced::contract()],
            events: None,
        }
    }

    /// Also writes an [`EVENT_CONTRACT`] event for `destination` to the outbox with each
    /// reservation (a fresh message id, the order's correlation id or else its message id).
    pub fn with_events(mut self, destination: impl Into<String>) -> Self {
        self.events = Some(destination.into());
        self
    }
}

impl Default for OrderPlacedConsumer {
    fn default() -> Self {
        OrderPlacedConsumer::new()
    }
}

impl<T: InventoryTx> Handler<T> for OrderPlacedConsumer {
    type Payload = OrderPlaced;

    fn contracts(&self) -> &[Contract] {
        &self.contracts
    }

    fn decode(&self, _contract: &Contract, body: &[u8]) -> Result<OrderPlaced, DecodeError> {
        sb_inbox::runtime::decode_json(body)
    }

    async fn handle(
        &self,
        ctx: &Context<'_, OrderPlaced>,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        place(ctx, &ctx.payload, None, self.events.as_deref(), tx).await
    }
}

/// The reservation of one order: the business key, the stock, and with `events` the
/// [`EVENT_CONTRACT`] event in the outbox (a fresh message id, the order's correlation id or
/// else its logical id).
async fn place<T: InventoryTx, P>(
    ctx: &Context<'_, P>,
    order: &OrderPlaced,
    channel: Option<&str>,
    events: Option<&str>,
    tx: &mut T,
) -> Result<Handled, HandlerError> {
    tx.claim_and_reserve(
        ctx.consumer.as_str(),
        &format!("order:{}", order.order_id),
        ctx.logical_id(),
        order,
    )
    .await?;
    if let Some(destination) = events {
        let event = StockReserved {
            order_id: order.order_id.clone(),
            lines: order.lines.clone(),
            channel: channel.map(str::to_owned),
        };
        let body = serde_json::to_vec(&event)
            .map_err(|e| HandlerError::permanent(format!("cannot encode {EVENT_CONTRACT}"), e))?;
        let mut message = OutboxMessage::new(destination, EVENT_CONTRACT, body);
        message.correlation_id = Some(
            ctx.message
                .correlation_id
                .clone()
                .unwrap_or_else(|| ctx.logical_id().to_owned()),
        );
        tx.append_outbox(&message).await?;
    }
    Ok(Handled::Processed)
}

/// The `orders.order-placed.v2` route: reserves as [`OrderPlacedConsumer`] does, with the
/// channel on the event. v1 orders reach it through the router's upcaster.
#[derive(Debug, Clone, Default)]
pub struct PlaceOrder {
    events: Option<String>,
}

impl<T: InventoryTx> JsonHandler<T> for PlaceOrder {
    type Message = OrderPlacedV2;

    async fn handle(
        &self,
        ctx: &Context<'_, OrderPlacedV2>,
        order: &OrderPlacedV2,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let channel = Some(order.channel.as_str());
        place(ctx, &order.order, channel, self.events.as_deref(), tx).await
    }
}

/// The `orders.order-cancelled.v1` route: releases the order's reservation once.
///
/// A cancellation claims the business key `cancel:<order id>`, so a republished one is a
/// duplicate. One that arrives before its order finds nothing to release: a transient failure,
/// retried until the order is there; one whose order never comes ends in the dead-letter queue
/// at the entity's max delivery count, where an operator sees it. Service Bus guarantees
/// first-in, first-out only within a session
/// (<https://learn.microsoft.com/azure/service-bus-messaging/message-sessions>, "First-in,
/// first out (FIFO) pattern"), and a redelivered order comes after newer messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct CancelOrder;

impl<T: InventoryTx> JsonHandler<T> for CancelOrder {
    type Message = OrderCancelled;

    async fn handle(
        &self,
        ctx: &Context<'_, OrderCancelled>,
        cancelled: &OrderCancelled,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        tx.claim_business_key(
            ctx.consumer.as_str(),
            &format!("cancel:{}", cancelled.order_id),
            ctx.logical_id(),
        )
        .await?;
        if !tx.release_reservation(&cancelled.order_id).await? {
            return Err(HandlerError::transient(
                "the order has no reservation (yet): the cancellation is retried",
            ));
        }
        Ok(Handled::Processed)
    }
}

/// The reference consumer as `sb-inbox run` hosts it, one [`Router`] for every contract of
/// the `orders` entity:
///
/// | contract | route |
/// |---|---|
/// | `orders.order-placed.v2` | [`PlaceOrder`]: reserve |
/// | `orders.order-placed.v1` | upcast to v2 ([`OrderPlacedV2::from`], channel [`UNKNOWN_CHANNEL`]), then [`PlaceOrder`] |
/// | `orders.order-cancelled.v1` | [`CancelOrder`]: release |
///
/// With `events`, each reservation also writes [`EVENT_CONTRACT`] for that destination.
///
/// # Errors
/// [`RouterError`] if the routes overlap (they do not: a test builds it).
pub fn router<T: InventoryTx + 'static>(events: Option<&str>) -> Result<Router<T>, RouterError> {
    Router::builder()
        .json(PlaceOrder {
            events: events.map(str::to_owned),
        })
        .upcast(|v1: OrderPlaced| Ok(OrderPlacedV2::from(v1)))
        .json(CancelOrder)
        .build()
}
