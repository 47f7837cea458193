//! protocol3 F4 / N7 / N14: the management client is bounded (connect, answer, token), retries
//! what Azure.Core retries (408, 429, 5xx; `Retry-After` honoured) and goes through the
//! proxy, with its credentials.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions, ManagementFault, QueueConfig};
use sb_servicebus::admin::{AdminClient, AdminError};
use sb_servicebus::{ConnectionString, ProxyConfig, TokenFuture, TokenProvider};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Longer than any bound under test: only a hang reaches it.
const HANG: Duration = Duration::from_secs(60);

/// The emulator with `orders` and its plain HTTP management listener; a management client
/// for it with short bounds and retries.
async fn emulator() -> (Emulator, AdminClient) {
    let config = Config::new("sbemulatorns").with_queue(QueueConfig::new("orders"));
    let options = EmulatorOptions {
        http_listen: Some("127.0.0.1:0".to_owned()),
        ..EmulatorOptions::default()
    };
    let emulator = Emulator::start(Broker::new(config).expect("validates"), options)
        .await
        .expect("the emulator starts");
    let cs: ConnectionString = emulator.connection_string().parse().expect("parses");
    let http = emulator.http_addr().expect("the HTTP listener");
    let admin = AdminClient::from_connection_string(&cs)
        .expect("default roots")
        .with_endpoint(&format!("http://{http}"))
        .expect("the endpoint")
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(2))
        .with_retries(3, Duration::from_millis(10));
    (emulator, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_management_api_that_never_answers_fails_within_the_bound() {
    let (emulator, admin) = emulator().await;
    emulator.fail_management_requests([ManagementFault::Stall; 4]);
    let failed = tokio::time::timeout(HANG, admin.entity("orders"))
        .await
        .expect("bounded")
        .expect_err("nothing answered");
    assert!(matches!(failed, AdminError::Timeout { .. }), "{failed:?}");
    assert!(failed.is_unreachable() && failed.is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_try_and_a_503_are_retried_and_the_read_succeeds() {
    let (emulator, admin) = emulator().await;
    emulator.fail_management_requests([ManagementFault::Stall, ManagementFault::Status(503)]);
    let orders = tokio::time::timeout(HANG, admin.entity("orders"))
        .await
        .expect("bounded")
        .expect("read after the retries")
        .expect("orders exists");
    assert!(orders.properties.lock_duration.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_that_persists_is_transient_once_the_retries_ran_out() {
    let (emulator, admin) = emulator().await;
    emulator.fail_management_requests([ManagementFault::Status(429); 4]);
    let failed = admin.entity("orders").await.expect_err("throttled");
    assert!(
        matches!(failed, AdminError::Status { status: 429, .. }),
        "{failed:?}"
    );
    assert!(failed.is_transient() && !failed.is_unreachable());
    // A refusal is not retried and not transient.
    emulator.fail_management_requests([ManagementFault::Status(400)]);
    let refused = admin.entity("orders").await.expect_err("refused");
    assert!(!refused.is_transient(), "{refused:?}");
    let orders = admin.entity("orders").await.expect("the next read works");
    assert!(orders.is_some());
}

/// Never gives a token.
#[derive(Debug)]
struct Hung;

impl TokenProvider for Hung {
    fn token<'a>(&'a self, _audience: &'a str) -> TokenFuture<'a> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_provider_that_hangs_fails_the_request_within_the_bound() {
    let (_emulator, admin) = emulator().await;
    let admin = admin
        .with_token_provider(Arc::new(Hung))
        .with_retries(0, Duration::ZERO);
    let failed = tokio::time::timeout(HANG, admin.entity("orders"))
        .await
        .expect("bounded")
        .expect_err("no token");
    assert!(matches!(failed, AdminError::Timeout { .. }), "{failed:?}");
}

/// A `CONNECT` proxy for one tunnel at a time: records each request head, then relays.
async fn proxy() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let Ok(byte) = client.read_u8().await else {
                        return;
                    };
                    head.push(byte);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                seen.lock().expect("not poisoned").push(head);
                let Ok(mut server) = TcpStream::connect(target).await else {
                    return;
                };
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (addr, heads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_read_goes_through_the_proxy_with_its_credentials() {
    let (emulator, admin) = emulator().await;
    let (proxy, heads) = proxy().await;
    let setting = format!("http://reader:s%40cret@{proxy}");
    let config =
        ProxyConfig::from_env_vars(|name| (name == "HTTPS_PROXY").then(|| setting.clone()))
            .expect("the setting parses");
    let admin = admin.with_proxy(&config);
    let orders = admin
        .entity("orders")
        .await
        .expect("read through the proxy");
    assert!(orders.is_some());
    let heads = heads.lock().expect("not poisoned").clone();
    let http = emulator.http_addr().expect("the HTTP listener");
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].starts_with(&format!("CONNECT {http} HTTP/1.1")),
        "{heads:?}"
    );
    // base64("reader:s@cret")
    assert!(
        heads[0].contains("Proxy-Authorization: Basic cmVhZGVyOnNAY3JldA=="),
        "{heads:?}"
    );
}
