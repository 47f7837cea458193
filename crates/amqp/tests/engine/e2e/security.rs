//! SASL PLAIN, TLS and AMQP over secure WebSockets between our client and our server.

use sb_amqp::{
    Connection, ConnectionEvent, ConnectionOptions, Error, LinkAnswer, SenderOptions, ServerOptions,
};
use tokio::sync::mpsc;

use crate::support::*;

#[tokio::test]
async fn sasl_plain_credentials_checked_by_server() {
    use std::sync::Arc;
    let opts = ServerOptions {
        sasl: sb_amqp::SaslServer {
            mechanisms: vec!["MSSBCBS".into(), "PLAIN".into(), "ANONYMOUS".into()],
            allow_no_sasl: false,
            authenticator: Some(Arc::new(|id: &sb_amqp::SaslIdentity| {
                id.mechanism.as_deref() != Some("PLAIN") || id.password.as_deref() == Some("pw")
            })),
        },
        ..Default::default()
    };
    let addr = spawn_server(opts, |conn| async move {
        assert!(conn.sasl_identity().mechanism.is_some());
        std::future::pending::<()>().await
    })
    .await;
    let ok = Connection::open(&format!("amqp://user:pw@{addr}"))
        .await
        .unwrap();
    ok.begin().await.unwrap();
    let anon = Connection::open(&format!("amqp://{addr}")).await.unwrap();
    anon.begin().await.unwrap();
    let bad = Connection::open(&format!("amqp://user:wrong@{addr}"))
        .await
        .unwrap_err();
    assert!(matches!(bad, Error::Sasl(1)), "{bad:?}");
}

#[tokio::test]
async fn tls_round_trip() {
    tls_round_trip_over(false).await;
}

/// `wss://`: TLS, then the WebSocket upgrade (subprotocol `AMQPWSB10`), then AMQP: what the
/// client speaks to Service Bus on port 443.
#[tokio::test]
async fn wss_round_trip() {
    tls_round_trip_over(true).await;
}

async fn tls_round_trip_over(websocket: bool) {
    let Some((cert, key)) = self_signed() else {
        sb_testkit::missing(sb_testkit::OPENSSL);
        return;
    };
    use sb_amqp::rustls;
    use sb_amqp::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    use std::sync::Arc;
    // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange). ring is kept on
    // purpose: the project's one provider, lighter to build than aws-lc-rs.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = vec![CertificateDer::from_pem_slice(&cert).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(&key).unwrap();
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs.clone(), key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs[0].clone()).unwrap();
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let opts = ServerOptions {
        tls: Some(Arc::new(server_cfg)),
        ..Default::default()
    };
    let handler = move |mut conn: sb_amqp::ServerConnection| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(1))
                    .await
                    .unwrap();
                let d = r.recv().await.unwrap();
                r.accept(&d).await.unwrap();
                tx.send(body_bytes(&d)).unwrap();
            }
        }
    };
    let url = if websocket {
        let port = spawn_websocket_server(opts, handler).await.port();
        format!("wss://localhost:{port}/$servicebus/websocket")
    } else {
        let port = spawn_server(opts, handler).await.port();
        format!("amqps://localhost:{port}")
    };
    let conn = Connection::open_with(
        &url,
        ConnectionOptions {
            tls_config: Some(Arc::new(client_cfg)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let s = conn.begin().await.unwrap();
    let sender = s.attach_sender(SenderOptions::new("s", "q")).await.unwrap();
    assert!(
        sender
            .send(data_message(b"over tls"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(rx.recv().await.unwrap(), b"over tls");
}

fn self_signed() -> Option<(Vec<u8>, Vec<u8>)> {
    let dir = std::env::temp_dir().join(sb_amqp::unique_name("sb-amqp-tls"));
    std::fs::create_dir_all(&dir).ok()?;
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    let st = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .arg("-keyout")
        .arg(&k)
        .arg("-out")
        .arg(&c)
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    if !st.success() {
        return None;
    }
    Some((std::fs::read(c).ok()?, std::fs::read(k).ok()?))
}
