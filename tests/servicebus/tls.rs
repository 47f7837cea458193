//! TLS (issue 29 item 15): the emulator's TLS listener (`amqps` and `wss` on one port, its
//! certificate signed by a CA it generates) and our client's trust roots: it verifies the
//! listener with the generated CA and refuses it with Mozilla's roots alone.

use std::path::PathBuf;

use sb_emulator::{Emulator, EmulatorOptions, TlsIdentity};
use sb_inbox::Message;
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient, TrustRoots};

use crate::support::emulator::queue;

/// A fresh folder for one emulator's generated CA and certificate.
fn tls_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sb-inbox-tls-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// An emulator with queue `q` and a TLS listener whose certificate it generates into `dir`.
pub(crate) async fn tls_emulator(dir: PathBuf) -> Emulator {
    crate::support::emulator::start(
        vec![queue("q", Default::default())],
        EmulatorOptions::default().with_tls_listen("127.0.0.1:0", TlsIdentity::Generate(dir)),
    )
    .await
}

fn client_for(cs: &str) -> ServiceBusClient {
    let cs: ConnectionString = cs.parse().expect("the TLS connection string parses");
    ServiceBusClient::from_connection_string(&cs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_verifies_the_tls_listener_with_the_generated_ca_and_refuses_it_without() {
    let dir = tls_dir("verify");
    let emulator = tls_emulator(dir.clone()).await;
    let ca = emulator
        .tls_ca_file()
        .expect("the emulator generated its CA");
    assert_eq!(ca, dir.join(sb_emulator::TLS_CA_FILE));
    let strings = [
        emulator.tls_connection_string().unwrap(),
        emulator.tls_websocket_connection_string().unwrap(),
    ];
    for (n, cs) in strings.iter().enumerate() {
        // Mozilla's roots alone: the generated CA is unknown, so the handshake fails.
        let refused = client_for(cs)
            .sender("q")
            .send(Message::new(format!("refused-{n}"), "t", "{}"))
            .await
            .expect_err("an unknown CA is refused");
        let chain = format!("{refused:?}");
        assert!(chain.contains("UnknownIssuer"), "{cs}: {chain}");
        let trusting = client_for(cs)
            .with_trust(&TrustRoots::new().with_ca_file(ca))
            .unwrap();
        trusting
            .sender("q")
            .send(Message::new(format!("verified-{n}"), "t", "{}"))
            .await
            .unwrap_or_else(|e| panic!("{cs}: {e:?}"));
    }
    // Both went through the TLS listener (amqps, then wss), and only those.
    let peeked = crate::support::emulator::client(&emulator)
        .peek("q", 0, 10)
        .await
        .unwrap();
    let ids: Vec<Option<&str>> = peeked
        .iter()
        .map(|p| p.message.message_id.as_deref())
        .collect();
    assert_eq!(ids, [Some("verified-0"), Some("verified-1")]);
    let _ = std::fs::remove_dir_all(dir);
}
