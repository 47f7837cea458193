//! `close` performative (descriptor 0x18): closes the connection.

pub use fe2o3_amqp_types::performatives::Close;

use super::{Performative, decode_as};
use crate::error::Result;

pub(crate) const CODE: u64 = 0x18;

pub(crate) fn decode(b: &[u8]) -> Result<Close> {
    decode_as(b)
}

impl From<Close> for Performative {
    fn from(p: Close) -> Self {
        Performative::Close(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::roundtrip;

    #[test]
    fn decodes_numeric_and_symbolic_descriptors() {
        assert_eq!(decode(&[0x00, 0x53, 0x18, 0x45]).unwrap().error, None);
        let mut sym = vec![0x00, 0xa3, 15];
        sym.extend_from_slice(b"amqp:close:list");
        sym.push(0x45);
        assert!(matches!(
            Performative::decode(&sym).unwrap(),
            Performative::Close(_)
        ));
    }

    #[test]
    fn close_with_error_round_trips() {
        let e = crate::error::AmqpError::new(
            crate::error::condition::RESOURCE_LIMIT_EXCEEDED,
            Some("idle".to_string()),
        );
        let b = roundtrip(
            Close {
                error: Some(e.into()),
            }
            .into(),
        );
        assert_eq!(&b[..3], &[0x00, 0x53, 0x18]);
    }
}
