//! Client role against RabbitMQ 3.10's AMQP 1.0 plugin (`AMQP_ADDR`, default
//! `amqp://guest:guest@127.0.0.1:5672`). Each test uses its own queue (`/queue/<unique>`,
//! declared by the plugin on first attach).

use sb_amqp::types::definitions::SenderSettleMode;
use sb_amqp::{Connection, Outcome, ReceiverOptions, SenderOptions, Session};

use crate::support::{body_bytes, data_message};

fn addr() -> String {
    std::env::var("AMQP_ADDR").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

/// A session on RabbitMQ, or `None` (after [`sb_testkit::missing`]) when no AMQP 1.0 listener
/// answers at `AMQP_ADDR`: RabbitMQ down, or up without its plugin (the 0-9-1 listener refuses
/// the AMQP 1.0 header).
async fn session() -> Option<(Connection, Session)> {
    match Connection::open(&addr()).await {
        Ok(conn) => {
            let s = conn.begin().await.unwrap();
            Some((conn, s))
        }
        Err(error) => {
            eprintln!("AMQP_ADDR: {error}");
            sb_testkit::missing(sb_testkit::RABBITMQ);
            None
        }
    }
}

fn queue(test: &str) -> String {
    format!(
        "/queue/{}",
        sb_amqp::unique_name(&format!("sb-amqp-{test}"))
    )
}

#[tokio::test]
async fn rabbit_send_awaits_accept_and_receive() {
    let Some((conn, s)) = session().await else {
        return;
    };
    let q = queue("send");
    let sender = s.attach_sender(SenderOptions::new("s", &q)).await.unwrap();
    for i in 0..3u8 {
        assert_eq!(
            sender.send(data_message(&[i; 10])).await.unwrap(),
            Outcome::Accepted
        );
    }
    let r = s
        .attach_receiver(ReceiverOptions::new("r", &q))
        .await
        .unwrap();
    r.set_credit(3).await.unwrap();
    for i in 0..3u8 {
        let d = r.recv().await.unwrap();
        assert_eq!(body_bytes(&d), vec![i; 10]);
        assert!(!d.settled);
        assert_eq!(r.accept(&d).await.unwrap(), None);
    }
    conn.close().await.unwrap();
}

#[tokio::test]
async fn rabbit_presettled_send() {
    let Some((conn, s)) = session().await else {
        return;
    };
    let q = queue("presettled");
    let sender = s
        .attach_sender(SenderOptions::new("s", &q).snd_settle_mode(SenderSettleMode::Settled))
        .await
        .unwrap();
    for _ in 0..5 {
        sender.send_settled(data_message(b"fire")).await.unwrap();
    }
    let r = s
        .attach_receiver(ReceiverOptions::new("r", &q).credit(5))
        .await
        .unwrap();
    for _ in 0..5 {
        let d = r.recv().await.unwrap();
        assert_eq!(body_bytes(&d), b"fire");
        r.accept(&d).await.unwrap();
    }
    conn.close().await.unwrap();
}

#[tokio::test]
async fn rabbit_reject_release_accept() {
    let Some((conn, s)) = session().await else {
        return;
    };
    let q = queue("settle");
    let sender = s.attach_sender(SenderOptions::new("s", &q)).await.unwrap();
    sender.send(data_message(b"to-reject")).await.unwrap();
    sender.send(data_message(b"to-release")).await.unwrap();
    let r = s
        .attach_receiver(ReceiverOptions::new("r", &q).credit(1))
        .await
        .unwrap();
    let d = r.recv().await.unwrap();
    assert_eq!(body_bytes(&d), b"to-reject");
    r.reject(&d, None).await.unwrap();
    r.add_credit(1).await.unwrap();
    let d = r.recv().await.unwrap();
    assert_eq!(body_bytes(&d), b"to-release");
    r.release(&d).await.unwrap();
    // Released goes back to the queue and is delivered again; rejected is gone.
    r.add_credit(1).await.unwrap();
    let d = r.recv().await.unwrap();
    assert_eq!(body_bytes(&d), b"to-release");
    r.accept(&d).await.unwrap();
    conn.close().await.unwrap();
}

/// Declares a quorum queue through `rabbitmqctl eval` (the AMQP 1.0 plugin only
/// auto-declares classic queues). `None` if rabbitmqctl is not usable here.
fn quorum_queue(test: &str) -> Option<(String, String)> {
    let name = sb_amqp::unique_name(&format!("sb-amqp-{test}"));
    let expr = format!(
        "rabbit_amqqueue:declare(rabbit_misc:r(<<\"/\">>, queue, <<\"{name}\">>), true, false, \
         [{{<<\"x-queue-type\">>, longstr, <<\"quorum\">>}}], none, <<\"guest\">>)."
    );
    let out = std::process::Command::new("rabbitmqctl")
        .args(["eval", &expr])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    (out.status.success() && text.contains("rabbit_quorum_queue"))
        .then(|| (format!("/amq/queue/{name}"), name))
}

/// Drain runs against a quorum queue: RabbitMQ 3.10.8 crashes the session when an AMQP 1.0
/// client drains a *classic* queue (`function_clause` on `send_drained`,
/// rabbitmq-server#7119, fixed after 3.10.8).
#[tokio::test]
async fn rabbit_credit_and_drain() {
    let Some((q, name)) = quorum_queue("drain") else {
        sb_testkit::missing(sb_testkit::RABBITMQCTL);
        return;
    };
    let Some((conn, s)) = session().await else {
        return;
    };
    let sender = s.attach_sender(SenderOptions::new("s", &q)).await.unwrap();
    for i in 0..3u8 {
        sender.send(data_message(&[i])).await.unwrap();
    }
    let r = s
        .attach_receiver(ReceiverOptions::new("r", &q))
        .await
        .unwrap();
    r.set_credit(2).await.unwrap();
    let a = r.recv().await.unwrap();
    let b = r.recv().await.unwrap();
    assert_eq!((body_bytes(&a), body_bytes(&b)), (vec![0], vec![1]));
    r.accept(&a).await.unwrap();
    r.accept(&b).await.unwrap();
    assert_eq!(r.flow().credit, 0);
    // Drain with more credit than messages: one arrives, the rest of the credit is spent.
    r.drain_with(5).await.unwrap();
    assert_eq!(r.flow().credit, 0);
    // RabbitMQ 3.10 may answer the drain before the transfer it triggered.
    let c = r.recv().await.unwrap();
    assert_eq!(body_bytes(&c), vec![2]);
    r.accept(&c).await.unwrap();
    // Draining an empty queue completes too.
    r.drain_with(3).await.unwrap();
    assert_eq!(r.flow().credit, 0);
    assert!(r.try_recv().unwrap().is_none());
    conn.close().await.unwrap();
    // Best effort clean-up; the name is unique anyway.
    let _ = std::process::Command::new("rabbitmqctl")
        .args(["delete_queue", &name])
        .output();
}

#[tokio::test]
async fn rabbit_one_mib_multi_frame() {
    let Some((conn, s)) = session().await else {
        return;
    };
    let q = queue("big");
    let big: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
    let sender = s.attach_sender(SenderOptions::new("s", &q)).await.unwrap();
    assert_eq!(
        sender.send(data_message(&big)).await.unwrap(),
        Outcome::Accepted
    );
    let r = s
        .attach_receiver(ReceiverOptions::new("r", &q).credit(1))
        .await
        .unwrap();
    let d = r.recv().await.unwrap();
    assert_eq!(body_bytes(&d), big);
    r.accept(&d).await.unwrap();
    conn.close().await.unwrap();
}
