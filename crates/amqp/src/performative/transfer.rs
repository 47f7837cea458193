//! `transfer` performative (descriptor 0x14): one frame of a delivery; its payload follows in the frame.

pub use fe2o3_amqp_types::performatives::Transfer;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x14;

pub(crate) fn decode(b: &[u8]) -> Result<Transfer> {
    decode_as(b)
}

impl From<Transfer> for Performative {
    fn from(p: Transfer) -> Self {
        Performative::Transfer(p)
    }
}
