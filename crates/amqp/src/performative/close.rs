//! `close` performative (descriptor 0x18): closes the connection.

pub use fe2o3_amqp_types::performatives::Close;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x18;

pub(crate) fn decode(b: &[u8]) -> Result<Close> {
    decode_as(b)
}

impl From<Close> for Performative {
    fn from(p: Close) -> Self {
        Performative::Close(p)
    }
}
