//! Request/response nodes: `$cbs` and `<entity>/$management`.
//!
//! # Layout
//! - this file: [`Node`], the node links (requests in, replies routed to the client's reply
//!   link), the rights check.
//! - `cbs`: `put-token`.
//! - `management`: `$management` requests parsed into a command, then applied to the entity.
//! - `reply`: [`Reply`] and reply bodies.
//! - `body`: reading request properties and map bodies.

mod body;
mod cbs;
mod management;
mod reply;

use std::sync::Arc;

use sb_amqp::servicebus::{cbs as cbs_names, management as management_names};
use sb_amqp::types::definitions::ReceiverSettleMode;
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message, Properties};
use sb_amqp::types::primitives::SimpleValue;
use sb_amqp::{AnyMessage, LinkAnswer, LinkRequest, Sendable, condition};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{ConnState, EmulatorOptions};
use crate::address::link_path;
use crate::{Broker, Right};
pub(crate) use reply::{Reply, map};

/// Which node a link serves.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Cbs,
    Management(String),
}

/// The largest `$cbs` request taken. A put-token request is one token string plus four short
/// application properties (Python `azure/servicebus/_pyamqp/cbs.py`, `_put_token`: body =
/// the token; `name`, `operation`, `type`, `expiration`): a SAS token is a few hundred bytes and
/// an Entra access token (a JWT) a few kilobytes, so 64 KiB leaves room without letting a peer
/// make us buffer more.
pub(crate) const CBS_MAX_REQUEST_SIZE: u64 = 64 * 1024;

/// The least `$management` request bound. Requests are small maps (lock tokens, sequence
/// numbers, a disposition) except `schedule-message`, whose body carries whole encoded messages
/// (Python `azure/servicebus/_servicebus_sender.py`, `_build_schedule_request`: one
/// `message: binary` per scheduled message): the bound is this or the entity's own message
/// bound, whichever is larger.
pub(crate) const MANAGEMENT_MIN_REQUEST_SIZE: u64 = 1024 * 1024;

impl Node {
    /// The largest request this node's request link takes (its `max-message-size`); the engine
    /// detaches a link whose delivery passes it with `amqp:link:message-size-exceeded`.
    pub(crate) fn max_request_size(&self, broker: &Broker) -> u64 {
        match self {
            Node::Cbs => CBS_MAX_REQUEST_SIZE,
            Node::Management(entity) => broker
                .entity(entity)
                .map(|e| {
                    u64::try_from(e.max_message_size())
                        .unwrap_or(u64::MAX)
                        .saturating_add(super::codec::BATCH_ENVELOPE_ALLOWANCE)
                })
                .unwrap_or(0)
                .max(MANAGEMENT_MIN_REQUEST_SIZE),
        }
    }

    fn key(&self) -> String {
        match self {
            Node::Cbs => format!("node:{}", cbs_names::NODE),
            Node::Management(entity) => format!(
                "node:{}/{}",
                entity.to_ascii_lowercase(),
                management_names::NODE_SUFFIX
            ),
        }
    }
}

/// Serves one node link: the client's reply link (replies go out on it), or its request link
/// (each request answered concurrently).
pub(crate) async fn serve(
    request: LinkRequest,
    node: Node,
    broker: Broker,
    options: Arc<EmulatorOptions>,
    state: Arc<ConnState>,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    tracing::debug!(node = node.key(), link = request.name(), peer_sender = request.is_peer_sender(), target = ?request.target_address(), "Node link.");
    if !request.is_peer_sender() {
        return serve_replies(request, &node, &state, stop).await;
    }
    let receiver = request
        .accept_receiver(
            LinkAnswer::default()
                .credit(100)
                .max_message_size(node.max_request_size(&broker))
                .rcv_settle_mode(ReceiverSettleMode::First),
        )
        .await?;
    // Requests are answered concurrently: one slow operation (an injected disposition delay)
    // must not hold the others, and clients keep many requests in flight on one link (the
    // SDKs match replies by correlation id).
    let mut in_flight = JoinSet::new();
    loop {
        let delivery = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => continue,
            delivery = receiver.recv() => delivery?,
        };
        // Python's AutoLockRenewer renews from several threads over one connection, and
        // pyamqp then can give two transfers the same delivery id: the second cannot be
        // accepted any more, but its request is still answered.
        if let Err(error) = receiver.accept(&delivery).await {
            tracing::debug!(node = node.key(), %error, "Request delivery not accepted; answering it anyway.");
        }
        let request = delivery.message()?;
        let (node, broker, options, state) =
            (node.clone(), broker.clone(), options.clone(), state.clone());
        in_flight.spawn(async move { respond(&request, &node, &broker, &options, &state).await });
    }
}

