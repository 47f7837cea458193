//! Reading request messages: application properties and the fields of a map body, each as
//! the type an operation needs (SDKs differ in the integer types and key types they send).

use sb_amqp::AnyMessage;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::Array;
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body};
use sb_amqp::types::primitives::SimpleValue;

use crate::Properties;
use crate::server::codec::{from_uuid, key_text, value_property};

/// An application property as text (string or symbol).
pub(crate) fn app_text(message: &AnyMessage, name: &str) -> Option<String> {
    let ApplicationProperties(map) = message.application_properties.as_ref()?;
    match map.get(name)? {
        SimpleValue::String(s) => Some(s.clone()),
        SimpleValue::Symbol(s) => Some(s.0.clone()),
        _ => None,
    }
}

/// The entry `name` of a map body (string or symbol keys).
pub(crate) fn map_get<'a>(body: &'a Body<Value>, name: &str) -> Option<&'a Value> {
    let Body::Value(AmqpValue(Value::Map(map))) = body else {
        return None;
    };
    map.iter()
        .find(|(k, _)| key_text(k) == Some(name))
        .map(|(_, v)| v)
}

/// The `amqp-value` of a body.
pub(crate) fn body_value(body: &Body<Value>) -> Option<&Value> {
    match body {
        Body::Value(AmqpValue(value)) => Some(value),
        _ => None,
    }
}

/// The items of an array or list (none for anything else).
pub(crate) fn values(value: Option<&Value>) -> Vec<Value> {
    match value {
        Some(Value::Array(Array(items))) | Some(Value::List(items)) => items.clone(),
        _ => Vec::new(),
    }
}

/// An integer (long, int or ulong) as a long.
pub(crate) fn long(value: &Value) -> Option<i64> {
    match value {
        Value::Long(n) => Some(*n),
        Value::Int(n) => Some(i64::from(*n)),
        Value::Ulong(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// The integers of an array or list, as longs.
pub(crate) fn longs(value: Option<&Value>) -> Vec<i64> {
    values(value).iter().filter_map(long).collect()
}

/// A non-negative count (`skip`, `top`, `message-count`) sent as any integer type.
pub(crate) fn count(value: Option<&Value>) -> Option<usize> {
    match value? {
        Value::Int(n) => usize::try_from(*n).ok(),
        Value::Long(n) => usize::try_from(*n).ok(),
        Value::Uint(n) => usize::try_from(*n).ok(),
        _ => None,
    }
}

/// The uuids of an array or list (lock tokens).
pub(crate) fn tokens(value: Option<&Value>) -> Vec<uuid::Uuid> {
    values(value)
        .iter()
        .filter_map(|v| match v {
            Value::Uuid(u) => Some(from_uuid(u)),
            _ => None,
        })
        .collect()
}

/// A string or symbol as text.
pub(crate) fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Symbol(s) => Some(s.0.clone()),
        _ => None,
    }
}

/// A map of application properties (`properties-to-modify`).
pub(crate) fn properties_of(value: Option<&Value>) -> Properties {
    let mut out = Properties::new();
    if let Some(Value::Map(map)) = value {
        for (key, value) in map.iter() {
            if let Some(key) = key_text(key) {
                out.insert(key.to_owned(), value_property(value));
            }
        }
    }
    out
}
