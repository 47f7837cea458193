//! The `sb-emulator` binary's fault flags on the wire (issue 39): `--management-fault`,
//! `--settlement-timeouts`, `--detach-receive-links-after`. Each test spawns the binary with the
//! flag and drives it with the sb-amqp client (real time, bounded waits on events, no sleeps).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::OrderedMap;
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Message, Properties};
use sb_amqp::types::primitives::SimpleValue;
use sb_amqp::{
    AnyMessage, Connection, Outcome, ReceiverOptions, RequestResponse, Sendable, SenderOptions,
    Session, condition,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;

use super::process::{put_token_properties, sas_token};

/// Bound of every wait on the emulator (never reached when it behaves).
const BOUND: Duration = Duration::from_secs(30);

/// A running `sb-emulator` process: its AMQP address, its HTTP management address when
/// `--http-listen` was given, and its log so far.
struct Spawned {
    /// Killed when the test ends (`kill_on_drop`).
    _child: Child,
    addr: String,
    http: Option<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Spawned {
    async fn start(args: &[&str]) -> Spawned {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sb-emulator"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let cs = stdout.next_line().await.unwrap().unwrap();
        let addr = cs
            .strip_prefix("Endpoint=sb://")
            .and_then(|rest| rest.split([';', '/']).next())
            .unwrap()
            .to_owned();
        // stderr is drained for the whole run (a full pipe would stall the emulator); the
        // HTTP listener's address is among its first lines.
        let log = Arc::new(Mutex::new(Vec::new()));
        let (http_tx, http_rx) = tokio::sync::oneshot::channel();
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn({
            let log = log.clone();
            async move {
                let mut http_tx = Some(http_tx);
                while let Ok(Some(line)) = stderr.next_line().await {
                    if let Some(rest) = line.split("HTTP management API: http://").nth(1)
                        && let Some(tx) = http_tx.take()
                    {
                        // The receiver may be gone (no --http-listen wait): nothing to tell.
                        let _ = tx.send(rest.trim_end_matches('/').to_owned());
                    }
                    log.lock().unwrap().push(line);
                }
            }
        });
        let http = if args.contains(&"--http-listen") {
            Some(tokio::time::timeout(BOUND, http_rx).await.unwrap().unwrap())
        } else {
            None
        };
        Spawned {
            _child: child,
            addr,
            http,
            log,
        }
    }

    fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(text))
    }

    /// A session holding a token for `orders` (and its `$management` node).
    async fn session(&self) -> (Connection, Session) {
        let conn = Connection::open(&format!("amqp://{}", self.addr))
            .await
            .unwrap();
        let session = conn.begin().await.unwrap();
        let cbs = RequestResponse::attach(&session, "$cbs").await.unwrap();
        let audience = format!("sb://{}/orders", self.addr);
        let request = Message::builder()
            .application_properties(put_token_properties(&audience))
            .value(sas_token(&audience))
            .build();
        let reply = cbs.request(request).await.unwrap();
        assert_eq!(app(&reply, "status-code"), Some(SimpleValue::Int(202)));
        (conn, session)
    }
}

fn app(reply: &AnyMessage, key: &str) -> Option<SimpleValue> {
    let ApplicationProperties(props) = reply.application_properties.as_ref()?;
    props.get(key).cloned()
}

/// A `com.microsoft:peek-message` request for one message from the start.
fn peek_request() -> Message<AmqpValue<Value>> {
    let mut body = OrderedMap::new();
    body.insert(Value::String("from-sequence-number".into()), Value::Long(0));
    body.insert(Value::String("message-count".into()), Value::Int(1));
    Message::builder()
        .application_properties(
            ApplicationProperties::builder()
                .insert(
                    "operation",
                    SimpleValue::String("com.microsoft:peek-message".into()),
                )
                .build(),
        )
        .body(AmqpValue(Value::Map(body)))
        .build()
}

