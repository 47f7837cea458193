//! Request/response nodes: `$cbs` and `<entity>/$management`.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::{Array, OrderedMap};
use sb_amqp::types::definitions::ReceiverSettleMode;
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message, Properties};
use sb_amqp::types::primitives::{Binary, SimpleValue};
use sb_amqp::{AnyMessage, LinkAnswer, LinkRequest, Sendable};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::codec::{self, from_uuid, key_text, to_timestamp, value_property};
use super::{ConnState, EmulatorOptions, rules, sas};
use crate::{
    Broker, DispositionStatus, Error, Properties as BrokerProperties, ReceiveMode, Right, Rights,
};

/// Which node a link serves.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Cbs,
    Management(String),
}

impl Node {
    fn key(&self) -> String {
        match self {
            Node::Cbs => "node:$cbs".into(),
            Node::Management(entity) => format!("node:{}/$management", entity.to_ascii_lowercase()),
        }
    }
}

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
        // The client's reply link: register it, then forward replies, pre-settled (Python never
        // settles them and an unsettled reply deadlocks it).
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
    let receiver = request
        .accept_receiver(
            LinkAnswer::default()
                .credit(100)
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

/// Answers one request and routes its reply to the client's reply link.
async fn respond(
    request: &AnyMessage,
    node: &Node,
    broker: &Broker,
    options: &EmulatorOptions,
    state: &ConnState,
) {
    tracing::debug!(node = node.key(), reply_to = ?request.properties.as_ref().and_then(|p| p.reply_to.clone()), "Node request.");
    let (status, description, condition, body) =
        answer(request, node, broker, options, state).await;
    tracing::debug!(node = node.key(), status, %description, "Node reply.");
    let properties = request.properties.clone().unwrap_or_default();
    let mut app = ApplicationProperties::builder();
    app = match node {
        Node::Cbs => app
            .insert("status-code", SimpleValue::Int(status))
            .insert("status-description", SimpleValue::String(description)),
        Node::Management(_) => {
            let mut app = app
                .insert("statusCode", SimpleValue::Int(status))
                .insert("statusDescription", SimpleValue::String(description));
            if let Some(condition) = condition {
                app = app.insert("errorCondition", SimpleValue::Symbol(condition.into()));
            }
            app
        }
    };
    let reply: AnyMessage = Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            correlation_id: properties.message_id.clone(),
            ..Properties::default()
        }),
        application_properties: Some(app.build()),
        body: body.map_or(Body::Empty, |v| Body::Value(AmqpValue(v))),
        footer: None,
    };
    let mut keys = Vec::new();
    if let Some(reply_to) = &properties.reply_to {
        keys.push(reply_to.clone());
        keys.push(super::connection::link_path(reply_to));
    }
    keys.push(node.key());
    match state.route(&keys) {
        Some(tx) => {
            let _ = tx.send(reply);
        }
        None => tracing::debug!(?keys, "No reply link for a request."),
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
        Node::Cbs => put_token(request, options, state),
        // Each operation needs its own right; a token for the entity or for its `$management`
        // node covers the node.
        Node::Management(entity) => {
            match state.refusal(&format!("{entity}/$management"), operation_right(request)) {
                Some(why) => (
                    401,
                    why,
                    Some(sb_amqp::condition::UNAUTHORIZED_ACCESS),
                    None,
                ),
                None => management(request, broker, entity).await,
            }
        }
    }
}

fn app_text(message: &AnyMessage, name: &str) -> Option<String> {
    let ApplicationProperties(map) = message.application_properties.as_ref()?;
    match map.get(name)? {
        SimpleValue::String(s) => Some(s.clone()),
        SimpleValue::Symbol(s) => Some(s.0.clone()),
        _ => None,
    }
}

