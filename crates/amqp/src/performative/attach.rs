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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;
    use fe2o3_amqp_types::definitions::{ReceiverSettleMode, Role, SenderSettleMode};

    // attach{name="l", handle=7, role=receiver, snd-settle-mode=unsettled,
    //        rcv-settle-mode=second, source{address="q"}}
    const BYTES: &[u8] = &[
        0x00, 0x53, 0x12, 0xc0, 20, 6, 0xa1, 1, b'l', 0x52, 7, 0x41, 0x50, 0, 0x50, 1, 0x00, 0x53,
        0x28, 0xc0, 4, 1, 0xa1, 1, b'q',
    ];

    #[test]
    fn decodes_spec_bytes() {
        let a = decode(BYTES).unwrap();
        assert_eq!(a.name, "l");
        assert_eq!(a.handle.0, 7);
        assert_eq!(a.role, Role::Receiver);
        assert_eq!(a.snd_settle_mode, SenderSettleMode::Unsettled);
        assert_eq!(a.rcv_settle_mode, ReceiverSettleMode::Second);
        assert_eq!(a.source.unwrap().address.as_deref(), Some("q"));
        assert!(a.target.is_none());
        assert_eq!(a.initial_delivery_count, None);
    }

    #[test]
    fn lenient_single_symbol_for_capability_array() {
        // Service Bus sends a bare symbol where the spec says array of symbols.
        let mut b = vec![0x00, 0x53, 0x12, 0xc0, 0, 12];
        let fields: &[u8] = &[
            0xa1, 1, b'l', 0x43, 0x42, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0xa3, 3,
            b'c', b'a', b'p',
        ];
        b[4] = (fields.len() + 1) as u8;
        b.extend_from_slice(fields);
        let a = decode(&b).unwrap();
        assert_eq!(a.offered_capabilities.unwrap().0[0].0, "cap");
    }

    #[test]
    fn encode_round_trip() {
        let a = decode(BYTES).unwrap();
        let b = roundtrip(a.into());
        assert_eq!(&b[..3], &[0x00, 0x53, 0x12]);
    }
}

#[cfg(test)]
mod lenient_keys {
    use super::*;

    #[test]
    fn string_keys_in_properties_map() {
        // properties = map{ "k" (str8, not sym8) : "v" }
        let mut fields = vec![
            0xa1, 1, b'l', 0x43, 0x42, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
        ];
        fields.extend_from_slice(&[0xc1, 7, 2, 0xa1, 1, b'k', 0xa1, 1, b'v']);
        let mut b = vec![0x00, 0x53, 0x12, 0xc0, (fields.len() + 1) as u8, 14];
        b.extend_from_slice(&fields);
        let a = decode(&b).unwrap();
        let props = a.properties.unwrap();
        assert_eq!(props.len(), 1);
    }
}
