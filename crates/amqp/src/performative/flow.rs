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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;

    // flow{next-incoming-id=0, incoming-window=2048, next-outgoing-id=0, outgoing-window=2048,
    //      handle=1, delivery-count=5, link-credit=10, available=null, drain=true}
    const BYTES: &[u8] = &[
        0x00, 0x53, 0x13, 0xc0, 21, 9, 0x43, 0x70, 0, 0, 8, 0, 0x43, 0x70, 0, 0, 8, 0, 0x52, 1,
        0x52, 5, 0x52, 10, 0x40, 0x41,
    ];

    #[test]
    fn decodes_spec_bytes() {
        let f = decode(BYTES).unwrap();
        assert_eq!(f.next_incoming_id, Some(0));
        assert_eq!(f.incoming_window, 2048);
        assert_eq!(f.handle.map(|h| h.0), Some(1));
        assert_eq!(f.delivery_count, Some(5));
        assert_eq!(f.link_credit, Some(10));
        assert_eq!(f.available, None);
        assert!(f.drain);
        assert!(!f.echo);
    }

    #[test]
    fn encode_round_trip() {
        let f = decode(BYTES).unwrap();
        let b = roundtrip(f.into());
        assert_eq!(&b[..3], &[0x00, 0x53, 0x13]);
    }
}
