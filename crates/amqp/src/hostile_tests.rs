//! Hostile inputs: every length, count and nesting level an attacker controls stays within the
//! bytes actually sent. Each case here once made the decoder ask for gigabytes, loop for
//! billions of elements, underflow a count or overflow the stack (issue 18, and crashes found
//! by the cargo-fuzz targets in `fuzz/`); the bounds check in front of the upstream `serde_amqp`
//! (`crate::decode`, `validate_encoding`) and the frame layer must turn each into an error after
//! at most a small allocation. These tests run against the unpatched crates.io `serde_amqp`.
//!
//! The allocation probe is this test binary's global allocator: it records the largest single
//! request made on the current thread, so a decoder that allocates a wire-claimed length up
//! front fails here even where the allocation itself would succeed (lazily committed memory).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::BytesMut;

use crate::frame::Frame;
use crate::performative::Performative;
use crate::sasl::SaslFrame;
use crate::{Error, MAX_NESTING, decode_message};

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

struct Probe;

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: forwards every call unchanged to the system allocator; only records sizes.
unsafe impl GlobalAlloc for Probe {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static PROBE: Probe = Probe;

/// Largest allocation any hostile input may cause: far below any length it claims.
const SMALL: usize = 1 << 20;

/// Runs `f`, failing if it allocated more than [`SMALL`] bytes at once.
fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    LARGEST.with(|l| l.set(0));
    let out = f();
    let largest = LARGEST.with(Cell::get);
    assert!(
        largest <= SMALL,
        "{what}: one allocation of {largest} bytes for a few bytes of input"
    );
    out
}

/// The 21-byte SASL frame of issue 18: sasl-init whose mechanism is a `sym32` claiming
/// 4 GiB - 16 bytes.
pub(crate) const SASL_INIT_SYM32_CLAIM: &[u8] = &[
    0x00, 0x00, 0x00, 0x15, 0x02, 0x01, 0x00, 0x00, 0x00, 0x53, 0x41, 0xc0, 0x07, 0x01, 0xb3, 0xff,
    0xff, 0xff, 0xf0, 0x41, 0x42,
];

/// `n` nested, correctly sized `list32` values, each holding the next, around a `list0`.
fn nested_lists(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 * n + 1);
    for level in 0..n {
        let size = u32::try_from(4 + 9 * (n - 1 - level) + 1).unwrap_or(u32::MAX);
        v.push(0xd0);
        v.extend_from_slice(&size.to_be_bytes());
        v.extend_from_slice(&1u32.to_be_bytes());
    }
    v.push(0x45);
    v
}

/// An `amqp-value` section (descriptor 0x77) around `value`.
fn amqp_value(value: &[u8]) -> Vec<u8> {
    let mut v = vec![0x00, 0x53, 0x77];
    v.extend_from_slice(value);
    v
}

/// An `application-properties` section (descriptor 0x74) around `map`.
fn app_properties(map: &[u8]) -> Vec<u8> {
    let mut v = vec![0x00, 0x53, 0x74];
    v.extend_from_slice(map);
    v
}

/// An `array32` of `outer` elements, each an `array32` claiming 65,536 `null`s.
fn nested_null_arrays(outer: u32) -> Vec<u8> {
    let mut v = vec![0xf0];
    v.extend_from_slice(&(5 + 8 * outer).to_be_bytes());
    v.extend_from_slice(&outer.to_be_bytes());
    v.push(0xf0);
    for _ in 0..outer {
        v.extend_from_slice(&0x0001_0005u32.to_be_bytes());
        v.extend_from_slice(&0x0001_0000u32.to_be_bytes());
    }
    v.push(0x40);
    v
}

fn hostile_values() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "sym32 claim (fuzz: b3 c1 c1 c1 c1 c1)",
            vec![0xb3, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1],
        ),
        (
            "str32 claim",
            amqp_value(&[0xb1, 0xff, 0xff, 0xff, 0xf0, b'a']),
        ),
        (
            "vbin32 claim in a data section",
            vec![0x00, 0x53, 0x75, 0xb0, 0xff, 0xff, 0xff, 0xf0, 1],
        ),
        (
            "array32 claiming 2^24 nulls",
            amqp_value(&[0xf0, 0xff, 0xff, 0xff, 0x00, 0x00, 0xff, 0xff, 0xff, 0x40]),
        ),
        (
            "list32 size claim",
            amqp_value(&[0xd0, 0xff, 0xff, 0xff, 0xf0, 0x00, 0x00, 0x00, 0x01, 0x40]),
        ),
        (
            "map32 size claim",
            app_properties(&[
                0xd1, 0xff, 0xff, 0xff, 0xf0, 0x00, 0x00, 0x00, 0x02, 0xa1, 0x00, 0x40,
            ]),
        ),
        (
            "nested arrays of null arrays",
            amqp_value(&nested_null_arrays(4096)),
        ),
        ("100,000 nested lists", amqp_value(&nested_lists(100_000))),
        (
            "map with an odd count",
            app_properties(&[0xc1, 0x03, 0x01, 0xa1, 0x00]),
        ),
        (
            "map8 with an odd count and a value",
            app_properties(&[0xc1, 0x04, 0x03, 0xa1, 0x00, 0x40, 0x40]),
        ),
        (
            "list8 whose size omits its count",
            amqp_value(&[0xc0, 0x00, 0x01, 0x40]),
        ),
        (
            "array8 whose size omits its constructor",
            amqp_value(&[0xe0, 0x01, 0x01, 0x40]),
        ),
        (
            "described list32 claiming 2^32-1 fields",
            vec![
                0x00, 0x53, 0x10, 0xd0, 0x00, 0x00, 0x00, 0x04, 0xff, 0xff, 0xff, 0xff,
            ],
        ),
        ("100,000 nested descriptors", {
            let mut v = vec![];
            for _ in 0..100_000 {
                v.extend_from_slice(&[0x00, 0x53, 0x77]);
            }
            v.push(0x40);
            v
        }),
    ]
}