/// The status line's code of one `GET /orders` on the HTTP management API.
async fn http_status(http: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(http).await.unwrap();
    let request = format!(
        "GET /orders?api-version=2021-05 HTTP/1.1\r\nHost: {http}\r\nAuthorization: {}\r\nConnection: close\r\n\r\n",
        sas_token(&format!("http://{http}/orders"))
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(BOUND, stream.read_to_string(&mut response))
        .await
        .expect("answered")
        .unwrap();
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"))
}

/// `--management-fault busyx2 --management-fault timeout`: the next two `$management` requests
/// are answered 503 with `com.microsoft:server-busy`, the third 408 with
/// `com.microsoft:timeout`, the fourth is handled; the HTTP management API counts its own
/// (503, 503, 408, then the entity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_faults_answer_the_next_requests_of_each_surface_then_stop() {
    let emulator = Spawned::start(&[
        "--http-listen",
        "127.0.0.1:0",
        "--management-fault",
        "busyx2",
        "--management-fault",
        "timeout",
    ])
    .await;
    let (_conn, session) = emulator.session().await;
    let management = RequestResponse::attach(&session, "orders/$management")
        .await
        .unwrap();
    let mut answers = Vec::new();
    for _ in 0..4 {
        let reply = tokio::time::timeout(BOUND, management.request(peek_request()))
            .await
            .expect("answered")
            .unwrap();
        answers.push((app(&reply, "statusCode"), app(&reply, "errorCondition")));
    }
    let symbol = |s: &str| Some(SimpleValue::Symbol(s.into()));
    assert_eq!(
        answers,
        [
            (Some(SimpleValue::Int(503)), symbol(condition::SERVER_BUSY)),
            (Some(SimpleValue::Int(503)), symbol(condition::SERVER_BUSY)),
            (Some(SimpleValue::Int(408)), symbol(condition::TIMEOUT)),
            // An empty queue: "no messages" (204), handled at last.
            (Some(SimpleValue::Int(204)), None),
        ]
    );
    let http = emulator.http.as_deref().unwrap();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(http_status(http).await);
    }
    assert_eq!(statuses, [503, 503, 408, 200]);
}

/// `--management-fault stall`: the first `$management` request is never answered (the
/// client's own bound ends the wait), the next one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_management_request_is_never_answered_and_the_next_one_is() {
    let emulator = Spawned::start(&["--management-fault", "stall"]).await;
    let (_conn, session) = emulator.session().await;
    let management = RequestResponse::attach(&session, "orders/$management")
        .await
        .unwrap();
    let stalled = tokio::time::timeout(
        Duration::from_millis(500),
        management.request(peek_request()),
    )
    .await;
    assert!(stalled.is_err(), "a stalled request gets no reply");
    tokio::time::timeout(BOUND, async {
        while !emulator.logged("Fault: leaving a $management request unanswered.") {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the emulator logged the stall");
    let reply = tokio::time::timeout(BOUND, management.request(peek_request()))
        .await
        .expect("answered")
        .unwrap();
    assert_eq!(app(&reply, "statusCode"), Some(SimpleValue::Int(204)));
}

/// `--settlement-timeouts 1`: the first disposition is neither answered nor applied (the
/// client's settlement times out); the message is still locked, so the same settlement sent
/// again completes it; the next delivery's disposition is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_timeouts_leave_the_next_dispositions_unanswered_and_unapplied() {
    let emulator = Spawned::start(&["--settlement-timeouts", "1"]).await;
    let (_conn, session) = emulator.session().await;
    let sender = session
        .attach_sender(SenderOptions::new("s", "orders"))
        .await
        .unwrap();
    for body in ["m1", "m2"] {
        let message = Message::builder()
            .properties(Properties {
                message_id: Some(sb_amqp::types::messaging::MessageId::String(body.into())),
                ..Properties::default()
            })
            .value(body)
            .build();
        sender
            .send(Sendable::message(&message).unwrap())
            .await
            .unwrap();
    }
    let receiver = session
        .attach_receiver(
            ReceiverOptions::new("r", "orders")
                .rcv_settle_mode(sb_amqp::types::definitions::ReceiverSettleMode::Second),
        )
        .await
        .unwrap();
    receiver.set_credit(2).await.unwrap();
    let first = tokio::time::timeout(BOUND, receiver.recv())
        .await
        .unwrap()
        .unwrap();
    let second = tokio::time::timeout(BOUND, receiver.recv())
        .await
        .unwrap()
        .unwrap();
    let unanswered =
        tokio::time::timeout(Duration::from_millis(500), receiver.accept(&first)).await;
    assert!(unanswered.is_err(), "the first disposition is not answered");
    let outcome = tokio::time::timeout(BOUND, receiver.accept(&second))
        .await
        .expect("the next disposition is answered")
        .unwrap();
    assert!(matches!(outcome, Some(Outcome::Accepted)), "{outcome:?}");
    // Unapplied: the first message is still locked, and settling it again completes it.
    let again = tokio::time::timeout(BOUND, receiver.accept(&first))
        .await
        .expect("answered this time")
        .unwrap();
    assert!(matches!(again, Some(Outcome::Accepted)), "{again:?}");
    assert!(emulator.logged("Fault: leaving a disposition unanswered (--settlement-timeouts)."));
}

/// `--detach-receive-links-after 300`: a receive link is force-detached 300 ms after its
/// attach, with `amqp:link:detach-forced` and the service's "InnerMessageReceiver was closed";
/// a re-attached link delivers and goes the same way; sender links stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_links_are_force_detached_after_the_flag_and_senders_stay() {
    let emulator = Spawned::start(&["--detach-receive-links-after", "300"]).await;
    let (_conn, session) = emulator.session().await;
    let sender = session
        .attach_sender(SenderOptions::new("s", "orders"))
        .await
        .unwrap();
    for round in 0..2 {
        let attached = tokio::time::Instant::now();
        let receiver = session
            .attach_receiver(ReceiverOptions::new(format!("r{round}"), "orders"))
            .await
            .unwrap();
        receiver.set_credit(1).await.unwrap();
        if round == 1 {
            // A re-attached link works until its own detach.
            let message = Message::builder().value("m").build();
            sender
                .send(Sendable::message(&message).unwrap())
                .await
                .unwrap();
            let delivery = tokio::time::timeout(BOUND, receiver.recv())
                .await
                .unwrap()
                .unwrap();
            receiver.accept(&delivery).await.unwrap();
        }
        let error = tokio::time::timeout(BOUND, receiver.recv())
            .await
            .expect("detached within the bound")
            .unwrap_err();
        assert!(
            attached.elapsed() >= Duration::from_millis(300),
            "never before the flag's delay"
        );
        assert_eq!(error.condition(), Some(condition::DETACH_FORCED), "{error}");
        let text = error.amqp_error().unwrap().description.clone().unwrap();
        assert!(text.contains("InnerMessageReceiver was closed"), "{text}");
        assert!(sender.is_attached(), "sender links are not detached");
    }
    let message = Message::builder().value("after").build();
    sender
        .send(Sendable::message(&message).unwrap())
        .await
        .unwrap();
}

