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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;

    // transfer{handle=0, delivery-id=7, delivery-tag=b"ab", message-format=0, settled=true,
    //          more=false}
    const BYTES: &[u8] = &[
        0x00, 0x53, 0x14, 0xc0, 11, 6, 0x43, 0x52, 7, 0xa0, 2, b'a', b'b', 0x43, 0x41, 0x42,
    ];

    #[test]
    fn decodes_spec_bytes() {
        let t = decode(BYTES).unwrap();
        assert_eq!(t.handle.0, 0);
        assert_eq!(t.delivery_id, Some(7));
        assert_eq!(
            t.delivery_tag.as_ref().map(|b| b.as_slice()),
            Some(&b"ab"[..])
        );
        assert_eq!(t.message_format, Some(0));
        assert_eq!(t.settled, Some(true));
        assert!(!t.more);
    }

    #[test]
    fn payload_follows_performative_in_frame() {
        use crate::frame::{Frame, FrameBody};
        let mut b = bytes::BytesMut::new();
        let body_len = BYTES.len() + 3;
        b.extend_from_slice(&((8 + body_len) as u32).to_be_bytes());
        b.extend_from_slice(&[2, 0, 0, 1]);
        b.extend_from_slice(BYTES);
        b.extend_from_slice(b"xyz");
        let f = Frame::parse(&mut b, 1024).unwrap().unwrap();
        assert_eq!(f.channel, 1);
        match f.body {
            FrameBody::Amqp(p, payload) => {
                assert!(matches!(*p, Performative::Transfer(_)));
                assert_eq!(&payload[..], b"xyz");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn encode_round_trip() {
        let t = decode(BYTES).unwrap();
        let b = roundtrip(t.into());
        assert_eq!(&b[..3], &[0x00, 0x53, 0x14]);
    }
}
