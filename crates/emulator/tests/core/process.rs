//! `sb-emulator` as a process: the strictness flags reach the wire (real time, bounded waits
//! on events, no sleeps).

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use sb_amqp::types::messaging::{ApplicationProperties, Message};
use sb_amqp::types::primitives::SimpleValue;
use sb_amqp::{Connection, ReceiverOptions, RequestResponse, condition};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The application properties of a `$cbs` put-token for `audience` with a SAS token.
pub(super) fn put_token_properties(audience: &str) -> ApplicationProperties {
    ApplicationProperties::builder()
        .insert("operation", SimpleValue::String("put-token".into()))
        .insert(
            "type",
            SimpleValue::String("servicebus.windows.net:sastoken".into()),
        )
        .insert("name", SimpleValue::String(audience.into()))
        .build()
}

/// A SAS token as the SDKs sign it: HMAC-SHA256 over `urlencode(audience)\nexpiry`.
pub(super) fn sas_token(audience: &str) -> String {
    let encode = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let expiry = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let sr = encode(audience);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, sb_emulator::KEY.as_bytes());
    let sig = ring::hmac::sign(&key, format!("{sr}\n{expiry}").as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(sig.as_ref());
    format!(
        "SharedAccessSignature sr={sr}&sig={}&se={expiry}&skn={}",
        encode(&sig),
        sb_emulator::KEY_NAME
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_flag_detaches_links_and_the_websocket_string_is_printed() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sb-emulator"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--websocket-listen",
            "127.0.0.1:0",
            "--link-idle-timeout",
            "1",
            "--max-token-lifetime",
            "60",
            "--fault",
            "busy-settle=0",
            "--fault-seed",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let amqp = lines.next_line().await.unwrap().unwrap();
    let ws = lines.next_line().await.unwrap().unwrap();
    assert!(ws.ends_with("TransportType=AmqpWebSockets;"), "{ws}");
    let addr = amqp
        .strip_prefix("Endpoint=sb://")
        .and_then(|rest| rest.split(';').next())
        .unwrap()
        .to_owned();
    let ws_addr = ws
        .strip_prefix("Endpoint=sb://")
        .and_then(|rest| rest.split(';').next())
        .unwrap()
        .to_owned();

    // Over WebSockets, as the idle receiver's connection.
    let conn = Connection::open(&format!("ws://{ws_addr}/$servicebus/websocket"))
        .await
        .unwrap();
    let session = conn.begin().await.unwrap();
    let cbs = RequestResponse::attach(&session, "$cbs").await.unwrap();
    let audience = format!("sb://{addr}/orders");
    let request = Message::builder()
        .application_properties(put_token_properties(&audience))
        .value(sas_token(&audience))
        .build();
    let reply = cbs.request(request).await.unwrap();
    let ApplicationProperties(props) = reply.application_properties.unwrap();
    assert_eq!(props.get("status-code"), Some(&SimpleValue::Int(202)));
    let receiver = session
        .attach_receiver(ReceiverOptions::new("idle", "orders").credit(1))
        .await
        .unwrap();
    let error = tokio::time::timeout(Duration::from_secs(30), receiver.recv())
        .await
        .expect("detached within the bound")
        .unwrap_err();
    assert_eq!(error.condition(), Some(condition::DETACH_FORCED), "{error}");
    let text = error.amqp_error().unwrap().description.clone().unwrap();
    assert!(
        text.ends_with("AmqpMessageConsumer.IdleTimerExpired: Idle timeout: 00:00:01."),
        "{text}"
    );
    child.kill().await.unwrap();
}

#[tokio::test]
async fn a_bad_fault_is_a_usage_error() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_sb-emulator"))
        .args(["--listen", "127.0.0.1:0", "--fault", "detach-link=1.5"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("detach-link: probability 1.5 is not within 0..=1"),
        "{stderr}"
    );
}
