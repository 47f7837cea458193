//! The reference consumer's transaction without a broker (begin, inbox row, business key,
//! reservation, commit): the raw PostgreSQL baseline of the e2e and retention benches.

use sb_inbox::{PgStore, Store, StoreTx, Tx};
use sb_inbox_cli::inventory::{InventoryTx, OrderPlaced};

pub(crate) const CONSUMER: &str = "inventory.order-placed.v1";

/// Applies `order` under message id `id` in one transaction.
pub(crate) async fn apply(store: &PgStore, id: &str, order: &OrderPlaced) {
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox(CONSUMER, id).await.unwrap();
    tx.claim_business_key(CONSUMER, &format!("order:{}", order.order_id), id)
        .await
        .unwrap();
    tx.reserve(id, order).await.unwrap();
    tx.commit().await.unwrap();
}
