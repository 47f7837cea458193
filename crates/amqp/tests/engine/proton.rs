//! Interop with Qpid Proton (python-qpid-proton, see crates/amqp/CI.md) in both roles:
//! our client against a Proton broker, and a Proton client against our server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use sb_amqp::types::messaging::Message;
use sb_amqp::{Connection, Outcome, Sendable, condition};

use crate::support::{body_bytes, data_message, open_receiver, open_sender, spawn_broker};

fn proton_available() -> bool {
    sb_testkit::require(sb_testkit::PROTON, sb_testkit::python_imports("proton"))
}

fn script(name: &str) -> String {
    format!("{}/tests/proton/{name}", env!("CARGO_MANIFEST_DIR"))
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_proton_broker() -> (Kill, u16) {
    let port = free_port();
    let mut child = Command::new(sb_testkit::python())
        .arg(script("broker.py"))
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "LISTENING");
    (Kill(child), port)
}

fn string_message(s: &str) -> Sendable {
    Sendable::message(&Message::builder().value(s.to_string()).build()).unwrap()
}

#[tokio::test]
async fn our_client_against_proton_broker() {
    if !proton_available() {
        return;
    }
    let (_broker, port) = tokio::task::spawn_blocking(start_proton_broker)
        .await
        .unwrap();
    let conn = Connection::open(&format!("amqp://127.0.0.1:{port}"))
        .await
        .unwrap();
    let s = conn.begin().await.unwrap();
    let sender = open_sender(&s, "s", "q1").await;
    for i in 0..3u8 {
        assert_eq!(
            sender.send(data_message(&[i; 4])).await.unwrap(),
            Outcome::Accepted
        );
    }
    // Rejection with a condition comes back typed.
    let o = sender.send(string_message("reject-me")).await.unwrap();
    assert_eq!(
        o.error().unwrap().condition,
        condition::MESSAGE_SIZE_EXCEEDED
    );
    // 1 MiB, split into Proton's frame size.
    let big: Vec<u8> = (0..(1 << 20)).map(|i| (i % 249) as u8).collect();
    assert!(sender.send(data_message(&big)).await.unwrap().is_accepted());

    let r = open_receiver(&s, "r", "q1").await;
    r.set_credit(3).await.unwrap();
    for i in 0..3u8 {
        let d = r.recv().await.unwrap();
        assert_eq!(body_bytes(&d), vec![i; 4]);
        r.accept(&d).await.unwrap();
    }
    // Drain with credit to spare: the big message arrives, the rest is spent.
    r.drain_with(5).await.unwrap();
    assert_eq!(r.flow().credit, 0);
    let d = r
        .try_recv()
        .unwrap()
        .expect("delivered before the drain answer");
    assert_eq!(body_bytes(&d), big);
    r.accept(&d).await.unwrap();
    r.drain_with(2).await.unwrap();
    assert!(r.try_recv().unwrap().is_none());
    conn.close().await.unwrap();
}

#[tokio::test]
async fn proton_client_against_our_server() {
    if !proton_available() {
        return;
    }
    let addr = spawn_broker().await;
    let out = tokio::process::Command::new(sb_testkit::python())
        .arg(script("client.py"))
        .arg(format!("amqp://{addr}"))
        .arg("5")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("OK"),
        "proton client failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
