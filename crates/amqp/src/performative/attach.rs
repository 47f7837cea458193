//! `attach` performative (descriptor 0x12): attaches a link to a session.

pub use fe2o3_amqp_types::performatives::Attach;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x12;

pub(crate) fn decode(b: &[u8]) -> Result<Attach> {
    decode_as(b)
}

impl From<Attach> for Performative {
    fn from(p: Attach) -> Self {
        Performative::Attach(p)
    }
}
