//! `sb-inbox send`: orders of the reference contract `orders.order-placed.v1`, from a JSON file
//! or generated, each with a stable message id, optionally some sent twice.

use std::collections::HashSet;
use std::path::Path;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use serde::Deserialize;

use super::OpsError;
use crate::inventory::{CONTRACT, OrderLine, OrderPlaced};
use sb_inbox::runtime::MAX_MESSAGE_ID_LEN;
use sb_inbox::{Message, Sender};

/// One order to publish under its message id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderMessage {
    /// The message id: the consumer's inbox key. Stable: the same file or seed gives the same
    /// ids, so publishing again is recognised as duplicates.
    pub message_id: String,
    /// The order.
    pub order: OrderPlaced,
}

impl OrderMessage {
    /// The message id an order gets when the file names none: `order-placed-{orderId}`.
    pub fn default_id(order_id: &str) -> String {
        format!("order-placed-{order_id}")
    }

    /// The message: subject `orders.order-placed.v1`, JSON body.
    ///
    /// # Errors
    /// [`OpsError::Input`] if the order cannot be serialised (it always can).
    pub fn to_message(&self) -> Result<Message, OpsError> {
        let body = serde_json::to_vec(&self.order)
            .map_err(|e| OpsError::Input(format!("cannot encode an order: {e}")))?;
        Ok(Message::new(&self.message_id, CONTRACT, body))
    }
}

/// An order as written in a file: the contract's fields plus an optional message id.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileOrder {
    message_id: Option<String>,
    order_id: String,
    lines: Vec<OrderLine>,
}

/// Reads and checks every order of a JSON file before anything is sent: an array of
/// `{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 2}], "messageId": "optional"}`.
///
/// # Errors
/// [`OpsError::Input`] naming the file and, for a bad order, its position and the rule broken.
pub fn orders_from_file(path: &Path) -> Result<Vec<OrderMessage>, OpsError> {
    let name = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| OpsError::Input(format!("cannot read {name}: {e}")))?;
    let orders: Vec<FileOrder> = serde_json::from_str(&text).map_err(|e| {
        OpsError::Input(format!(
            "{name} is not a JSON array of orders ({{\"orderId\", \"lines\": [{{\"sku\", \"quantity\"}}], \"messageId\"?}}): {e}"
        ))
    })?;
    if orders.is_empty() {
        return Err(OpsError::Input(format!("{name} holds no orders")));
    }
    orders
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let message_id = entry
                .message_id
                .unwrap_or_else(|| OrderMessage::default_id(&entry.order_id));
            let order = OrderMessage {
                message_id,
                order: OrderPlaced {
                    order_id: entry.order_id,
                    lines: entry.lines,
                },
            };
            check(&order).map(|()| order).map_err(|problem| {
                OpsError::Input(format!("{name}: order #{}: {problem}", index + 1))
            })
        })
        .collect()
}

/// What the consumer would refuse, said before sending.
fn check(order: &OrderMessage) -> Result<(), String> {
    let id = &order.message_id;
    if id.is_empty() || id.len() > MAX_MESSAGE_ID_LEN || id.chars().any(char::is_control) {
        return Err(format!(
            "messageId must be 1 to {MAX_MESSAGE_ID_LEN} bytes without control characters"
        ));
    }
    order.order.validate().map_err(|e| e.to_string())?;
    if let Some(line) = order
        .order
        .lines
        .iter()
        .position(|l| l.sku.is_empty() || l.quantity < 1)
    {
        return Err(format!(
            "line #{}: sku must not be empty and quantity must be at least 1",
            line + 1
        ));
    }
    Ok(())
}

/// `count` orders generated from `seed`: order ids `gen-{seed}-{i}`, 1 to 3 lines of SKU-1 to
/// SKU-20, quantities 1 to 5. The same seed gives the same orders and message ids.
pub fn generate(count: usize, seed: u64) -> Vec<OrderMessage> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let order_id = format!("gen-{seed}-{i}");
            let lines = (0..rng.random_range(1..=3))
                .map(|_| OrderLine {
                    sku: format!("SKU-{}", rng.random_range(1..=20)),
                    quantity: rng.random_range(1..=5),
                })
                .collect();
            OrderMessage {
                message_id: OrderMessage::default_id(&order_id),
                order: OrderPlaced { order_id, lines },
            }
        })
        .collect()
}

/// The messages to send: every order once, then `duplicates` of them (chosen from `seed`)
/// again under the same message id, as a producer that published twice.
///
/// # Errors
/// [`OpsError::Input`] when there are fewer orders than duplicates asked for.
pub fn with_duplicates(
    orders: &[OrderMessage],
    duplicates: usize,
    seed: u64,
) -> Result<Vec<Message>, OpsError> {
    if duplicates > orders.len() {
        return Err(OpsError::Input(format!(
            "--duplicates {duplicates} is more than the {} order(s)",
            orders.len()
        )));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut again = rand::seq::index::sample(&mut rng, orders.len(), duplicates).into_vec();
    again.sort_unstable();
    orders
        .iter()
        .chain(again.into_iter().filter_map(|i| orders.get(i)))
        .map(OrderMessage::to_message)
        .collect()
}

/// What [`publish`] sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// Messages the broker accepted.
    pub sent: usize,
    /// Distinct message ids among them.
    pub distinct: usize,
}

/// Sends `messages` to `destination` one by one, each awaited until the broker accepted it.
///
/// # Errors
/// [`OpsError::Partial`] at the first refused send, saying how many were sent before it.
pub async fn publish(
    sender: &impl Sender,
    destination: &str,
    messages: Vec<Message>,
) -> Result<Published, OpsError> {
    let total = messages.len();
    let mut ids = HashSet::new();
    for (sent, message) in messages.into_iter().enumerate() {
        let id = message.message_id.clone().unwrap_or_default();
        if let Err(error) = sender.send(destination, message, None).await {
            return Err(OpsError::Partial {
                done: sent,
                total,
                error: error.to_string(),
            });
        }
        ids.insert(id);
    }
    Ok(Published {
        sent: total,
        distinct: ids.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_stable_per_seed_and_valid() {
        let orders = generate(20, 7);
        assert_eq!(orders, generate(20, 7));
        assert_ne!(orders, generate(20, 8));
        assert_eq!(orders[3].message_id, "order-placed-gen-7-3");
        for order in &orders {
            assert_eq!(check(order), Ok(()));
        }
    }

    #[test]
    fn duplicates_repeat_distinct_orders_under_their_ids() {
        let orders = generate(10, 1);
        let messages = with_duplicates(&orders, 4, 1).unwrap();
        assert_eq!(messages.len(), 14);
        let ids: HashSet<_> = messages.iter().map(|m| m.message_id.clone()).collect();
        assert_eq!(ids.len(), 10);
        assert_eq!(messages, with_duplicates(&orders, 4, 1).unwrap());
        assert!(with_duplicates(&orders, 11, 1).is_err());
    }
}
