//! Frame layer: parses and encodes AMQP 1.0 frames. It never touches a socket.
//!
//! [`Frame::parse`] returns `Ok(None)` while it needs more bytes (the "incomplete" case),
//! and an error for bytes no valid peer would send. It never panics on any input.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use crate::decode::value_len;
use crate::error::{Error, Result};
use crate::performative::Performative;
use crate::sasl::SaslFrame;

/// Protocol header for plain AMQP (`AMQP 0 1.0.0`).
pub const AMQP_HEADER: [u8; 8] = *b"AMQP\x00\x01\x00\x00";
/// Protocol header for the SASL layer (`AMQP 3 1.0.0`).
pub const SASL_HEADER: [u8; 8] = *b"AMQP\x03\x01\x00\x00";
/// Protocol header for TLS upgrade (`AMQP 2 1.0.0`), refused by this engine.
pub const TLS_HEADER: [u8; 8] = *b"AMQP\x02\x01\x00\x00";

/// The smallest max-frame-size any peer must accept.
pub const MIN_MAX_FRAME_SIZE: u32 = 512;

const FRAME_TYPE_AMQP: u8 = 0;
const FRAME_TYPE_SASL: u8 = 1;

/// One decoded frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The channel (ignored for SASL frames).
    pub channel: u16,
    /// What the frame carries.
    pub body: FrameBody,
}

/// The body of a frame.
#[derive(Debug, Clone)]
pub enum FrameBody {
    /// A frame without a body: a heartbeat.
    Empty,
    /// An AMQP performative with the bytes that follow it (the payload of a `transfer`).
    Amqp(Box<Performative>, Bytes),
    /// A SASL frame.
    Sasl(SaslFrame),
}

impl Frame {
    /// An empty (heartbeat) frame on channel 0.
    pub fn heartbeat() -> Self {
        Frame {
            channel: 0,
            body: FrameBody::Empty,
        }
    }

    /// A performative frame without payload.
    pub fn amqp(channel: u16, p: impl Into<Performative>) -> Self {
        Frame {
            channel,
            body: FrameBody::Amqp(Box::new(p.into()), Bytes::new()),
        }
    }

    /// Parses one frame from the front of `buf`, consuming it.
    ///
    /// Returns `Ok(None)` when `buf` does not yet hold a whole frame.
    ///
    /// # Errors
    /// [`Error::Protocol`] for a frame larger than `max_frame_size` or with a bad header,
    /// [`Error::Decode`] when the body does not decode.
    pub fn parse(buf: &mut BytesMut, max_frame_size: u32) -> Result<Option<Frame>> {
        let Some(&[s0, s1, s2, s3, doff, frame_type, c0, c1]) = buf.first_chunk::<8>() else {
            return Ok(None);
        };
        let size = u32::from_be_bytes([s0, s1, s2, s3]);
        if size < 8 {
            return Err(Error::Protocol(format!("frame size {size} below 8")));
        }
        if size > max_frame_size.max(MIN_MAX_FRAME_SIZE) {
            return Err(Error::Protocol(format!(
                "frame size {size} above max-frame-size {max_frame_size}"
            )));
        }
        let size = size as usize;
        if buf.len() < size {
            buf.reserve(size - buf.len());
            return Ok(None);
        }
        let doff = usize::from(doff) * 4;
        let channel = u16::from_be_bytes([c0, c1]);
        if doff < 8 || doff > size {
            return Err(Error::Protocol(format!("bad data offset {doff}")));
        }
        let mut frame = buf.split_to(size).freeze();
        frame.advance(doff);
        let body = frame;
        let body = if body.is_empty() {
            FrameBody::Empty
        } else {
            match frame_type {
                FRAME_TYPE_AMQP => {
                    let len = value_len(&body)?;
                    let performative = body
                        .get(..len)
                        .ok_or_else(|| Error::Decode("truncated performative".into()))?;
                    let p = Performative::decode(performative)?;
                    FrameBody::Amqp(Box::new(p), body.slice(len..))
                }
                FRAME_TYPE_SASL => FrameBody::Sasl(SaslFrame::decode(&body)?),
                t => return Err(Error::Protocol(format!("unknown frame type {t}"))),
            }
        };
        Ok(Some(Frame { channel, body }))
    }

