//! Claims-based security: put a token for an audience on the `$cbs` node.

use std::time::Duration;

use sb_amqp::servicebus::{cbs, management};
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Message};
use sb_amqp::types::primitives::SimpleValue;

use super::amqp_message::system_to_timestamp;
use super::client::ConnectionScope;
use super::{AccessToken, ServiceBusError};

/// Reads an integer application property of a reply.
pub(crate) fn int_property(message: &sb_amqp::AnyMessage, names: &[&str]) -> Option<i64> {
    let ApplicationProperties(map) = message.application_properties.as_ref()?;
    names.iter().find_map(|name| match map.get(*name)? {
        SimpleValue::Int(n) => Some(i64::from(*n)),
        SimpleValue::Long(n) => Some(*n),
        SimpleValue::Uint(n) => Some(i64::from(*n)),
        SimpleValue::Ulong(n) => i64::try_from(*n).ok(),
        SimpleValue::Short(n) => Some(i64::from(*n)),
        SimpleValue::Ushort(n) => Some(i64::from(*n)),
        _ => None,
    })
}

/// Reads a string application property of a reply.
pub(crate) fn text_property(message: &sb_amqp::AnyMessage, names: &[&str]) -> Option<String> {
    let ApplicationProperties(map) = message.application_properties.as_ref()?;
    names.iter().find_map(|name| match map.get(*name)? {
        SimpleValue::String(s) => Some(s.clone()),
        SimpleValue::Symbol(s) => Some(s.0.clone()),
        _ => None,
    })
}

/// Puts `token` for `audience` on `conn`'s `$cbs` node (attached, or re-attached, on demand).
pub(crate) async fn put_token(
    conn: &ConnectionScope,
    audience: &str,
    token: &AccessToken,
    timeout: Duration,
) -> Result<(), ServiceBusError> {
    let properties = ApplicationProperties::builder()
        .insert(
            cbs::request::OPERATION,
            SimpleValue::String(cbs::PUT_TOKEN.into()),
        )
        .insert(
            cbs::request::TYPE,
            SimpleValue::String(token.token_type.as_str().into()),
        )
        .insert(cbs::request::NAME, SimpleValue::String(audience.into()))
        .insert(
            cbs::request::EXPIRATION,
            SimpleValue::Timestamp(system_to_timestamp(token.expires_at)),
        )
        .build();
    let request = Message::builder()
        .application_properties(properties)
        .body(AmqpValue(token.token.clone()))
        .build();
    // A reply that never comes (a broker that lost it) must not hang the link set-up.
    let reply = conn
        .request(cbs::NODE, request, timeout)
        .await
        .map_err(|e| match e {
            sb_amqp::Error::Timeout => {
                ServiceBusError::Connection("$cbs did not answer put-token in time".into())
            }
            e => ServiceBusError::from_amqp(&e),
        })?;
    put_token_reply(&reply)
}

/// Reads a put-token reply: any 2xx status grants the token.
pub(crate) fn put_token_reply(reply: &sb_amqp::AnyMessage) -> Result<(), ServiceBusError> {
    let status = int_property(
        reply,
        &[cbs::reply::STATUS_CODE, management::reply::STATUS_CODE],
    )
    .unwrap_or(0);
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(ServiceBusError::Unauthorized {
            status,
            description: text_property(
                reply,
                &[
                    cbs::reply::STATUS_DESCRIPTION,
                    management::reply::STATUS_DESCRIPTION,
                ],
            )
            .unwrap_or_default(),
        })
    }
}
