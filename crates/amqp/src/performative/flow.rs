//! `flow` performative (descriptor 0x13): session windows and link credit.

pub use fe2o3_amqp_types::performatives::Flow;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x13;

pub(crate) fn decode(b: &[u8]) -> Result<Flow> {
    decode_as(b)
}

impl From<Flow> for Performative {
    fn from(p: Flow) -> Self {
        Performative::Flow(p)
    }
}
