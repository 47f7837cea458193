//! (5) The emulator's text parsers: `Config.json` (an even first byte) and SQL filter
//! expressions (an odd one), each parsed and, when valid, used: a config builds a broker, a
//! filter is matched against a message with properties.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sb_emulator::{BrokerMessage, Config, PropertyValue, SqlFilter};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if which % 2 == 0 {
        if let Ok(config) = Config::from_json(text) {
            let _ = sb_emulator::Broker::new(config);
        }
    } else if let Ok(filter) = SqlFilter::parse(text) {
        let _ = filter.expression();
        let mut message = BrokerMessage::new(bytes::Bytes::from_static(b"body"));
        message.subject = Some("subject".into());
        let props = &mut message.application_properties;
        props.insert("color".into(), PropertyValue::String("red".into()));
        props.insert("n".into(), PropertyValue::Long(7));
        let _ = filter.matches(&message);
    }
});
