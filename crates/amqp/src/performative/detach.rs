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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::AmqpError;
    use crate::performative::roundtrip;

    // detach{handle=2, closed=true, error{condition=amqp:not-found}}
    const BYTES: &[u8] = &[
        0x00, 0x53, 0x16, 0xc0, 26, 3, 0x52, 2, 0x41, 0x00, 0x53, 0x1d, 0xc0, 17, 1, 0xa3, 14,
        b'a', b'm', b'q', b'p', b':', b'n', b'o', b't', b'-', b'f', b'o', b'u', b'n', b'd',
    ];

    #[test]
    fn decodes_spec_bytes() {
        let d = decode(BYTES).unwrap();
        assert_eq!(d.handle.0, 2);
        assert!(d.closed);
        let e: AmqpError = d.error.unwrap().into();
        assert_eq!(e.condition, "amqp:not-found");
    }

    #[test]
    fn encode_round_trip() {
        let d = decode(BYTES).unwrap();
        let b = roundtrip(d.into());
        assert_eq!(&b[..3], &[0x00, 0x53, 0x16]);
    }
}
