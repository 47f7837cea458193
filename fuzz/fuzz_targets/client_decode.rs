//! (4) The client's decoding of what a broker sends: a delivery's payload (message sections,
//! annotations such as lock tokens, sequence numbers, enqueue times, application properties)
//! and `$cbs` / `$management` replies (status properties, peek-message lists of encoded
//! messages, renew-lock expirations). The first byte is the delivery tag's length.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&tag_len, rest)) = data.split_first() else {
        return;
    };
    let (tag, payload) = rest.split_at(usize::from(tag_len % 17).min(rest.len()));
    sb_inbox::servicebus::fuzzing::decode_delivery(payload, tag);
    sb_inbox::servicebus::fuzzing::decode_reply(payload);
});
