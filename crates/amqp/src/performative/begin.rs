//! `begin` performative (descriptor 0x11): starts a session on a channel.

pub use fe2o3_amqp_types::performatives::Begin;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x11;

pub(crate) fn decode(b: &[u8]) -> Result<Begin> {
    decode_as(b)
}

impl From<Begin> for Performative {
    fn from(p: Begin) -> Self {
        Performative::Begin(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;

    // begin{remote-channel=null, next-outgoing-id=0, incoming-window=2048, outgoing-window=255}
    const BYTES: &[u8] = &[
        0x00, 0x53, 0x11, 0xc0, 10, 4, 0x40, 0x43, 0x70, 0, 0, 8, 0, 0x52, 0xff,
    ];

    #[test]
    fn decodes_spec_bytes() {
        let b = decode(BYTES).unwrap();
        assert_eq!(b.remote_channel, None);
        assert_eq!(b.next_outgoing_id, 0);
        assert_eq!(b.incoming_window, 2048);
        assert_eq!(b.outgoing_window, 255);
    }

    #[test]
    fn encode_round_trip() {
        let mut b = decode(BYTES).unwrap();
        b.remote_channel = Some(3);
        let bytes = roundtrip(b.into());
        assert_eq!(&bytes[..3], &[0x00, 0x53, 0x11]);
    }
}