#[test]
fn issue_18_sasl_frame_is_a_decode_error_without_a_large_allocation() {
    let mut buf = BytesMut::from(SASL_INIT_SYM32_CLAIM);
    let out = bounded("21-byte sasl-init", || Frame::parse(&mut buf, 512));
    assert!(matches!(out, Err(Error::Decode(_))), "{out:?}");
}

#[test]
fn hostile_values_fail_every_decoder_within_a_small_allocation() {
    for (what, bytes) in hostile_values() {
        bounded(what, || {
            assert!(decode_message(&bytes).is_err(), "{what}: message decoded");
            assert!(
                Performative::decode(&bytes).is_err(),
                "{what}: performative decoded"
            );
            assert!(
                SaslFrame::decode(&bytes).is_err(),
                "{what}: SASL frame decoded"
            );
        });
    }
}

#[test]
fn hostile_values_inside_performatives_and_sasl_frames_fail() {
    for (what, bytes) in hostile_values() {
        // As the first field of open (container-id), of sasl-init (mechanism) and of
        // attach (name): every performative goes through the same deserializer.
        for descriptor in [0x10u8, 0x41, 0x12] {
            let mut body = vec![0x00, 0x53, descriptor, 0xd0];
            body.extend_from_slice(
                &(u32::try_from(bytes.len()).unwrap_or(u32::MAX) + 4).to_be_bytes(),
            );
            body.extend_from_slice(&1u32.to_be_bytes());
            body.extend_from_slice(&bytes);
            bounded(what, || {
                assert!(
                    Performative::decode(&body).is_err(),
                    "{what} in {descriptor:#x}"
                );
                assert!(
                    SaslFrame::decode(&body).is_err(),
                    "{what} in {descriptor:#x}"
                );
            });
        }
    }
}

/// The fuzz finding of issue 18 through the public decode API: six bytes, a `sym32` claiming
/// 3,250,700,737 bytes. Upstream `serde_amqp` alone allocates the claim before reading.
#[test]
fn six_byte_sym32_claim_is_refused_without_a_large_allocation() {
    let six = [0xb3, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1];
    bounded("b3 c1 c1 c1 c1 c1", || {
        assert!(matches!(decode_message(&six), Err(Error::Decode(_))));
        assert!(matches!(
            decode_message(&amqp_value(&six)),
            Err(Error::Decode(_))
        ));
    });
    // Inside a transfer frame's payload, as a receiver sees it.
    // transfer(handle 0, delivery-id 1, delivery-tag "x", message-format 0), then the payload.
    let mut frame = vec![
        0, 0, 0, 0, 2, 0, 0, 0, 0x00, 0x53, 0x14, 0xc0, 0x08, 0x04, 0x43, 0x52, 0x01, 0xa0, 0x01,
        b'x', 0x43,
    ];
    frame.extend_from_slice(&amqp_value(&six));
    let size = u32::try_from(frame.len()).unwrap_or(u32::MAX);
    frame[..4].copy_from_slice(&size.to_be_bytes());
    let mut buf = BytesMut::from(&frame[..]);
    bounded("transfer payload", || {
        let parsed = Frame::parse(&mut buf, 512);
        let Ok(Some(Frame {
            body: crate::FrameBody::Amqp(_, payload),
            ..
        })) = parsed
        else {
            panic!("the frame itself parses: {parsed:?}");
        };
        assert!(decode_message(&payload).is_err());
    });
}

#[test]
fn nesting_at_the_bound_decodes_on_a_test_thread() {
    // The amqp-value section is one level, its lists the rest: the deepest the bounds check
    // lets through, decoded by upstream `serde_amqp` within a 2 MiB test-thread stack.
    let msg = amqp_value(&nested_lists(MAX_NESTING - 1));
    assert!(decode_message(&msg).is_ok());
    let too_deep = amqp_value(&nested_lists(MAX_NESTING));
    assert!(decode_message(&too_deep).is_err());
}

#[test]
fn nesting_within_the_bound_still_decodes() {
    // Forty levels of lists, far more than real application data has, are within the bound (and
    // within a debug build's 2 MiB test-thread stack).
    let msg = amqp_value(&nested_lists(40));
    assert!(decode_message(&msg).is_ok());
}
