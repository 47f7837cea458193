//! (1) The frame, performative, SASL and message decoders on arbitrary bytes: as a stream of
//! frames, and as a bare performative, SASL body and message.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = bytes::BytesMut::from(data);
    while let Ok(Some(_)) = sb_amqp::Frame::parse(&mut buf, 1 << 20) {}
    let _ = sb_amqp::frame::value_len(data);
    let _ = sb_amqp::performative::Performative::decode(data);
    let _ = sb_amqp::sasl::SaslFrame::decode(data);
    let _ = sb_amqp::decode_message(data);
});