/// The client's reply link: register it, then forward replies, pre-settled (Python never
/// settles them and an unsettled reply deadlocks it).
async fn serve_replies(
    request: LinkRequest,
    node: &Node,
    state: &ConnState,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    let keys = [
        request.target_address().map(str::to_owned),
        Some(request.name().to_owned()),
        Some(node.key()),
    ];
    // Register the route before answering the attach: the client may send its first request
    // as soon as it sees our attach, and its reply must find this link.
    let (tx, mut rx) = mpsc::unbounded_channel::<AnyMessage>();
    if let Ok(mut replies) = state.replies.lock() {
        for key in keys.into_iter().flatten() {
            replies.insert(key, tx.clone());
        }
    }
    let sender = request
        .accept_sender(LinkAnswer::default().initial_delivery_count(0))
        .await?;
    loop {
        let reply = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            reply = rx.recv() => reply,
        };
        let Some(reply) = reply else { return Ok(()) };
        sender.send_settled(Sendable::message(&reply)?).await?;
    }
}

/// Answers one request and routes its reply to the client's reply link.
async fn respond(
    request: &AnyMessage,
    node: &Node,
    broker: &Broker,
    options: &EmulatorOptions,
    state: &ConnState,
) {
    tracing::debug!(node = node.key(), reply_to = ?request.properties.as_ref().and_then(|p| p.reply_to.clone()), "Node request.");
    if let Node::Management(entity) = node {
        state.requests.record(super::ManagementRequest {
            entity: entity.clone(),
            operation: body::app_text(request, management_names::request::OPERATION)
                .unwrap_or_default(),
            associated_link: body::app_text(
                request,
                management_names::request::ASSOCIATED_LINK_NAME,
            ),
        });
    }
    let injected = match node {
        Node::Management(_) => state.survival.node_fault(),
        Node::Cbs => None,
    };
    let reply = match injected {
        None => answer(request, node, broker, options, state).await,
        Some(crate::ManagementFault::Status(status)) => fault_reply(status),
        Some(_) => {
            // Stalled: the request was accepted and is never answered; the client's own
            // timeout ends its wait.
            tracing::info!(
                node = node.key(),
                "Fault: leaving a $management request unanswered."
            );
            return;
        }
    };
    tracing::debug!(node = node.key(), status = reply.status, description = %reply.description, "Node reply.");
    let properties = request.properties.clone().unwrap_or_default();
    let reply = reply_message(node, reply, properties.message_id.clone());
    let mut keys = Vec::new();
    if let Some(reply_to) = &properties.reply_to {
        keys.push(reply_to.clone());
        keys.push(link_path(reply_to));
    }
    keys.push(node.key());
    match state.route(&keys) {
        Some(tx) => {
            // The reply link closing meanwhile is the client going away: nobody to answer.
            let _ = tx.send(reply);
        }
        None => tracing::debug!(?keys, "No reply link for a request."),
    }
}

/// The reply as a message: status properties as `node` spells them, correlated with the
/// request's message id.
fn reply_message(
    node: &Node,
    reply: Reply,
    correlation_id: Option<sb_amqp::types::messaging::MessageId>,
) -> AnyMessage {
    let mut app = ApplicationProperties::builder();
    app = match node {
        Node::Cbs => app
            .insert(
                cbs_names::reply::STATUS_CODE,
                SimpleValue::Int(reply.status),
            )
            .insert(
                cbs_names::reply::STATUS_DESCRIPTION,
                SimpleValue::String(reply.description),
            ),
        Node::Management(_) => {
            let mut app = app
                .insert(
                    management_names::reply::STATUS_CODE,
                    SimpleValue::Int(reply.status),
                )
                .insert(
                    management_names::reply::STATUS_DESCRIPTION,
                    SimpleValue::String(reply.description),
                );
            if let Some(condition) = reply.condition {
                app = app.insert(
                    management_names::reply::ERROR_CONDITION,
                    SimpleValue::Symbol(condition.into()),
                );
            }
            app
        }
    };
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            correlation_id,
            ..Properties::default()
        }),
        application_properties: Some(app.build()),
        body: reply
            .body
            .map_or(Body::Empty, |v| Body::Value(AmqpValue(v))),
        footer: None,
    }
}

