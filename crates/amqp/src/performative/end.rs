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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;

    #[test]
    fn decodes_list0_and_empty_list8() {
        assert_eq!(decode(&[0x00, 0x53, 0x17, 0x45]).unwrap().error, None);
        assert_eq!(decode(&[0x00, 0x53, 0x17, 0xc0, 1, 0]).unwrap().error, None);
    }

    #[test]
    fn encodes_compactly() {
        let b = roundtrip(End { error: None }.into());
        assert_eq!(b, vec![0x00, 0x53, 0x17, 0x45]);
    }
}
