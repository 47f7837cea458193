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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;

    // open{container-id="c1", hostname=null, max-frame-size=65536, channel-max=255,
    //      idle-time-out=30000}
    const BYTES: &[u8] = &[
        0x00, 0x53, 0x10, 0xc0, 19, 5, 0xa1, 2, b'c', b'1', 0x40, 0x70, 0, 1, 0, 0, 0x60, 0, 0xff,
        0x70, 0, 0, 0x75, 0x30,
    ];

    #[test]
    fn decodes_spec_bytes() {
        let o = decode(BYTES).unwrap();
        assert_eq!(o.container_id, "c1");
        assert_eq!(o.hostname, None);
        assert_eq!(o.max_frame_size.0, 65536);
        assert_eq!(o.channel_max.0, 255);
        assert_eq!(o.idle_time_out, Some(30000));
    }

    #[test]
    fn absent_trailing_fields_take_defaults() {
        // Only container-id: max-frame-size defaults to u32::MAX, channel-max to 65535.
        let o = decode(&[0x00, 0x53, 0x10, 0xc0, 5, 1, 0xa1, 2, b'c', b'1']).unwrap();
        assert_eq!(o.max_frame_size.0, u32::MAX);
        assert_eq!(o.channel_max.0, u16::MAX);
        assert_eq!(o.idle_time_out, None);
    }

    #[test]
    fn encode_round_trip() {
        let o = decode(BYTES).unwrap();
        let b = roundtrip(o.into());
        assert_eq!(&b[..3], &[0x00, 0x53, 0x10]);
    }
}
