//! [`value_len`]: where the encoded value at the front of a slice ends, read from its
//! constructors and size prefixes alone. The frame layer splits a transfer's performative from
//! its payload with it, and the performatives' lenient decode skips values with it; it sits here,
//! below both, so neither imports the other (issue 46).

use crate::error::{Error, Result};

/// Length in bytes of the AMQP-encoded value at the front of `b`.
///
/// Used to split a transfer's performative from its payload. Walks only constructors and
/// size prefixes, so it is cheap and total.
///
/// # Errors
/// [`Error::Decode`] for truncated input, unknown format codes or excessive nesting.
pub fn value_len(b: &[u8]) -> Result<usize> {
    value_len_depth(b, 0)
}

fn value_len_depth(b: &[u8], depth: u8) -> Result<usize> {
    let truncated = || Error::Decode("truncated value".into());
    if depth > 16 {
        return Err(Error::Decode("descriptor nesting too deep".into()));
    }
    let code = *b.first().ok_or_else(truncated)?;
    let len = if code == 0x00 {
        let d = value_len_depth(b.get(1..).ok_or_else(truncated)?, depth + 1)?;
        let v = value_len_depth(b.get(1 + d..).ok_or_else(truncated)?, depth + 1)?;
        1 + d + v
    } else {
        match code >> 4 {
            0x4 => 1,
            0x5 => 2,
            0x6 => 3,
            0x7 => 5,
            0x8 => 9,
            0x9 => 17,
            0xa | 0xc | 0xe => 2 + *b.get(1).ok_or_else(truncated)? as usize,
            0xb | 0xd | 0xf => {
                let s = b.get(1..).and_then(<[u8]>::first_chunk::<4>);
                5 + u32::from_be_bytes(*s.ok_or_else(truncated)?) as usize
            }
            _ => return Err(Error::Decode(format!("unknown format code {code:#04x}"))),
        }
    };
    if len > b.len() {
        return Err(truncated());
    }
    Ok(len)
}
