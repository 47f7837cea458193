//! The shipping consumer: for each placed order it asks an external shipping API for a shipment
//! and records the shipment in the same transaction as the inbox row.
//!
//! The API call is not part of the transaction. A rollback, a lost lock or a crash after the call
//! and before the commit brings the message back, and the handler calls again; the API recognises
//! the repeat because every attempt sends the same `Idempotency-Key`. The key comes from
//! [`Context::business_idempotency_key`] on the order id rather than from the message id, so a
//! republished order (another message id, the same order) is recognised by the API too, even when
//! the first message crashed after its call and never committed its business key.

use sb_inbox::{
    Context, Contract, DecodeError, Handled, Handler, HandlerError, IdempotencyKey, PgTx, SqliteTx,
    StoreError, Tx,
};
use sb_inbox_cli::inventory::OrderPlaced;

/// The consumer name: half of the inbox key, and part of every idempotency key it sends.
pub(crate) const CONSUMER: &str = "shipping.order-placed.v1";

/// The scope of the one API call this consumer makes.
pub(crate) const SCOPE: &str = "create-shipment";

/// The shipment table (PostgreSQL and SQLite share the statement).
pub(crate) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS shipping_shipment (
    order_id TEXT NOT NULL CONSTRAINT pk_shipping_shipment PRIMARY KEY,
    shipment_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL)";

/// The shipping API's client.
#[derive(Debug, Clone)]
pub(crate) struct ShippingApi {
    base: String,
    http: reqwest::Client,
}

impl ShippingApi {
    /// A client for the API at `base` (`http://host:port`).
    ///
    /// # Errors
    /// When the HTTP client cannot be built (no TLS provider installed).
    pub(crate) fn new(base: impl Into<String>) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .build()?;
        Ok(ShippingApi {
            base: base.into(),
            http,
        })
    }

    /// `POST /shipments` with the key; the shipment id the API answers.
    ///
    /// # Errors
    /// Transient for a broken connection, a timeout, 409 (the same key in flight), 429 and 5xx;
    /// permanent (`HandlerRejected`) for any other refusal, which no retry can change.
    pub(crate) async fn create_shipment(
        &self,
        key: &IdempotencyKey,
        order: &OrderPlaced,
    ) -> Result<String, HandlerError> {
        let body = serde_json::json!({ "orderId": order.order_id, "lines": order.lines.len() });
        let response = self
            .http
            .post(format!("{}/shipments", self.base))
            .header("Idempotency-Key", key.as_str())
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(HandlerError::transient)?; // the source names the URL and the cause
        let status = response.status();
        if status.as_u16() == 409 || status.as_u16() == 429 || status.is_server_error() {
            return Err(HandlerError::transient(format!(
                "shipping API answered {status}"
            )));
        }
        if !status.is_success() {
            return Err(HandlerError::rejected(format!(
                "shipping API refused the order: {status}"
            )));
        }
        let bytes = response.bytes().await.map_err(HandlerError::transient)?;
        // `?` keeps the serde_json error as the source, transient (see `HandlerError`).
        let answer: serde_json::Value = serde_json::from_slice(&bytes)?;
        answer["shipmentId"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| HandlerError::transient("shipping API answer has no shipmentId"))
    }
}

/// The shipment row, for each store this example runs on.
pub(crate) trait ShipmentTx: Tx {
    /// Records the shipment of `order_id`.
    fn record_shipment(
        &mut self,
        order_id: &str,
        shipment_id: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

const INSERT_PG: &str =
    "INSERT INTO shipping_shipment (order_id, shipment_id, idempotency_key) VALUES ($1, $2, $3)";
const INSERT_SQLITE: &str =
    "INSERT INTO shipping_shipment (order_id, shipment_id, idempotency_key) VALUES (?1, ?2, ?3)";

impl ShipmentTx for PgTx {
    async fn record_shipment(
        &mut self,
        order_id: &str,
        shipment_id: &str,
        key: &str,
    ) -> Result<(), StoreError> {
        self.execute(INSERT_PG, &[&order_id, &shipment_id, &key])
            .await
            .map(drop)
    }
}

impl ShipmentTx for SqliteTx {
    async fn record_shipment(
        &mut self,
        order_id: &str,
        shipment_id: &str,
        key: &str,
    ) -> Result<(), StoreError> {
        self.execute(INSERT_SQLITE, rusqlite::params![order_id, shipment_id, key])
            .map(drop)
    }
}

/// Handles `orders.order-placed.v1`: claim the order as a business key, call the API with the
/// order's idempotency key, record the shipment.
#[derive(Debug)]
pub(crate) struct ShippingConsumer {
    api: ShippingApi,
    contracts: [Contract; 1],
}

impl ShippingConsumer {
    /// A consumer calling `api`.
    pub(crate) fn new(api: ShippingApi) -> Self {
        ShippingConsumer {
            api,
            contracts: [Contract::new("orders.order-placed", 1)],
        }
    }
}

impl<T: ShipmentTx> Handler<T> for ShippingConsumer {
    type Payload = OrderPlaced;

    fn contracts(&self) -> &[Contract] {
        &self.contracts
    }

    fn decode(&self, _contract: &Contract, body: &[u8]) -> Result<OrderPlaced, DecodeError> {
        let order: OrderPlaced = serde_json::from_slice(body).map_err(|e| DecodeError::json(&e))?;
        order.validate()?;
        Ok(order)
    }

    async fn handle(
        &self,
        ctx: &Context<'_, OrderPlaced>,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let order = &ctx.payload;
        let business_key = format!("order:{}", order.order_id);
        // Claimed first: a second message for this order waits here for the first to commit or
        // roll back, so the two never call the API at the same time.
        tx.claim_business_key(ctx.consumer.as_str(), &business_key, ctx.logical_id())
            .await?;
        let key = ctx.business_idempotency_key(&business_key, SCOPE);
        let shipment_id = self.api.create_shipment(&key, order).await?;
        tx.record_shipment(&order.order_id, &shipment_id, key.as_str())
            .await?;
        Ok(Handled::Processed)
    }
}