pub(crate) type Reply = (i32, String, Option<&'static str>, Option<Value>);

/// The right a `$management` operation needs: scheduling is sending, rule changes are
/// management, everything else (peek, renew, settle, sessions, deferred) is listening.
fn operation_right(request: &AnyMessage) -> Right {
    match app_text(request, "operation").as_deref() {
        Some("com.microsoft:schedule-message" | "com.microsoft:cancel-scheduled-message") => {
            Right::Send
        }
        Some(
            "com.microsoft:add-rule"
            | "com.microsoft:remove-rule"
            | "com.microsoft:enumerate-rules",
        ) => Right::Manage,
        _ => Right::Listen,
    }
}

fn put_token(request: &AnyMessage, options: &EmulatorOptions, state: &ConnState) -> Reply {
    let token = match &request.body {
        Body::Value(AmqpValue(Value::String(token))) => token.clone(),
        _ => {
            return (
                400,
                "put-token needs a string token body".into(),
                None,
                None,
            );
        }
    };
    let name = app_text(request, "name").unwrap_or_default();
    // Python puts SAS tokens with type `jwt` too: the token's form decides.
    if !token.starts_with("SharedAccessSignature ") {
        if options.accept_jwt {
            // Entra ID roles are not modelled: a JWT may do everything.
            state.grant(&name, None, Rights::ALL);
            return (202, "Accepted".into(), None, None);
        }
        return (
            401,
            "JWTs are not accepted by this emulator".into(),
            None,
            None,
        );
    }
    let key_name = sas::key_name(&token).unwrap_or_default();
    let Some((key, rights)) = options.key(&key_name) else {
        tracing::info!(%name, "Token refused: unknown key name.");
        return (401, "Unauthorized: unknown key name".into(), None, None);
    };
    match sas::verify(&token, &key_name, key, SystemTime::now()) {
        Ok(audience) => {
            state.grant(&audience, sas::expiry(&token), rights);
            (202, "Accepted".into(), None, None)
        }
        Err(error) => {
            tracing::info!(%name, %error, "Token refused.");
            (401, format!("Unauthorized: {error}"), None, None)
        }
    }
}

pub(super) fn map_get<'a>(body: &'a Body<Value>, name: &str) -> Option<&'a Value> {
    let Body::Value(AmqpValue(Value::Map(map))) = body else {
        return None;
    };
    map.iter()
        .find(|(k, _)| key_text(k) == Some(name))
        .map(|(_, v)| v)
}

fn body_value(body: &Body<Value>) -> Option<&Value> {
    match body {
        Body::Value(AmqpValue(value)) => Some(value),
        _ => None,
    }
}

fn values(value: Option<&Value>) -> Vec<Value> {
    match value {
        Some(Value::Array(Array(items))) | Some(Value::List(items)) => items.clone(),
        _ => Vec::new(),
    }
}

fn longs(value: Option<&Value>) -> Vec<i64> {
    values(value)
        .iter()
        .filter_map(|v| match v {
            Value::Long(n) => Some(*n),
            Value::Int(n) => Some(i64::from(*n)),
            Value::Ulong(n) => i64::try_from(*n).ok(),
            _ => None,
        })
        .collect()
}

/// A non-negative count (`skip`, `top`, `message-count`) sent as any integer type.
pub(super) fn count(value: Option<&Value>) -> Option<usize> {
    match value? {
        Value::Int(n) => usize::try_from(*n).ok(),
        Value::Long(n) => usize::try_from(*n).ok(),
        Value::Uint(n) => usize::try_from(*n).ok(),
        _ => None,
    }
}

fn tokens(value: Option<&Value>) -> Vec<uuid::Uuid> {
    values(value)
        .iter()
        .filter_map(|v| match v {
            Value::Uuid(u) => Some(from_uuid(u)),
            _ => None,
        })
        .collect()
}

fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Symbol(s) => Some(s.0.clone()),
        _ => None,
    }
}

fn properties_of(value: Option<&Value>) -> BrokerProperties {
    let mut out = BrokerProperties::new();
    if let Some(Value::Map(map)) = value {
        for (key, value) in map.iter() {
            if let Some(key) = key_text(key) {
                out.insert(key.to_owned(), value_property(value));
            }
        }
    }
    out
}

pub(super) fn map(entries: Vec<(&str, Value)>) -> Value {
    let mut map = OrderedMap::new();
    for (key, value) in entries {
        map.insert(Value::String(key.into()), value);
    }
    Value::Map(map)
}

pub(super) fn error_reply(error: &Error) -> Reply {
    let status = if error.is_lock_lost() {
        410
    } else if error.is_not_found() || matches!(error, Error::MessageNotFound { .. }) {
        404
    } else if matches!(error, Error::AlreadyExists { .. }) {
        409
    } else {
        400
    };
    (status, error.to_string(), Some(error.condition()), None)
}

fn message_list(messages: &[crate::ReceivedMessage], with_lock: bool) -> Result<Value, Error> {
    let mut list = Vec::new();
    for received in messages {
        let encoded = codec::delivered(received).map_err(|e| Error::Server(e.to_string()))?;
        let mut entries = vec![("message", Value::Binary(Binary::from(encoded.to_vec())))];
        if with_lock && let Some(token) = received.lock_token {
            entries.push(("lock-token", Value::Uuid(codec::to_uuid(token))));
        }
        list.push(map(entries));
    }
    Ok(Value::List(list))
}

