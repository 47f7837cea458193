//! `begin` performative (descriptor 0x11): starts a session on a channel.

pub use fe2o3_amqp_types::performatives::Begin;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x11;

pub(crate) fn decode(b: &[u8]) -> Result<Begin> {
    decode_as(b)
}

impl From<Begin> for Performative {
    fn from(p: Begin) -> Self {
        Performative::Begin(p)
    }
}
