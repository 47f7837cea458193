//! The structural check every untrusted byte slice passes before `serde_amqp` reads it.
//!
//! # Why
//! Upstream `serde_amqp` 0.18 trusts the lengths and counts it reads: `SliceReader::read_bytes`
//! allocates a wire-claimed length before looking at the bytes present (6 bytes
//! `b3 c1 c1 c1 c1 c1` asked for 3.25 GB), a `list8` of size 0 underflows `size - 1`, an odd map
//! count underflows, nesting recurses until the stack overflows, and an array of zero-width
//! elements (`null`, `true`, `list0`…) yields a count's worth of values from five bytes. Cargo
//! ignores `[patch]` outside the root manifest, so fixing the crate would not reach our
//! dependents; checking the encoding here does. Once this walk accepts a slice, every length,
//! count and nesting level the deserializer will meet is backed by bytes that are present.
//!
//! # Rules (AMQP 1.0 part 1, §1.2 "Type encodings" and §1.6 "Encoding codes")
//! - The high nibble of a format code is its subcategory: `0x4`–`0x9` fixed widths of 0, 1, 2,
//!   4, 8 and 16 bytes; `0xa`/`0xb` variable width with a 1- or 4-byte size; `0xc`/`0xd`
//!   compound (list, map) with 1- or 4-byte size and count; `0xe`/`0xf` array with 1- or 4-byte
//!   size and count and one element constructor. `0x00` starts a described value (descriptor,
//!   then value). Every other code is refused.
//! - Every size fits in the bytes present, and a compound's or array's elements fill its size
//!   exactly; the size covers the count (and an array's constructor).
//! - A list or map holds at most as many elements as it has bytes after its count (every element
//!   owns its constructor byte); a map's count is even.
//! - At most [`MAX_NESTING`] lists, maps, arrays and described values are open at once.
//! - All lists, maps and arrays together hold at most as many elements as the input has bytes.
//!   Only arrays of zero-width elements can exceed it, so a valid encoding of real data never
//!   does (the same budget the patched `serde_amqp` of issue 18 had).
//! - Arithmetic on wire numbers is checked: a claim past `usize` is a truncation.

use thiserror::Error;

/// How many lists, maps, arrays and described values may be open at once. Real AMQP data is a
/// few levels deep (a described section, its map, a list value); the deserializer recurses once
/// per level, and 96 keeps a debug build within a 2 MiB thread stack.
pub const MAX_NESTING: usize = 96;

/// Why a byte slice is not a safe AMQP 1.0 encoding. `at` is the offset of the value (or
/// field) that breaks the rule. Each is permanent: the same bytes fail the same way.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EncodingError {
    /// A size, count, fixed-width value or variable-width value runs past the bytes present.
    #[error("truncated encoding at byte {at}")]
    Truncated {
        /// Offset of the value that claims more bytes than there are.
        at: usize,
    },
    /// A format code outside every AMQP subcategory.
    #[error("unknown format code {code:#04x} at byte {at}")]
    UnknownFormatCode {
        /// The code.
        code: u8,
        /// Its offset.
        at: usize,
    },
    /// A list, map or array whose size does not cover its count (and constructor).
    #[error("size too small for its count at byte {at}")]
    SizeBelowHeader {
        /// Offset of the compound or array.
        at: usize,
    },
    /// A list, map or array claiming more elements than its bytes can hold.
    #[error("count larger than its bytes at byte {at}")]
    CountExceedsSize {
        /// Offset of the compound or array.
        at: usize,
    },
    /// A map with an odd number of keys and values.
    #[error("map with an odd count at byte {at}")]
    OddMapCount {
        /// Offset of the map.
        at: usize,
    },
    /// A list, map or array whose elements end before or after its size says.
    #[error("elements do not fill the size at byte {at}")]
    SizeMismatch {
        /// Offset of the compound or array.
        at: usize,
    },
    /// An array constructor that is described twice over (`0x00 descriptor 0x00 …`).
    #[error("nested described array constructor at byte {at}")]
    ArrayConstructor {
        /// Offset of the constructor.
        at: usize,
    },
    /// More than [`MAX_NESTING`] lists, maps, arrays or described values open at once.
    #[error("nesting deeper than {MAX_NESTING} at byte {at}")]
    TooDeep {
        /// Offset of the value one level too deep.
        at: usize,
    },
    /// More elements in all lists, maps and arrays than the input has bytes.
    #[error("more elements than input bytes at byte {at}")]
    ElementBudget {
        /// Offset of the compound or array that exceeds the budget.
        at: usize,
    },
}