async fn management(request: &AnyMessage, broker: &Broker, entity: &str) -> Reply {
    let entity = match broker.entity(entity) {
        Ok(entity) => entity,
        Err(error) => return error_reply(&error),
    };
    let operation = app_text(request, "operation").unwrap_or_default();
    let body = &request.body;
    if let Some(reply) = super::sessions::management(&operation, &entity, body) {
        return reply;
    }
    let result: Result<Option<Value>, Error> =
        match operation.as_str() {
            "com.microsoft:renew-lock" => entity
                .renew_lock(&tokens(map_get(body, "lock-tokens")))
                .map(|expirations| {
                    let stamps = expirations
                        .into_iter()
                        .map(|t| Value::Timestamp(to_timestamp(t)))
                        .collect();
                    Some(map(vec![("expirations", Value::Array(Array(stamps)))]))
                }),
            "com.microsoft:peek-message" => {
                let from = longs(Some(&Value::List(vec![
                    map_get(body, "from-sequence-number")
                        .cloned()
                        .unwrap_or(Value::Long(0)),
                ])));
                let count = match map_get(body, "message-count") {
                    Some(Value::Int(n)) => usize::try_from(*n).unwrap_or(1),
                    Some(Value::Long(n)) => usize::try_from(*n).unwrap_or(1),
                    _ => 1,
                };
                match entity.peek(from.first().copied().unwrap_or(0), count) {
                    Ok(messages) if messages.is_empty() => {
                        return (204, "No Content".into(), None, None);
                    }
                    Ok(messages) => message_list(&messages, false)
                        .map(|list| Some(map(vec![("messages", list)]))),
                    Err(error) => Err(error),
                }
            }
            "com.microsoft:update-disposition" => {
                let status = text(map_get(body, "disposition-status"))
                    .and_then(|s| DispositionStatus::parse(&s));
                match status {
                    None => {
                        return (
                            400,
                            "unknown disposition-status".into(),
                            Some("amqp:invalid-field"),
                            None,
                        );
                    }
                    Some(status) => entity
                        .update_disposition(
                            status,
                            &tokens(map_get(body, "lock-tokens")),
                            text(map_get(body, "deadletter-reason")),
                            text(map_get(body, "deadletter-description")),
                            properties_of(map_get(body, "properties-to-modify")),
                        )
                        .await
                        .map(|()| None),
                }
            }
            "com.microsoft:schedule-message" => {
                let mut messages = Vec::new();
                for item in values(map_get(body, "messages")) {
                    let Value::Map(entry) = item else { continue };
                    let encoded = entry
                        .iter()
                        .find(|(k, _)| key_text(k) == Some("message"))
                        .and_then(|(_, v)| match v {
                            Value::Binary(b) => Some(Bytes::from(b.to_vec())),
                            _ => None,
                        });
                    match encoded.map(codec::broker_message) {
                        Some(Ok(message)) => messages.push(message),
                        _ => {
                            return (
                                400,
                                "schedule-message needs encoded messages".into(),
                                Some("amqp:decode-error"),
                                None,
                            );
                        }
                    }
                }
                entity.schedule(messages).map(|seqs| {
                    Some(map(vec![(
                        "sequence-numbers",
                        Value::Array(Array(seqs.into_iter().map(Value::Long).collect())),
                    )]))
                })
            }
            "com.microsoft:cancel-scheduled-message" => entity
                .cancel_scheduled(&longs(map_get(body, "sequence-numbers")))
                .map(|()| None),
            "com.microsoft:receive-by-sequence-number" => {
                let mode = match map_get(body, "receiver-settle-mode") {
                    Some(Value::Uint(0)) => ReceiveMode::ReceiveAndDelete,
                    _ => ReceiveMode::PeekLock,
                };
                match entity.receive_deferred(&longs(map_get(body, "sequence-numbers")), mode) {
                    Ok(messages) => message_list(&messages, true)
                        .map(|list| Some(map(vec![("messages", list)]))),
                    Err(error) => Err(error),
                }
            }
            "com.microsoft:add-rule" => rules::add(&entity, body_value(body)),
            "com.microsoft:remove-rule" => rules::remove(&entity, body_value(body)),
            "com.microsoft:enumerate-rules" => match rules::enumerate(&entity, body_value(body)) {
                Ok(None) => return (204, "No Content".into(), None, None),
                other => other,
            },
            other => {
                return (
                    501,
                    format!("operation {other} is not supported"),
                    Some("amqp:not-implemented"),
                    None,
                );
            }
        };
    match result {
        Ok(body) => (200, "OK".into(), None, body),
        Err(error) => error_reply(&error),
    }
}
