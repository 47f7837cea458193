//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`). Not part of the
//! public API: they let the fuzzer reach the client's decoding of what a broker sends without a
//! connection in front of it.

use super::amqp_message::from_amqp;
use super::cbs::put_token_reply;
use super::management::{peek_page, renew_reply};

/// Decodes `payload` as a received delivery with delivery tag `tag`, as the receiver does;
/// returns whether it decoded.
pub fn decode_delivery(payload: &[u8], tag: &[u8]) -> bool {
    match sb_amqp::decode_message(payload) {
        Ok(message) => {
            let _ = from_amqp(&message, tag);
            true
        }
        Err(_) => false,
    }
}

/// Decodes `payload` as a `$cbs` / `$management` reply and reads it as a put-token,
/// peek-message and renew-lock reply, as the client does; returns whether it decoded.
pub fn decode_reply(payload: &[u8]) -> bool {
    match sb_amqp::decode_message(payload) {
        Ok(reply) => {
            let _ = put_token_reply(&reply);
            let _ = peek_page(&reply);
            let _ = renew_reply(&reply);
            true
        }
        Err(_) => false,
    }
}
