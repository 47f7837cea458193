//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`). Not part of the
//! emulator's API: they exist so the fuzzer reaches the `$cbs` and `$management` request
//! handling without an AMQP connection in front of it.

use crate::Broker;
use crate::server::nodes::{Node, answer};
use crate::server::{ConnState, EmulatorOptions};

/// Decodes `bytes` as a request message and answers it as `$cbs` and as `<entity>/$management`
/// would; returns the two status codes, or `None` when the bytes are not a message.
pub async fn node_request(broker: &Broker, entity: &str, bytes: &[u8]) -> Option<(i32, i32)> {
    let request = sb_amqp::decode_message(bytes).ok()?;
    let options = EmulatorOptions::default();
    let state = ConnState::new(broker.clock(), None);
    // A namespace-wide grant, so requests reach the operations behind the rights check.
    state.grants.grant("", None, crate::Rights::ALL);
    let cbs = answer(&request, &Node::Cbs, broker, &options, &state)
        .await
        .status;
    let management = Node::Management(entity.to_owned());
    let management = answer(&request, &management, broker, &options, &state)
        .await
        .status;
    Some((cbs, management))
}