    /// Appends the encoded frame to `dst`.
    ///
    /// # Errors
    /// [`Error::Encode`] if the performative does not encode.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        let start = dst.len();
        dst.put_u32(0);
        dst.put_u8(2);
        match &self.body {
            FrameBody::Empty => {
                dst.put_u8(FRAME_TYPE_AMQP);
                dst.put_u16(self.channel);
            }
            FrameBody::Amqp(p, payload) => {
                dst.put_u8(FRAME_TYPE_AMQP);
                dst.put_u16(self.channel);
                p.encode(dst)?;
                dst.extend_from_slice(payload);
            }
            FrameBody::Sasl(s) => {
                dst.put_u8(FRAME_TYPE_SASL);
                dst.put_u16(0);
                s.encode(dst)?;
            }
        }
        let len = u32::try_from(dst.len() - start)
            .map_err(|_| Error::Encode("frame larger than 4 GiB".into()))?;
        dst[start..start + 4].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::performative::Performative;
    use fe2o3_amqp_types::performatives::Close;

    #[test]
    fn heartbeat_bytes() {
        let mut b = BytesMut::new();
        Frame::heartbeat().encode(&mut b).unwrap();
        assert_eq!(&b[..], &[0, 0, 0, 8, 2, 0, 0, 0]);
        let f = Frame::parse(&mut b, 512).unwrap().unwrap();
        assert!(matches!(f.body, FrameBody::Empty));
        assert!(b.is_empty());
    }

    #[test]
    fn close_frame_bytes_and_incomplete() {
        let mut b = BytesMut::new();
        Frame::amqp(3, Close { error: None })
            .encode(&mut b)
            .unwrap();
        // size 12, doff 2, type 0, channel 3, described(0x18) list0
        assert_eq!(&b[..], &[0, 0, 0, 12, 2, 0, 0, 3, 0x00, 0x53, 0x18, 0x45]);
        let mut part = BytesMut::from(&b[..7]);
        assert!(Frame::parse(&mut part, 512).unwrap().is_none());
        let f = Frame::parse(&mut b, 512).unwrap().unwrap();
        assert_eq!(f.channel, 3);
        assert!(matches!(f.body, FrameBody::Amqp(p, _) if matches!(*p, Performative::Close(_))));
    }

    #[test]
    fn too_large_frame_is_error() {
        let mut b = BytesMut::from(&[0u8, 0, 0x10, 0, 2, 0, 0, 0][..]);
        assert!(Frame::parse(&mut b, 1024).is_err());
    }

    #[test]
    fn value_len_walks_described_lists() {
        assert_eq!(value_len(&[0x00, 0x53, 0x18, 0x45, 0xff]).unwrap(), 4);
        assert_eq!(value_len(&[0xa1, 2, b'h', b'i']).unwrap(), 4);
        assert!(value_len(&[0xa1, 5, b'h']).is_err());
        assert!(value_len(&[0x00]).is_err());
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        /// Arbitrary bytes never panic the frame decoder: it returns a frame, asks for more
        /// bytes, or fails with an error.
        #[test]
        fn frame_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut b = BytesMut::from(&bytes[..]);
            for _ in 0..8 {
                match Frame::parse(&mut b, 4096) {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        }

        /// A valid frame header followed by arbitrary body bytes: the body decoders
        /// (performatives, SASL) never panic either.
        #[test]
        fn body_decode_never_panics(
            frame_type in 0u8..3,
            code in 0x10u8..0x19,
            body in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut full = vec![0x00, 0x53, code];
            full.extend_from_slice(&body);
            let mut b = BytesMut::new();
            b.extend_from_slice(&((8 + full.len()) as u32).to_be_bytes());
            b.extend_from_slice(&[2, frame_type, 0, 0]);
            b.extend_from_slice(&full);
            let _ = Frame::parse(&mut b, 4096);
            let _ = crate::delivery::decode_message(&body);
            let _ = crate::sasl::SaslFrame::decode(&full);
        }

        /// Described lists with arbitrary (but length-consistent) content.
        #[test]
        fn list_bodies_never_panic(
            code in 0x10u8..0x19,
            count in any::<u8>(),
            items in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut full = vec![0x00, 0x53, code, 0xc0, (items.len() + 1) as u8, count];
            full.extend_from_slice(&items);
            let _ = crate::performative::Performative::decode(&full);
        }
    }
}