/// Answers one request as `node`: everything a node does with a decoded request message.
pub(crate) async fn answer(
    request: &AnyMessage,
    node: &Node,
    broker: &Broker,
    options: &EmulatorOptions,
    state: &ConnState,
) -> Reply {
    match node {
        Node::Cbs => match state.survival.put_token_refusal().or_else(|| {
            state
                .faults
                .hit(super::Fault::CbsBusy)
                .then_some(management_names::status::SERVICE_UNAVAILABLE)
        }) {
            Some(status) => Reply::new(
                status,
                "The service is busy; please retry (injected by the emulator).",
                None,
            ),
            None => cbs::put_token(request, options, state),
        },
        // Each operation needs its own right; a token for the entity or for its `$management`
        // node covers the node.
        Node::Management(entity) => {
            let node_path = format!("{entity}/{}", management_names::NODE_SUFFIX);
            match state.grants.refusal(&node_path, operation_right(request)) {
                Some(why) => Reply::new(
                    management_names::status::UNAUTHORIZED,
                    why,
                    Some(condition::UNAUTHORIZED_ACCESS),
                ),
                None if throttled(request, state) => Reply::new(
                    management_names::status::SERVICE_UNAVAILABLE,
                    super::survival::THROTTLED,
                    Some(condition::SERVER_BUSY),
                ),
                None => management::answer(request, broker, entity).await,
            }
        }
    }
}

/// An injected `$management` answer ([`crate::Emulator::fail_management_node_requests`]): the
/// status with the condition and text the service pairs with it.
fn fault_reply(status: u16) -> Reply {
    let status = i32::from(status);
    match status {
        429 | 503 => Reply::new(
            management_names::status::SERVICE_UNAVAILABLE,
            super::survival::THROTTLED,
            Some(condition::SERVER_BUSY),
        ),
        408 => Reply::new(
            status,
            "The operation did not complete within the allotted timeout (injected by the emulator).",
            Some(condition::TIMEOUT),
        ),
        _ => Reply::new(
            status,
            "The service was unable to process the request; please retry the operation (injected by the emulator).",
            Some(condition::INTERNAL_ERROR),
        ),
    }
}

/// Whether a `$management` request meets a throttled namespace; an `update-disposition` is
/// recorded as a settlement attempt (which arms `--throttle`).
fn throttled(request: &AnyMessage, state: &ConnState) -> bool {
    use management_names::Operation;
    let operation = body::app_text(request, management_names::request::OPERATION);
    match operation.as_deref().and_then(Operation::from_name) {
        Some(Operation::UpdateDisposition) => state.survival.settlement(false),
        _ => state.survival.is_throttled(),
    }
}

/// The right a `$management` operation needs: scheduling is sending, rule changes are
/// management, everything else (peek, renew, settle, sessions, deferred) is listening.
fn operation_right(request: &AnyMessage) -> Right {
    use management_names::Operation;
    let operation = body::app_text(request, management_names::request::OPERATION);
    match operation.as_deref().and_then(Operation::from_name) {
        Some(Operation::ScheduleMessage | Operation::CancelScheduledMessage) => Right::Send,
        Some(Operation::AddRule | Operation::RemoveRule | Operation::EnumerateRules) => {
            Right::Manage
        }
        _ => Right::Listen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn node_request_bounds_fit_their_requests() {
        let json = r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[
            {"Name":"small","Properties":{}},
            {"Name":"large","Properties":{"MaxMessageSizeInKilobytes":4096}}]}]}}"#;
        let broker = Broker::new(Config::from_json(json).unwrap()).unwrap();
        let management = |entity: &str| Node::Management(entity.to_owned());
        assert_eq!(Node::Cbs.max_request_size(&broker), 64 * 1024);
        // A 256 KB queue's scheduled message fits 1 MiB; a 4 MiB queue's needs its own bound.
        assert_eq!(management("small").max_request_size(&broker), 1024 * 1024);
        assert_eq!(
            management("large").max_request_size(&broker),
            4096 * 1024 + super::super::codec::BATCH_ENVELOPE_ALLOWANCE
        );
        assert_eq!(management("nope").max_request_size(&broker), 1024 * 1024);
    }
}