/// A `sb-servicebus` client of the spawned emulator; its busy pause short, so that a test
/// waits for the fault's effect, not the .NET-like 10 s pause.
fn client(emulator: &Spawned) -> sb_servicebus::ServiceBusClient {
    let cs: sb_servicebus::ConnectionString = format!(
        "Endpoint=sb://{}/;SharedAccessKeyName={};SharedAccessKey={};UseDevelopmentEmulator=true;",
        emulator.addr,
        sb_emulator::KEY_NAME,
        sb_emulator::KEY
    )
    .parse()
    .unwrap();
    sb_servicebus::ServiceBusClient::from_connection_string(&cs)
        .with_server_busy_wait(Duration::from_millis(100))
}

/// Our client against `--management-fault busyx2`: the first two lock renewals are refused as
/// transient (retried by the lock keeper, as the SDKs retry a busy answer), the third renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_sees_busy_management_answers_as_transient_and_renews_after_them() {
    let emulator = Spawned::start(&["--management-fault", "busyx2"]).await;
    let client = client(&emulator);
    client
        .sender("orders")
        .send(sb_servicebus::ServiceBusMessage::new("m"))
        .await
        .unwrap();
    let receiver = client.receiver("orders", 0);
    let delivery = tokio::time::timeout(BOUND, receiver.receive_message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for _ in 0..2 {
        let refused = delivery.renew_lock().await.unwrap_err();
        assert!(
            matches!(refused, sb_servicebus::SettlementError::Transient(_)),
            "{refused}"
        );
    }
    delivery.renew_lock().await.unwrap();
    delivery.complete().await.unwrap();
}

/// Our client against `--settlement-timeouts 1`: the completion's first disposition is never
/// answered; the client's bound ends the wait, it settles again, and the message is completed
/// (nothing left to peek).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_completes_a_message_whose_first_disposition_was_never_answered() {
    let emulator = Spawned::start(&["--settlement-timeouts", "1"]).await;
    let client = client(&emulator).with_timeout(Duration::from_millis(500));
    client
        .sender("orders")
        .send(sb_servicebus::ServiceBusMessage::new("m"))
        .await
        .unwrap();
    let receiver = client.receiver("orders", 0);
    let delivery = tokio::time::timeout(BOUND, receiver.receive_message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tokio::time::timeout(BOUND, delivery.complete())
        .await
        .expect("settled within the bound")
        .unwrap();
    assert!(emulator.logged("Fault: leaving a disposition unanswered (--settlement-timeouts)."));
    let left = client.peek("orders", 0, 10).await.unwrap();
    assert!(left.is_empty(), "completed: {left:?}");
}
