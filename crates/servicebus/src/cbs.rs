//! Claims-based security: put a token for an audience on the `$cbs` node.

use std::time::Duration;

use sb_amqp::servicebus::{cbs, condition, management};
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Message};
use sb_amqp::types::primitives::SimpleValue;

use super::amqp_message::system_to_timestamp;
use super::scope::ConnectionScope;
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

/// Reads a put-token reply: any 2xx status grants the token; 408, 500 and 503 (the service
/// busy or upgrading its gateway) are transient, as Go retries them
/// (`azservicebus/internal/errors.go` `GetRecoveryKind`: a management reply of 408, 503 or
/// 500 needs no recovery, only a retry) and .NET pairs those statuses with the conditions it
/// retries (`Microsoft.Azure.ServiceBus.Amqp.AmqpExceptionHelper.ConditionToStatusMap`:
/// timeout ↔ 408, server-busy ↔ 503). 429, 502 and 504 are transient too (N1): that `$cbs`
/// answers them is not documented, and they are what every Azure SDK pipeline retries as HTTP
/// statuses (Azure.Core `ResponseClassifier.IsRetriableResponse`: 408, 429, 500, 502, 503,
/// 504), none reads them as a refused token; a throttled 429 is the service busy (.NET
/// `ServiceBusFailureReason.ServiceBusy`). Anything else refuses the token.
pub(crate) fn put_token_reply(reply: &sb_amqp::AnyMessage) -> Result<(), ServiceBusError> {
    let status = int_property(
        reply,
        &[cbs::reply::STATUS_CODE, management::reply::STATUS_CODE],
    )
    .unwrap_or(0);
    if (200..300).contains(&status) {
        return Ok(());
    }
    let description = text_property(
        reply,
        &[
            cbs::reply::STATUS_DESCRIPTION,
            management::reply::STATUS_DESCRIPTION,
        ],
    )
    .unwrap_or_default();
    let transient = match i32::try_from(status) {
        Ok(management::status::REQUEST_TIMEOUT) => Some(condition::TIMEOUT),
        Ok(management::status::INTERNAL_SERVER_ERROR) => Some(condition::INTERNAL_ERROR),
        Ok(management::status::SERVICE_UNAVAILABLE | 429) => Some(condition::SERVER_BUSY),
        Ok(502) => Some(condition::INTERNAL_ERROR),
        Ok(504) => Some(condition::TIMEOUT),
        _ => None,
    };
    match transient {
        Some(condition) => Err(ServiceBusError::Broker {
            condition: condition.to_owned(),
            description: format!("$cbs answered put-token {status}: {description}"),
        }),
        None => Err(ServiceBusError::Unauthorized {
            status,
            description,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: i32) -> sb_amqp::AnyMessage {
        let properties = ApplicationProperties::builder()
            .insert(cbs::reply::STATUS_CODE, SimpleValue::Int(status))
            .insert(
                cbs::reply::STATUS_DESCRIPTION,
                SimpleValue::String("said the service".into()),
            )
            .build();
        Message::builder()
            .application_properties(properties)
            .body(sb_amqp::types::messaging::Body::Empty)
            .build()
    }

    #[test]
    fn busy_put_token_replies_are_transient_and_refusals_permanent() {
        assert!(put_token_reply(&reply(202)).is_ok());
        for (status, condition) in [
            (408, condition::TIMEOUT),
            (500, condition::INTERNAL_ERROR),
            (503, condition::SERVER_BUSY),
            (429, condition::SERVER_BUSY),
            (502, condition::INTERNAL_ERROR),
            (504, condition::TIMEOUT),
        ] {
            let error = put_token_reply(&reply(status)).unwrap_err();
            assert!(error.is_transient(), "{status}: {error}");
            assert!(
                matches!(&error, ServiceBusError::Broker { condition: c, .. } if c == condition),
                "{status}: {error:?}"
            );
        }
        for status in [400, 401, 403, 404] {
            let error = put_token_reply(&reply(status)).unwrap_err();
            assert!(!error.is_transient(), "{status}: {error}");
            assert!(
                matches!(error, ServiceBusError::Unauthorized { status: s, .. } if s == i64::from(status))
            );
        }
    }
}
