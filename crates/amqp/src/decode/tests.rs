//! One test per rule of the bounds check (each passes only while its rule is in place), what
//! it must accept, and the upstream `unreachable!()` states the sealed [`Wire`] set avoids.

use super::*;
use crate::decode_message;
use crate::types::messaging::Message;
use serde_amqp::Value;
use serde_amqp::primitives::{Array, Binary, OrderedMap, SymbolRef, Timestamp, Uuid};

use EncodingError::*;

fn check(b: &[u8]) -> Result<(), EncodingError> {
    validate_encoding(b)
}

/// `n` nested `list32`s, each holding the next, around a `null`.
fn nested_lists(n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for level in 0..n {
        let size = u32::try_from(5 + 9 * (n - 1 - level)).unwrap_or(u32::MAX);
        v.push(0xd0);
        v.extend_from_slice(&size.to_be_bytes());
        v.extend_from_slice(&1u32.to_be_bytes());
    }
    v.push(0x40);
    v
}

/// `n` nested `array32`s of one element each, the innermost holding the ubyte 7.
fn nested_arrays(n: usize) -> Vec<u8> {
    let (mut constructor, mut data) = (0x50u8, vec![0x07u8]);
    for _ in 0..n {
        let mut body = 1u32.to_be_bytes().to_vec();
        body.push(constructor);
        body.extend_from_slice(&data);
        data = u32::try_from(body.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes()
            .to_vec();
        data.extend_from_slice(&body);
        constructor = 0xf0;
    }
    let mut v = vec![constructor];
    v.extend_from_slice(&data);
    v
}

#[test]
fn variable_width_size_must_fit_the_bytes_present() {
    assert_eq!(
        check(&[0xb3, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1]),
        Err(Truncated { at: 0 })
    );
    assert_eq!(check(&[0xa0, 0x03, 1, 2]), Err(Truncated { at: 0 }));
    assert_eq!(check(&[0xa0, 0x02, 1, 2]), Ok(()));
    // A size field that is itself cut off.
    assert_eq!(check(&[0xb0, 0x00, 0x00]), Err(Truncated { at: 0 }));
    // u32::MAX does not wrap anything.
    assert_eq!(
        check(&[0xb0, 0xff, 0xff, 0xff, 0xff, 0]),
        Err(Truncated { at: 0 })
    );
}

#[test]
fn fixed_width_values_must_be_whole() {
    assert_eq!(check(&[0x70, 0, 0, 1]), Err(Truncated { at: 0 }));
    assert_eq!(check(&[0x98; 16]), Err(Truncated { at: 0 }));
    assert_eq!(check(&[0x70, 0, 0, 0, 1, 0x55, 7, 0x40]), Ok(()));
}

#[test]
fn codes_outside_every_subcategory_are_refused() {
    for code in [0x01u8, 0x13, 0x2f, 0x3a] {
        assert_eq!(check(&[code, 0, 0]), Err(UnknownFormatCode { code, at: 0 }));
    }
    // As an array's element constructor, even with no elements.
    assert_eq!(
        check(&[0xe0, 0x02, 0x00, 0x20]),
        Err(UnknownFormatCode { code: 0x20, at: 3 })
    );
    // Inside a list, at its offset.
    assert_eq!(
        check(&[0xc0, 0x02, 0x01, 0x20]),
        Err(UnknownFormatCode { code: 0x20, at: 3 })
    );
}

#[test]
fn compound_size_must_cover_its_count() {
    assert_eq!(
        check(&[0xc0, 0x00, 0x01, 0x40]),
        Err(SizeBelowHeader { at: 0 })
    );
    assert_eq!(
        check(&[0xd0, 0, 0, 0, 3, 0, 0, 0, 0]),
        Err(SizeBelowHeader { at: 0 })
    );
    assert_eq!(check(&[0xc0, 0x01, 0x00]), Ok(()));
}

#[test]
fn count_is_bounded_by_the_bytes_after_it() {
    // Described list32 claiming 2^32 - 1 fields in a size of 4.
    assert_eq!(
        check(&[0x00, 0x53, 0x10, 0xd0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]),
        Err(CountExceedsSize { at: 3 })
    );
    assert_eq!(
        check(&[0xc0, 0x02, 0x05, 0x40]),
        Err(CountExceedsSize { at: 0 })
    );
    // Arrays of non-zero-width elements: one byte each at least.
    assert_eq!(
        check(&[0xe0, 0x03, 0x05, 0x50, 0x01]),
        Err(CountExceedsSize { at: 0 })
    );
}

#[test]
fn map_counts_are_even() {
    // A well-sized map8 of three items (key, value, key).
    assert_eq!(
        check(&[0xc1, 0x04, 0x03, 0x40, 0x40, 0x40]),
        Err(OddMapCount { at: 0 })
    );
    assert_eq!(
        check(&[0xd1, 0, 0, 0, 5, 0, 0, 0, 1, 0x40]),
        Err(OddMapCount { at: 0 })
    );
    assert_eq!(check(&[0xc1, 0x04, 0x02, 0xa1, 0x00, 0x40]), Ok(()));
    // The same bytes as a list are fine: only the map codes pair up.
    assert_eq!(check(&[0xc0, 0x04, 0x03, 0x40, 0x40, 0x40]), Ok(()));
}

#[test]
fn elements_fill_the_size_exactly() {
    assert_eq!(
        check(&[0xc0, 0x03, 0x01, 0x40, 0x40]),
        Err(SizeMismatch { at: 0 })
    );
    assert_eq!(
        check(&[0xe0, 0x05, 0x02, 0x50, 0x01, 0x02, 0x03]),
        Err(SizeMismatch { at: 0 })
    );
    // An element running past its list's size is cut off at the list's end.
    assert_eq!(
        check(&[0xc0, 0x03, 0x01, 0xa1, 0x02, b'h', b'i']),
        Err(Truncated { at: 3 })
    );
}

#[test]
fn an_array_has_one_constructor_for_all_its_elements() {
    assert_eq!(check(&[0xe0, 0x01, 0x01]), Err(SizeBelowHeader { at: 0 }));
    // Two sym8 elements share the one constructor 0xa3: each is size and bytes only.
    assert_eq!(
        check(&[0xe0, 0x07, 0x02, 0xa3, 0x01, b'a', 0x02, b'b', b'c']),
        Ok(())
    );
    // Elements repeating their constructor read as sizes, and overrun.
    assert_eq!(
        check(&[0xe0, 0x07, 0x02, 0xa3, 0xa3, 0x01, b'a', 0xa3, 0x01]),
        Err(Truncated { at: 3 })
    );
    // Described constructor: descriptor, then the element code.
    assert_eq!(
        check(&[0xe0, 0x07, 0x02, 0x00, 0x53, 0x01, 0x50, 7, 8]),
        Ok(())
    );
    assert_eq!(
        check(&[0xe0, 0x08, 0x01, 0x00, 0x53, 0x01, 0x00, 0x53, 0x02, 0x50]),
        Err(ArrayConstructor { at: 6 })
    );
}

#[test]
fn described_values_need_descriptor_and_value() {
    assert_eq!(check(&[0x00]), Err(Truncated { at: 1 }));
    assert_eq!(check(&[0x00, 0x53, 0x77]), Err(Truncated { at: 3 }));
    assert_eq!(check(&[0x00, 0x53, 0x77, 0x40]), Ok(()));
    assert_eq!(
        check(&[0x00, 0xa3, 0x01, b'x', 0x00, 0x53, 0x01, 0x45]),
        Ok(())
    );
}

#[test]
fn nesting_stops_at_the_bound() {
    assert_eq!(check(&nested_lists(MAX_NESTING)), Ok(()));
    assert_eq!(
        check(&nested_lists(MAX_NESTING + 1)),
        Err(TooDeep {
            at: 9 * MAX_NESTING
        })
    );
    let described = |n: usize| {
        let mut v = [0x00, 0x53, 0x77].repeat(n);
        v.push(0x40);
        v
    };
    assert_eq!(check(&described(MAX_NESTING)), Ok(()));
    assert!(matches!(
        check(&described(MAX_NESTING + 1)),
        Err(TooDeep { .. })
    ));
    // Arrays of arrays count too.
    assert_eq!(check(&nested_arrays(MAX_NESTING)), Ok(()));
    assert!(matches!(
        check(&nested_arrays(MAX_NESTING + 1)),
        Err(TooDeep { .. })
    ));
}

#[test]
fn zero_width_elements_spend_the_element_budget() {
    // Four bytes, five nulls.
    assert_eq!(
        check(&[0xe0, 0x02, 0x05, 0x40]),
        Err(ElementBudget { at: 0 })
    );
    // Ten bytes, 2^24 - 1 nulls.
    assert_eq!(
        check(&[0xf0, 0, 0, 0, 5, 0x00, 0xff, 0xff, 0xff, 0x40]),
        Err(ElementBudget { at: 0 })
    );
    // Within the budget: four nulls in four bytes.
    assert_eq!(check(&[0xe0, 0x02, 0x04, 0x40]), Ok(()));
    // The budget is shared: two arrays of three nulls in eight bytes.
    assert_eq!(
        check(&[0xe0, 0x02, 0x03, 0x40, 0xe0, 0x02, 0x03, 0x40]),
        Ok(())
    );
    assert_eq!(
        check(&[0xe0, 0x02, 0x04, 0x40, 0xe0, 0x02, 0x05, 0x40]),
        Err(ElementBudget { at: 4 })
    );
}

#[test]
fn what_the_encoder_writes_passes() {
    let mut map = OrderedMap::new();
    map.insert(
        Value::Symbol("k".into()),
        Value::List(vec![Value::Null, Value::Bool(true)]),
    );
    map.insert(
        Value::String("big".into()),
        Value::Binary(vec![7u8; 300].into()),
    );
    let value = Value::List(vec![
        Value::Map(map),
        Value::Array(Array::from(vec![
            Value::Symbol("a".into()),
            Value::Symbol("b".into()),
        ])),
        Value::Array(Array::from(vec![Value::Bool(true), Value::Bool(false)])),
        Value::Uuid(Uuid::from([3u8; 16])),
        Value::Timestamp(Timestamp::from_milliseconds(1_700_000_000_000)),
        Value::Long(-5),
        Value::Double(1.5.into()),
        Value::String("é".repeat(200)),
        Value::List(vec![]),
    ]);
    let msg = Message::builder().value(value.clone()).build();
    let bytes = crate::encode_message(&msg).expect("encodes");
    assert_eq!(check(&bytes), Ok(()));
    let decoded = decode_message(&bytes).expect("decodes");
    assert!(matches!(decoded.body, fe2o3_amqp_types::messaging::Body::Value(v) if v.0 == value));

    let data = Message::builder()
        .data(Binary::from(vec![1u8; 70_000]))
        .build();
    let bytes = crate::encode_message(&data).expect("encodes");
    assert_eq!(check(&bytes), Ok(()));
    let decoded = decode_message(&bytes).expect("decodes");
    assert!(matches!(
        decoded.body,
        fe2o3_amqp_types::messaging::Body::Data(_)
    ));
}

/// Upstream's first `unreachable!()` (`deserialize_byte_buf`): a `SymbolRef` leaves its
/// marker behind, and the binary after it, a well-formed list, panics the decoder.
#[test]
fn borrowed_symbol_then_binary_panics_upstream() {
    let list = [0xc0, 0x06, 0x02, 0xa3, 0x01, b's', 0xa0, 0x00];
    assert_eq!(check(&list), Ok(()), "well-formed");
    let upstream = std::panic::catch_unwind(|| {
        serde_amqp::from_slice::<(SymbolRef<'_>, serde_bytes::ByteBuf)>(&list).map(|_| ())
    });
    assert!(upstream.is_err(), "upstream no longer panics: {upstream:?}");
}

/// Upstream's second `unreachable!()` (`deserialize_bytes`): a `LazyValue` (owned, so
/// `DeserializeOwned` does not exclude it; the closed `Wire` set does) leaves its marker, and
/// borrowed bytes after it panic the decoder.
#[test]
fn lazy_value_then_bytes_panics_upstream() {
    let list = [0xc0, 0x05, 0x02, 0x40, 0xa0, 0x01, 0x07];
    assert_eq!(check(&list), Ok(()), "well-formed");
    let upstream = std::panic::catch_unwind(|| {
        serde_amqp::from_slice::<(serde_amqp::lazy::LazyValue, &[u8])>(&list).map(|_| ())
    });
    assert!(upstream.is_err(), "upstream no longer panics: {upstream:?}");
}

/// The same shapes through the `Wire` types: a symbol followed by a binary in message
/// sections (annotations, application properties, body) and in performatives (attach's
/// `name` … `unsettled`, transfer's `delivery-tag`) decode without reaching that state.
#[test]
fn wire_types_decode_symbol_then_binary() {
    // amqp-value: list [sym "s", vbin ""]; then a data section after a symbol-keyed map.
    let mut msg = vec![
        0x00, 0x53, 0x72, 0xc1, 0x06, 0x02, 0xa3, 0x01, b's', 0xa0, 0x00,
    ];
    msg.extend_from_slice(&[
        0x00, 0x53, 0x77, 0xc0, 0x06, 0x02, 0xa3, 0x01, b's', 0xa0, 0x00,
    ]);
    let decoded = decode_message(&msg).expect("decodes");
    assert!(decoded.message_annotations.is_some());

    // transfer(handle 0, delivery-id 1, delivery-tag vbin 'x', message-format 0).
    let transfer = [
        0x00, 0x53, 0x14, 0xc0, 0x08, 0x04, 0x43, 0x52, 0x01, 0xa0, 0x01, b'x', 0x43,
    ];
    assert!(decode::<Transfer>(&transfer).is_ok());
    // sasl-init(mechanism sym "PLAIN", initial-response vbin "\0a\0b").
    let init = [
        0x00, 0x53, 0x41, 0xc0, 0x0e, 0x02, 0xa3, 0x05, b'P', b'L', b'A', b'I', b'N', 0xa0, 0x04,
        0, b'a', 0, b'b',
    ];
    assert!(decode::<SaslInit>(&init).is_ok());
}

mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// The check never panics, and whatever it accepts the decoder reads without
        /// panicking (as a generic value sequence and as a message).
        #[test]
        fn accepted_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if check(&bytes).is_ok() {
                let _ = serde_amqp::from_slice::<Value>(&bytes);
                let _ = decode_message(&bytes);
            }
        }
    }
}
