//! The `$cbs` node: `put-token` validates a shared access signature (or accepts a JWT when
//! told to) and grants its audience to the connection.

use std::time::SystemTime;

use sb_amqp::AnyMessage;
use sb_amqp::codec::Value;
use sb_amqp::servicebus::cbs;
use sb_amqp::servicebus::management::status;
use sb_amqp::types::messaging::{AmqpValue, Body};

use super::Reply;
use super::body::app_text;
use crate::Rights;
use crate::sas;
use crate::server::{ConnState, EmulatorOptions};

/// Answers a `put-token` request.
pub(crate) fn put_token(
    request: &AnyMessage,
    options: &EmulatorOptions,
    state: &ConnState,
) -> Reply {
    let token = match &request.body {
        Body::Value(AmqpValue(Value::String(token))) => token.clone(),
        _ => {
            return Reply::new(
                status::BAD_REQUEST,
                "put-token needs a string token body",
                None,
            );
        }
    };
    let name = app_text(request, cbs::request::NAME).unwrap_or_default();
    // Python puts SAS tokens with type `jwt` too: the token's form decides.
    if !token.starts_with(sas::SAS_PREFIX) {
        if options.accept_jwt {
            // Entra ID roles are not modelled: a JWT may do everything.
            state.grants.grant(&name, None, Rights::ALL);
            return Reply::accepted();
        }
        return Reply::new(
            status::UNAUTHORIZED,
            "JWTs are not accepted by this emulator",
            None,
        );
    }
    let key_name = sas::key_name(&token).unwrap_or_default();
    let Some((key, rights)) = options.key(&key_name) else {
        tracing::info!(%name, "Token refused: unknown key name.");
        return Reply::new(status::UNAUTHORIZED, "Unauthorized: unknown key name", None);
    };
    match sas::verify(&token, &key_name, key, SystemTime::now()) {
        Ok(audience) => {
            state.grants.grant(&audience, sas::expiry(&token), rights);
            Reply::accepted()
        }
        Err(error) => {
            tracing::info!(%name, %error, "Token refused.");
            Reply::new(status::UNAUTHORIZED, format!("Unauthorized: {error}"), None)
        }
    }
}
