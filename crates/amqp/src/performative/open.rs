//! `open` performative (descriptor 0x10): connection parameters.

pub use fe2o3_amqp_types::performatives::Open;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x10;

pub(crate) fn decode(b: &[u8]) -> Result<Open> {
    decode_as(b)
}

impl From<Open> for Performative {
    fn from(p: Open) -> Self {
        Performative::Open(p)
    }
}
