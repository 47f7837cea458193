//! Orders of the reference contract `orders.order-placed.v1`, serialised by the product's own
//! `OrderMessage` so that a test's body is byte for byte what `sb-inbox send` publishes.

use sb_inbox::Message;
use sb_inbox_cli::inventory::{OrderLine, OrderPlaced};
use sb_inbox_cli::ops::send::OrderMessage;

/// Order `order_id` under `message_id` with `lines` as `(sku, quantity)`.
pub fn order_with_lines(message_id: &str, order_id: &str, lines: &[(&str, i32)]) -> Message {
    let lines = lines
        .iter()
        .map(|&(sku, quantity)| OrderLine {
            sku: sku.to_owned(),
            quantity,
        })
        .collect();
    OrderMessage {
        message_id: message_id.to_owned(),
        order: OrderPlaced {
            order_id: order_id.to_owned(),
            lines,
        },
    }
    .to_message()
    .expect("an order serialises")
}

/// Order `order_id` under `message_id`: two units of `A`.
pub fn order(message_id: &str, order_id: &str) -> Message {
    order_with_lines(message_id, order_id, &[("A", 2)])
}

/// Order `order_id` under `message_id`: two units of `A` and one of `B` (3 units reserved).
pub fn two_line_order(message_id: &str, order_id: &str) -> Message {
    order_with_lines(message_id, order_id, &[("A", 2), ("B", 1)])
}
