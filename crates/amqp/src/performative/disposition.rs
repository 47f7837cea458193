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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;
    use fe2o3_amqp_types::definitions::Role;
    use fe2o3_amqp_types::messaging::DeliveryState;

    // disposition{role=receiver, first=3, last=5, settled=true, state=accepted}
    const BYTES: &[u8] = &[
        0x00, 0x53, 0x15, 0xc0, 11, 5, 0x41, 0x52, 3, 0x52, 5, 0x41, 0x00, 0x53, 0x24, 0x45,
    ];

    #[test]
    fn decodes_spec_bytes() {
        let d = decode(BYTES).unwrap();
        assert_eq!(d.role, Role::Receiver);
        assert_eq!((d.first, d.last), (3, Some(5)));
        assert!(d.settled);
        assert!(matches!(d.state, Some(DeliveryState::Accepted(_))));
    }

    #[test]
    fn rejected_with_lock_lost_round_trips() {
        let mut d = decode(BYTES).unwrap();
        d.state = Some(
            crate::delivery::Outcome::Rejected(Some(crate::error::AmqpError::new(
                crate::error::condition::MESSAGE_LOCK_LOST,
                None,
            )))
            .into(),
        );
        let b = roundtrip(d.into());
        let needle = b"com.microsoft:message-lock-lost";
        assert!(b.windows(needle.len()).any(|w| w == needle));
    }
}
