//! AMQP 1.0 performatives: one file per performative, plus the [`Performative`] enum that
//! dispatches on the descriptor.
//!
//! The field layouts come from `fe2o3-amqp-types`; this module owns the dispatch, the
//! leniency rules and the byte-level tests.

use bytes::{BufMut, BytesMut};

use crate::decode::{Wire, decode, value_len};
use crate::error::{Error, Result};

mod attach;
mod begin;
mod close;
mod detach;
mod disposition;
mod end;
mod flow;
mod open;
mod transfer;

pub use attach::Attach;
pub use begin::Begin;
pub use close::Close;
pub use detach::Detach;
pub use disposition::Disposition;
pub use end::End;
pub use flow::Flow;
pub use open::Open;
pub use transfer::Transfer;

/// One AMQP performative.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Performative {
    Open(Open),
    Begin(Begin),
    Attach(Attach),
    Flow(Flow),
    Transfer(Transfer),
    Disposition(Disposition),
    Detach(Detach),
    End(End),
    Close(Close),
}

/// Reads the descriptor of a described value: numeric code or symbolic name mapped to a code.
pub(crate) fn descriptor_code(b: &[u8]) -> Result<u64> {
    let bad = || Error::Decode("not a described value".into());
    if b.first() != Some(&0x00) {
        return Err(bad());
    }
    match b.get(1) {
        Some(0x53) => b.get(2).map(|c| u64::from(*c)).ok_or_else(bad),
        Some(0x80) => {
            let s = b.get(2..10).ok_or_else(bad)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            Ok(u64::from_be_bytes(a))
        }
        Some(0xa3) => {
            let n = *b.get(2).ok_or_else(bad)? as usize;
            let name = b.get(3..3 + n).ok_or_else(bad)?;
            symbolic_code(name).ok_or_else(bad)
        }
        Some(0xb3) => {
            let s = b.get(2..).and_then(<[u8]>::first_chunk::<4>);
            let n = u32::from_be_bytes(*s.ok_or_else(bad)?) as usize;
            let name = b.get(6..6usize.saturating_add(n)).ok_or_else(bad)?;
            symbolic_code(name).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

fn symbolic_code(name: &[u8]) -> Option<u64> {
    Some(match name {
        b"amqp:open:list" => 0x10,
        b"amqp:begin:list" => 0x11,
        b"amqp:attach:list" => 0x12,
        b"amqp:flow:list" => 0x13,
        b"amqp:transfer:list" => 0x14,
        b"amqp:disposition:list" => 0x15,
        b"amqp:detach:list" => 0x16,
        b"amqp:end:list" => 0x17,
        b"amqp:close:list" => 0x18,
        b"amqp:sasl-mechanisms:list" => 0x40,
        b"amqp:sasl-init:list" => 0x41,
        b"amqp:sasl-challenge:list" => 0x42,
        b"amqp:sasl-response:list" => 0x43,
        b"amqp:sasl-outcome:list" => 0x44,
        _ => return None,
    })
}

/// Decodes a performative body (through the bounds check of [`crate::decode`]). If the strict
/// decode fails, retries once with map keys encoded as strings turned into symbols: some peers
/// send `fields` (symbol-keyed maps) with string keys. The rewrite keeps every length, so a body
/// the bounds check refused is refused again.
pub(crate) fn decode_as<T: Wire>(b: &[u8]) -> Result<T> {
    match decode(b) {
        Ok(v) => Ok(v),
        Err(e) => {
            let mut copy = b.to_vec();
            if symbolize_map_keys(&mut copy, 0).is_some()
                && copy != b
                && let Ok(v) = decode(&copy)
            {
                return Ok(v);
            }
            Err(e)
        }
    }
}

/// Rewrites `str8`/`str32` map keys to `sym8`/`sym32` in place (same lengths), walking
/// described values, lists and maps. Returns the encoded length of the value at `b[0]`, or
/// `None` on malformed input (then nothing more is rewritten).
fn symbolize_map_keys(b: &mut [u8], depth: u8) -> Option<usize> {
    if depth > 32 {
        return None;
    }
    let code = *b.first()?;
    let (hdr, size, count) = match code {
        0x00 => {
            let d = symbolize_map_keys(b.get_mut(1..)?, depth + 1)?;
            let v = symbolize_map_keys(b.get_mut(1 + d..)?, depth + 1)?;
            return Some(1 + d + v);
        }
        0xc0 | 0xc1 => (3, *b.get(1)? as usize, *b.get(2)? as usize),
        0xd0 | 0xd1 => {
            let &[s0, s1, s2, s3, n0, n1, n2, n3] = b.get(1..)?.first_chunk::<8>()?;
            (
                9,
                u32::from_be_bytes([s0, s1, s2, s3]) as usize,
                u32::from_be_bytes([n0, n1, n2, n3]) as usize,
            )
        }
        _ => return value_len(b).ok(),
    };
    let width = if hdr == 3 { 1 } else { 4 };
    let end = 1 + width + size;
    if end > b.len() || size < width {
        return None;
    }
    let is_map = code == 0xc1 || code == 0xd1;
    let mut pos = hdr;
    for i in 0..count {
        if pos >= end {
            return None;
        }
        if is_map && i % 2 == 0 {
            match b.get_mut(pos)? {
                code @ 0xa1 => *code = 0xa3,
                code @ 0xb1 => *code = 0xb3,
                _ => {}
            }
        }
        pos += symbolize_map_keys(b.get_mut(pos..end)?, depth + 1)?;
    }
    Some(end)
}

pub(crate) fn encode_into<T: serde::Serialize>(v: &T, dst: &mut BytesMut) -> Result<()> {
    let mut w = dst.writer();
    let mut ser = serde_amqp::ser::Serializer::new(&mut w);
    v.serialize(&mut ser)
        .map_err(|e| Error::Encode(e.to_string()))
}

impl Performative {
    /// Decodes one performative (exactly the bytes of the described list).
    ///
    /// # Errors
    /// [`Error::Decode`] for unknown descriptors or malformed fields.
    pub fn decode(b: &[u8]) -> Result<Self> {
        Ok(match descriptor_code(b)? {
            open::CODE => Performative::Open(open::decode(b)?),
            begin::CODE => Performative::Begin(begin::decode(b)?),
            attach::CODE => Performative::Attach(attach::decode(b)?),
            flow::CODE => Performative::Flow(flow::decode(b)?),
            transfer::CODE => Performative::Transfer(transfer::decode(b)?),
            disposition::CODE => Performative::Disposition(disposition::decode(b)?),
            detach::CODE => Performative::Detach(detach::decode(b)?),
            end::CODE => Performative::End(end::decode(b)?),
            close::CODE => Performative::Close(close::decode(b)?),
            c => return Err(Error::Decode(format!("unknown performative {c:#x}"))),
        })
    }

    /// Appends the encoded performative to `dst`.
    ///
    /// # Errors
    /// [`Error::Encode`] if a field does not encode.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        match self {
            Performative::Open(p) => encode_into(p, dst),
            Performative::Begin(p) => encode_into(p, dst),
            Performative::Attach(p) => encode_into(p, dst),
            Performative::Flow(p) => encode_into(p, dst),
            Performative::Transfer(p) => encode_into(p, dst),
            Performative::Disposition(p) => encode_into(p, dst),
            Performative::Detach(p) => encode_into(p, dst),
            Performative::End(p) => encode_into(p, dst),
            Performative::Close(p) => encode_into(p, dst),
        }
    }

    /// The performative's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Performative::Open(_) => "open",
            Performative::Begin(_) => "begin",
            Performative::Attach(_) => "attach",
            Performative::Flow(_) => "flow",
            Performative::Transfer(_) => "transfer",
            Performative::Disposition(_) => "disposition",
            Performative::Detach(_) => "detach",
            Performative::End(_) => "end",
            Performative::Close(_) => "close",
        }
    }
}

#[cfg(test)]
pub(crate) fn roundtrip(p: Performative) -> Vec<u8> {
    let mut b = BytesMut::new();
    p.encode(&mut b).unwrap();
    assert_eq!(Performative::decode(&b).unwrap(), p);
    assert_eq!(value_len(&b).unwrap(), b.len());
    b.to_vec()
}
