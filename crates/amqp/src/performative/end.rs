//! `end` performative (descriptor 0x17): ends a session.

pub use fe2o3_amqp_types::performatives::End;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x17;

pub(crate) fn decode(b: &[u8]) -> Result<End> {
    decode_as(b)
}

impl From<End> for Performative {
    fn from(p: End) -> Self {
        Performative::End(p)
    }
}
