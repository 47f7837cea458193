//! `disposition` performative (descriptor 0x15): delivery state and settlement for a range of deliveries.

pub use fe2o3_amqp_types::performatives::Disposition;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x15;

pub(crate) fn decode(b: &[u8]) -> Result<Disposition> {
    decode_as(b)
}

impl From<Disposition> for Performative {
    fn from(p: Disposition) -> Self {
        Performative::Disposition(p)
    }
}