/// Checks that `bytes` is a sequence of complete, bounded AMQP 1.0 values (a performative, a
/// SASL frame body, or a message's sections one after another).
///
/// # Errors
/// The first [`EncodingError`] met, walking from the front.
///
/// # Examples
/// ```
/// use sb_amqp::{EncodingError, validate_encoding};
///
/// // amqp-value section holding the string "hi".
/// assert!(validate_encoding(&[0x00, 0x53, 0x77, 0xa1, 0x02, b'h', b'i']).is_ok());
/// // A 6-byte sym32 claiming 3.25 GB.
/// assert_eq!(
///     validate_encoding(&[0xb3, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1]),
///     Err(EncodingError::Truncated { at: 0 })
/// );
/// ```
pub fn validate_encoding(bytes: &[u8]) -> Result<(), EncodingError> {
    let mut walk = Walk {
        b: bytes,
        budget: bytes.len(),
    };
    let mut pos = 0;
    while pos < bytes.len() {
        pos = walk.value(pos, bytes.len(), 0)?;
    }
    Ok(())
}

/// Width in bytes of the size and count fields of a compound or array: `0xc`/`0xe` one,
/// `0xd`/`0xf` four.
fn header_width(code: u8) -> usize {
    if code >> 4 == 0xc || code >> 4 == 0xe {
        1
    } else {
        4
    }
}

struct Walk<'a> {
    b: &'a [u8],
    /// Elements the rest of the input may still hold.
    budget: usize,
}

