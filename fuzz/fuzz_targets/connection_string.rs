//! (6) The Service Bus connection-string parser. A string that parses must print (Display and
//! Debug) with its key or signature masked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sb_inbox::servicebus::{ConnectionString, Credential};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cs) = text.parse::<ConnectionString>() else {
        return;
    };
    // The printed form parses again with the secret replaced by `***`: the secret itself is
    // never at its key's position. (A substring test would flag a one-letter key found in
    // "sb://".) Debug masks the same way.
    if let Ok(again) = cs.to_string().parse::<ConnectionString>() {
        match again.credential() {
            Credential::Key { key, .. } => assert_eq!(key, "***", "a key was printed"),
            Credential::Signature(signature) => {
                assert_eq!(signature, "***", "a signature was printed")
            }
        }
    }
    let debug = format!("{:?}", cs.credential());
    assert!(
        debug == "Signature(***)" || debug.ends_with(", key: *** }"),
        "{debug}"
    );
    let _ = (cs.amqp_url(), cs.audience("q"), cs.entity_path(), cs.use_tls());
});
