//! `detach` performative (descriptor 0x16): detaches a link, closing it when `closed` is set.

pub use fe2o3_amqp_types::performatives::Detach;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x16;

pub(crate) fn decode(b: &[u8]) -> Result<Detach> {
    decode_as(b)
}

impl From<Detach> for Performative {
    fn from(p: Detach) -> Self {
        Performative::Detach(p)
    }
}