impl Walk<'_> {
    /// Walks one value (constructor and data) starting at `pos`, which must end by `end`.
    /// Returns the offset after it.
    fn value(&mut self, pos: usize, end: usize, depth: usize) -> Result<usize, EncodingError> {
        let code = self.byte(pos, end)?;
        if code == 0x00 {
            let inner = depth + 1;
            if inner > MAX_NESTING {
                return Err(EncodingError::TooDeep { at: pos });
            }
            let after_descriptor = self.value(pos + 1, end, inner)?;
            return self.value(after_descriptor, end, inner);
        }
        self.data(code, pos, pos + 1, end, depth)
    }

    /// Walks the data of a value whose constructor `code` (at `at`) was already read; the data
    /// starts at `pos`. Array elements come here directly: they share one constructor.
    fn data(
        &mut self,
        code: u8,
        at: usize,
        pos: usize,
        end: usize,
        depth: usize,
    ) -> Result<usize, EncodingError> {
        match code >> 4 {
            0x4 => Ok(pos),
            0x5 => self.skip(at, pos, 1, end),
            0x6 => self.skip(at, pos, 2, end),
            0x7 => self.skip(at, pos, 4, end),
            0x8 => self.skip(at, pos, 8, end),
            0x9 => self.skip(at, pos, 16, end),
            0xa | 0xb => {
                let width = if code >> 4 == 0xa { 1 } else { 4 };
                let size = self.number(at, pos, width, end)?;
                self.skip(at, pos + width, size, end)
            }
            0xc | 0xd => self.compound(code, at, pos, end, depth + 1),
            0xe | 0xf => self.array(code, at, pos, end, depth + 1),
            _ => Err(EncodingError::UnknownFormatCode { code, at }),
        }
    }

    /// A list or map: size, count, then `count` complete values filling the size.
    fn compound(
        &mut self,
        code: u8,
        at: usize,
        pos: usize,
        end: usize,
        depth: usize,
    ) -> Result<usize, EncodingError> {
        if depth > MAX_NESTING {
            return Err(EncodingError::TooDeep { at });
        }
        let width = header_width(code);
        let (count, mut cursor, body_end) = self.sized_header(at, pos, width, end)?;
        if count > body_end - cursor {
            return Err(EncodingError::CountExceedsSize { at });
        }
        // Only the two map codes of §1.6.23–24; other `0xc`/`0xd` codes decode as lists.
        if (code == 0xc1 || code == 0xd1) && count % 2 != 0 {
            return Err(EncodingError::OddMapCount { at });
        }
        self.spend(count, at)?;
        for _ in 0..count {
            cursor = self.value(cursor, body_end, depth)?;
        }
        if cursor != body_end {
            return Err(EncodingError::SizeMismatch { at });
        }
        Ok(body_end)
    }

    /// An array: size, count, one element constructor, then `count` element data without
    /// constructors, filling the size.
    fn array(
        &mut self,
        code: u8,
        at: usize,
        pos: usize,
        end: usize,
        depth: usize,
    ) -> Result<usize, EncodingError> {
        if depth > MAX_NESTING {
            return Err(EncodingError::TooDeep { at });
        }
        let width = header_width(code);
        let (count, mut cursor, body_end) = self.sized_header(at, pos, width, end)?;
        if cursor >= body_end {
            // The size covers the count but not the element constructor.
            return Err(EncodingError::SizeBelowHeader { at });
        }
        let constructor_at = cursor;
        let mut element = self.byte(cursor, body_end)?;
        cursor += 1;
        let mut element_depth = depth;
        if element == 0x00 {
            element_depth += 1;
            if element_depth > MAX_NESTING {
                return Err(EncodingError::TooDeep { at: constructor_at });
            }
            cursor = self.value(cursor, body_end, element_depth)?;
            element = self.byte(cursor, body_end)?;
            if element == 0x00 {
                return Err(EncodingError::ArrayConstructor { at: cursor });
            }
            cursor += 1;
        }
        // Checked even when the count is 0, when no element would reach `data`.
        if element >> 4 < 0x4 {
            return Err(EncodingError::UnknownFormatCode {
                code: element,
                at: cursor - 1,
            });
        }
        // Zero-width elements own no bytes: only the budget bounds their count.
        if element >> 4 != 0x4 && count > body_end - cursor {
            return Err(EncodingError::CountExceedsSize { at });
        }
        self.spend(count, at)?;
        for _ in 0..count {
            cursor = self.data(element, constructor_at, cursor, body_end, element_depth)?;
        }
        if cursor != body_end {
            return Err(EncodingError::SizeMismatch { at });
        }
        Ok(body_end)
    }

    /// Reads the size and count of a compound or array whose size field starts at `pos`.
    /// Returns the count, the offset after the count and the offset where the size ends.
    fn sized_header(
        &self,
        at: usize,
        pos: usize,
        width: usize,
        end: usize,
    ) -> Result<(usize, usize, usize), EncodingError> {
        let size = self.number(at, pos, width, end)?;
        let body = pos + width;
        let body_end = body
            .checked_add(size)
            .filter(|e| *e <= end)
            .ok_or(EncodingError::Truncated { at })?;
        if size < width {
            return Err(EncodingError::SizeBelowHeader { at });
        }
        let count = self.number(at, body, width, body_end)?;
        Ok((count, body + width, body_end))
    }

    fn spend(&mut self, count: usize, at: usize) -> Result<(), EncodingError> {
        self.budget = self
            .budget
            .checked_sub(count)
            .ok_or(EncodingError::ElementBudget { at })?;
        Ok(())
    }

    fn byte(&self, pos: usize, end: usize) -> Result<u8, EncodingError> {
        if pos >= end {
            return Err(EncodingError::Truncated { at: pos });
        }
        self.b
            .get(pos)
            .copied()
            .ok_or(EncodingError::Truncated { at: pos })
    }

    /// A big-endian size or count of `width` (1 or 4) bytes at `pos`.
    fn number(
        &self,
        at: usize,
        pos: usize,
        width: usize,
        end: usize,
    ) -> Result<usize, EncodingError> {
        let field_end = self.skip(at, pos, width, end)?;
        let field = self
            .b
            .get(pos..field_end)
            .ok_or(EncodingError::Truncated { at })?;
        let value = field
            .iter()
            .fold(0u64, |n, byte| (n << 8) | u64::from(*byte));
        usize::try_from(value).map_err(|_| EncodingError::Truncated { at })
    }

    /// The offset `len` bytes after `pos`, if that is within `end`.
    fn skip(&self, at: usize, pos: usize, len: usize, end: usize) -> Result<usize, EncodingError> {
        pos.checked_add(len)
            .filter(|e| *e <= end)
            .ok_or(EncodingError::Truncated { at })
    }
}
