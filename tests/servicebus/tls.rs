//! TLS (issue 29 item 15): the emulator's TLS listener (`amqps` and `wss` on one port, its
//! certificate signed by a CA it generates) and our client's trust roots: it verifies the
//! listener with the generated CA and refuses it with Mozilla's roots alone; `wss` through an
//! HTTP `CONNECT` proxy chosen by `HTTPS_PROXY` / `NO_PROXY`.

use std::path::PathBuf;

use sb_emulator::{Emulator, EmulatorOptions, TlsIdentity};
use sb_inbox::Message;
use sb_inbox::servicebus::{ConnectionString, ProxyConfig, ServiceBusClient, TrustRoots};
use sb_testkit::ConnectProxy;

use crate::support::emulator::queue;

/// A fresh folder for one emulator's generated CA and certificate.
pub(crate) fn tls_dir(test: &str) -> PathBuf {
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

/// `HTTPS_PROXY` naming `proxy` and `NO_PROXY` as given, without touching the process's
/// environment (other tests of this binary run concurrently).
fn proxy_vars(proxy: &ConnectProxy, no_proxy: Option<&str>) -> ProxyConfig {
    let url = proxy.url();
    let no_proxy = no_proxy.map(str::to_owned);
    ProxyConfig::from_env_vars(|name| match name {
        "HTTPS_PROXY" => Some(url.clone()),
        "NO_PROXY" => no_proxy.clone(),
        _ => None,
    })
    .expect("the proxy URL parses")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_goes_through_the_https_proxy_unless_no_proxy_names_the_host() {
    let dir = tls_dir("proxy");
    let emulator = tls_emulator(dir.clone()).await;
    let trust = TrustRoots::new().with_ca_file(emulator.tls_ca_file().unwrap());
    let wss = emulator.tls_websocket_connection_string().unwrap();
    let cases = [
        ("proxied", None, 1),
        ("bypassed", Some("example.org, .localhost"), 0),
        ("bypassed-star", Some("*"), 0),
    ];
    for (id, no_proxy, tunnels) in cases {
        let proxy = ConnectProxy::start().await.unwrap();
        client_for(&wss)
            .with_trust(&trust)
            .unwrap()
            .with_proxy(&proxy_vars(&proxy, no_proxy))
            .sender("q")
            .send(Message::new(id, "t", "{}"))
            .await
            .unwrap_or_else(|e| panic!("{id}: {e:?}"));
        assert_eq!(proxy.tunnels(), tunnels, "{id}: NO_PROXY={no_proxy:?}");
    }
    let peeked = crate::support::emulator::client(&emulator)
        .peek("q", 0, 10)
        .await
        .unwrap();
    assert_eq!(peeked.len(), 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_refusing_the_tunnel_fails_the_connection_with_its_answer() {
    let dir = tls_dir("proxy-refused");
    let emulator = tls_emulator(dir.clone()).await;
    let trust = TrustRoots::new().with_ca_file(emulator.tls_ca_file().unwrap());
    // A proxy whose upstream is closed answers 502: the client reports the proxy's answer.
    let proxy = ConnectProxy::start().await.unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let cs = emulator.tls_websocket_connection_string().unwrap().replace(
        &format!("localhost:{}", emulator.tls_addr().unwrap().port()),
        &format!("localhost:{port}"),
    );
    let err = client_for(&cs)
        .with_trust(&trust)
        .unwrap()
        .with_proxy(&proxy_vars(&proxy, None))
        .sender("q")
        .send(Message::new("refused", "t", "{}"))
        .await
        .expect_err("the proxy cannot reach the host");
    assert!(format!("{err:?}").contains("502"), "{err:?}");
    assert_eq!(proxy.tunnels(), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_test_proxy_refuses_other_methods_with_405() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let proxy = ConnectProxy::start().await.unwrap();
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    assert_eq!(proxy.tunnels(), 0);
}
