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

mod sql;

use std::future::Future;

use serde::{Deserialize, Serialize};

use sb_inbox::{
    Context, Contract, DecodeError, Handled, Handler, HandlerError, JsonContract, OutboxMessage,
    Store, StoreError, Tx,
};

/// The consumer name.
pub const CONSUMER: &str = "inventory.order-placed.v1";
/// The contract consumed.
pub const CONTRACT: &str = "orders.order-placed.v1";

/// The event written to the outbox for each reservation.
pub const EVENT_CONTRACT: &str = "inventory.stock-reserved.v1";

/// `inventory.stock-reserved.v1`: the stock of an order is reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StockReserved {
    /// The order.
    pub order_id: String,
    /// What was reserved.
    pub lines: Vec<OrderLine>,
}

/// `orders.order-placed.v1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// The inventory schema's migration (`sql/<provider>/0002_inventory.sql`). It keeps version 2,
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
        let order = &ctx.payload;
        tx.claim_business_key(
            ctx.consumer.as_str(),
            &format!("order:{}", order.order_id),
            ctx.logical_id(),
        )
        .await?;
        tx.reserve(ctx.logical_id(), order).await?;
        if let Some(destination) = &self.events {
            let event = StockReserved {
                order_id: order.order_id.clone(),
                lines: order.lines.clone(),
            };
            let body = serde_json::to_vec(&event).map_err(|e| {
                HandlerError::permanent(format!("cannot encode {EVENT_CONTRACT}"), e)
            })?;
            let mut message = OutboxMessage::new(destination.clone(), EVENT_CONTRACT, body);
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
}
