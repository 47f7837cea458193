//! The emulator is as strict as Azure Service Bus (issue 13): idle links force-detached with the
//! service's text, links detached when their token expires, the service's `open`, forced
//! detaches on demand, and the command-line faults. Raw sb-amqp clients, so each test sees the
//! exact frames; in-process ones run on tokio's paused clock.

use std::time::{Duration, SystemTime};

use sb_amqp::types::definitions::ReceiverSettleMode;
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Message};
use sb_amqp::types::primitives::SimpleValue;
use sb_amqp::{
    AmqpError, Connection, Outcome, ReceiverOptions, RequestResponse, Sendable, SenderOptions,
    Session, condition,
};
use sb_emulator::{
    Emulator, EmulatorOptions, Fault, KEY, KEY_NAME, LinkRole, Right, Rights, SharedAccessPolicy,
};
use sb_inbox::servicebus::sign_sas;

/// The shared `orders` queue (lock 30 s) served with `options`.
pub(crate) async fn strict_emulator(options: EmulatorOptions) -> Emulator {
    crate::support::emulator::emulator_with("PT30S", options).await
}

/// Opens a connection and a session and puts a one-hour SAS token for `entity` on `$cbs`.
pub(crate) async fn authorized(
    emulator: &Emulator,
    entity: &str,
) -> (Connection, Session, RequestResponse) {
    let conn = Connection::open(&format!("amqp://{}", emulator.local_addr()))
        .await
        .unwrap();
    let session = conn.begin().await.unwrap();
    let cbs = RequestResponse::attach(&session, "$cbs").await.unwrap();
    put_token(emulator, &cbs, entity).await;
    (conn, session, cbs)
}

/// Puts a one-hour root-key token for `entity` on `cbs`.
pub(crate) async fn put_token(emulator: &Emulator, cbs: &RequestResponse, entity: &str) {
    put_token_with(emulator, cbs, entity, KEY_NAME, KEY).await;
}

/// A `$cbs` put-token request for a SAS `token` on `audience`.
pub(crate) fn put_token_request(audience: String, token: String) -> Message<AmqpValue<String>> {
    Message::builder()
        .application_properties(
            ApplicationProperties::builder()
                .insert("operation", SimpleValue::String("put-token".into()))
                .insert(
                    "type",
                    SimpleValue::String("servicebus.windows.net:sastoken".into()),
                )
                .insert("name", SimpleValue::String(audience))
                .build(),
        )
        .value(token)
        .build()
}

/// Puts a one-hour token for `entity` signed with `key_name` / `key`.
async fn put_token_with(
    emulator: &Emulator,
    cbs: &RequestResponse,
    entity: &str,
    key_name: &str,
    key: &str,
) {
    let audience = format!("sb://{}/{entity}", emulator.local_addr());
    let token = sign_sas(
        &audience,
        key_name,
        key,
        SystemTime::now(),
        Duration::from_secs(3600),
    )
    .token;
    let reply = cbs
        .request(put_token_request(audience, token))
        .await
        .unwrap();
    let ApplicationProperties(props) = reply.application_properties.unwrap();
    assert_eq!(props.get("status-code"), Some(&SimpleValue::Int(202)));
}

/// An emulator served with `options`, a connection authorised for `orders`, and a sender on it.
async fn sending(options: EmulatorOptions) -> (Emulator, Connection, Session, sb_amqp::Sender) {
    let emulator = strict_emulator(options).await;
    let (conn, session, _cbs) = authorized(&emulator, "orders").await;
    let sender = session
        .attach_sender(SenderOptions::new("s", "orders"))
        .await
        .unwrap();
    (emulator, conn, session, sender)
}

fn message(id: &str) -> Sendable {
    let message = Message::builder()
        .properties(
            sb_amqp::types::messaging::Properties::builder()
                .message_id(id.to_owned())
                .build(),
        )
        .value("x")
        .build();
    Sendable::message(&message).unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_idle_receiver_is_force_detached_with_the_service_text() {
    let emulator = strict_emulator(EmulatorOptions::default()).await;
    let (_conn, session, _cbs) = authorized(&emulator, "orders").await;
    let started = tokio::time::Instant::now();
    let receiver = session
        .attach_receiver(ReceiverOptions::new("idle-receiver", "orders").credit(10))
        .await
        .unwrap();
    let error = receiver.recv().await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(error.condition(), Some(condition::DETACH_FORCED), "{error}");
    let text = error.amqp_error().unwrap().description.clone().unwrap();
    assert!(
        text.starts_with("The link 'idle-receiver' is force detached. Code: consumer(link"),
        "{text}"
    );
    assert!(
        text.ends_with("Details: AmqpMessageConsumer.IdleTimerExpired: Idle timeout: 00:10:00."),
        "{text}"
    );
    assert!(
        (Duration::from_secs(600)..Duration::from_secs(602)).contains(&waited),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_active_sender_stays_and_an_idle_one_is_detached_as_a_publisher() {
    let emulator =
        strict_emulator(EmulatorOptions::default().with_link_idle_timeout(Duration::from_secs(60)))
            .await;
    let (_conn, session, _cbs) = authorized(&emulator, "orders").await;
    let sender = session
        .attach_sender(SenderOptions::new("busy-sender", "orders"))
        .await
        .unwrap();
    // One send every 40 s for 4 minutes: never 60 s idle, never detached.
    for i in 0..6 {
        tokio::time::sleep(Duration::from_secs(40)).await;
        let outcome = sender.send(message(&format!("m{i}"))).await.unwrap();
        assert!(outcome.is_accepted(), "{outcome:?}");
    }
    assert_eq!(emulator.links().len(), 1);
    let error = sender.next_disposition().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::DETACH_FORCED), "{error}");
    let text = error.amqp_error().unwrap().description.clone().unwrap();
    assert!(
        text.contains("Code: publisher(link")
            && text.ends_with("AmqpMessagePublisher.IdleTimerExpired: Idle timeout: 00:01:00."),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_link_is_detached_when_its_token_expires_unless_refreshed() {
    let emulator = strict_emulator(
        EmulatorOptions::default().with_max_token_lifetime(Duration::from_secs(10)),
    )
    .await;
    let (_conn, session, cbs) = authorized(&emulator, "orders").await;
    let started = tokio::time::Instant::now();
    let sender = session
        .attach_sender(SenderOptions::new("s", "orders"))
        .await
        .unwrap();
    // Refreshed twice before the 10 s cap passes: the link lives on past 20 s.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(8)).await;
        put_token(&emulator, &cbs, "orders").await;
    }
    assert!(sender.send(message("a")).await.unwrap().is_accepted());
    // No more refreshes: detached 10 s after the last put, as the service does it:
    // `amqp:link:detach-forced`, "Code: RenewToken" (issue 29 item 14).
    let error = sender.next_disposition().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::DETACH_FORCED), "{error}");
    assert!(error.to_string().contains("RenewToken"), "{error}");
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(26)..Duration::from_secs(27)).contains(&waited),
        "{waited:?}"
    );
    // A new attach without a fresh token is refused.
    let refused = session
        .attach_sender(SenderOptions::new("s2", "orders"))
        .await
        .unwrap_err();
    assert_eq!(refused.condition(), Some(condition::UNAUTHORIZED_ACCESS));
}

#[tokio::test(start_paused = true)]
async fn links_are_force_detached_on_demand_by_id_or_entity() {
    let emulator = strict_emulator(EmulatorOptions::default()).await;
    let (_conn, session, _cbs) = authorized(&emulator, "orders").await;
    let sender = session
        .attach_sender(SenderOptions::new("publisher", "orders"))
        .await
        .unwrap();
    let receiver = session
        .attach_receiver(
            ReceiverOptions::new("consumer", "orders")
                .credit(5)
                .rcv_settle_mode(ReceiverSettleMode::Second),
        )
        .await
        .unwrap();
    let links = emulator.links();
    assert_eq!(links.len(), 2, "{links:?}");
    let publisher = links.iter().find(|l| l.role == LinkRole::Sender).unwrap();
    assert_eq!(
        (publisher.name.as_str(), publisher.entity.as_str()),
        ("publisher", "orders")
    );
    // Only the publisher: the consumer keeps receiving and settling.
    assert!(emulator.force_detach_link(
        publisher.id,
        AmqpError::new(condition::DETACH_FORCED, Some("test".into()))
    ));
    let error = sender.next_disposition().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::DETACH_FORCED));
    let sender = session
        .attach_sender(SenderOptions::new("publisher-2", "orders"))
        .await
        .unwrap();
    assert!(sender.send(message("m")).await.unwrap().is_accepted());
    let delivery = receiver.recv().await.unwrap();
    assert_eq!(
        receiver.accept(&delivery).await.unwrap(),
        Some(Outcome::Accepted)
    );
    // Every link of the entity.
    let busy = AmqpError::new(condition::SERVER_BUSY, None);
    assert_eq!(emulator.force_detach_entity("ORDERS", busy), 2);
    assert_eq!(
        receiver.recv().await.unwrap_err().condition(),
        Some(condition::SERVER_BUSY)
    );
    assert!(
        !emulator.force_detach_link(publisher.id, AmqpError::new(condition::SERVER_BUSY, None))
    );
}

#[tokio::test]
async fn busy_settle_rejects_the_disposition_and_leaves_the_message_locked() {
    // The reply is settled (the service always settles its answer): the delivery is gone on
    // the wire and the message stays locked, unchanged, until its lock expires.
    let (emulator, _conn, session, sender) = sending(
        EmulatorOptions::default()
            .with_fault(Fault::BusySettle, 1.0)
            .with_fault_seed(1),
    )
    .await;
    assert!(sender.send(message("m")).await.unwrap().is_accepted());
    let receiver = session
        .attach_receiver(
            ReceiverOptions::new("r", "orders")
                .credit(1)
                .rcv_settle_mode(ReceiverSettleMode::Second),
        )
        .await
        .unwrap();
    let delivery = receiver.recv().await.unwrap();
    let outcome = receiver.accept(&delivery).await.unwrap();
    let Some(Outcome::Rejected(Some(error))) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(error.condition, condition::SERVER_BUSY);
    let orders = emulator.broker().entity("orders").unwrap();
    let counts = orders.counts();
    assert_eq!((counts.active, counts.locked), (0, 1), "{counts:?}");
}

#[tokio::test]
async fn detach_link_fault_detaches_with_server_busy_and_drop_connection_closes() {
    let (emulator, _conn, _session, sender) = sending(
        EmulatorOptions::default()
            .with_fault(Fault::DetachLink, 1.0)
            .with_fault_seed(2),
    )
    .await;
    // The transfer is applied, then the only live link is detached.
    let _ = sender.send(message("m")).await;
    let error = sender.next_disposition().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::SERVER_BUSY), "{error}");
    assert_eq!(
        emulator.broker().entity("orders").unwrap().counts().active,
        1
    );

    let (_emulator, conn, _session, sender) = sending(
        EmulatorOptions::default()
            .with_fault(Fault::DropConnection, 1.0)
            .with_fault_seed(3),
    )
    .await;
    let _ = sender.send(message("m")).await;
    let error = conn.closed().await;
    assert_eq!(
        error.condition(),
        Some(condition::CONNECTION_FORCED),
        "{error}"
    );
}

#[tokio::test]
async fn open_carries_the_service_limits() {
    let emulator = strict_emulator(EmulatorOptions::default()).await;
    let conn = Connection::open(&format!("amqp://{}", emulator.local_addr()))
        .await
        .unwrap();
    let open = conn.remote_open();
    assert_eq!(open.max_frame_size.0, 65_536);
    assert_eq!(open.channel_max.0, 4_999);
    assert_eq!(open.idle_time_out, Some(120_000));
}

fn policy(name: &str, rights: &[Right]) -> SharedAccessPolicy {
    SharedAccessPolicy {
        name: name.to_owned(),
        key: format!("{name}-key"),
        rights: rights
            .iter()
            .fold(Rights::default(), |r, right| r.with(*right)),
    }
}

#[tokio::test]
async fn a_key_grants_only_its_rights() {
    let emulator = strict_emulator(
        EmulatorOptions::default()
            .with_policy(policy("sender", &[Right::Send]))
            .with_policy(policy("listener", &[Right::Listen])),
    )
    .await;
    let conn = Connection::open(&format!("amqp://{}", emulator.local_addr()))
        .await
        .unwrap();
    let session = conn.begin().await.unwrap();
    let cbs = RequestResponse::attach(&session, "$cbs").await.unwrap();
    let claims = |error: sb_amqp::Error| {
        assert_eq!(
            error.condition(),
            Some(condition::UNAUTHORIZED_ACCESS),
            "{error}"
        );
        error.amqp_error().unwrap().description.clone().unwrap()
    };

    // Send-only: sends, cannot receive.
    put_token_with(&emulator, &cbs, "orders", "sender", "sender-key").await;
    let sender = session
        .attach_sender(SenderOptions::new("s", "orders"))
        .await
        .unwrap();
    assert!(sender.send(message("m")).await.unwrap().is_accepted());
    let refused = session
        .attach_receiver(ReceiverOptions::new("r", "orders").credit(1))
        .await
        .unwrap_err();
    assert_eq!(
        claims(refused),
        "Unauthorized access. 'Listen' claim(s) are required to perform this operation. Resource: 'orders'."
    );

    // Listen-only (the fresh token replaces the Send one): receives, cannot send.
    put_token_with(&emulator, &cbs, "orders", "listener", "listener-key").await;
    let receiver = session
        .attach_receiver(ReceiverOptions::new("r2", "orders").credit(1))
        .await
        .unwrap();
    let delivery = receiver.recv().await.unwrap();
    receiver.accept(&delivery).await.unwrap();
    let refused = session
        .attach_sender(SenderOptions::new("s2", "orders"))
        .await
        .unwrap_err();
    assert!(claims(refused).contains("'Send' claim(s) are required"));

    // $management: scheduling needs Send, rules need Manage; peek needs Listen.
    let management = RequestResponse::attach(&session, "orders/$management")
        .await
        .unwrap();
    let status = |operation: &str| {
        let request = Message::builder()
            .application_properties(
                ApplicationProperties::builder()
                    .insert("operation", SimpleValue::String(operation.into()))
                    .build(),
            )
            .value(sb_amqp::codec::Value::Map(Default::default()))
            .build();
        let management = &management;
        async move {
            let reply = management.request(request).await.unwrap();
            let ApplicationProperties(props) = reply.application_properties.unwrap();
            props.get("statusCode").cloned()
        }
    };
    assert_eq!(
        status("com.microsoft:schedule-message").await,
        Some(SimpleValue::Int(401))
    );
    assert_eq!(
        status("com.microsoft:add-rule").await,
        Some(SimpleValue::Int(401))
    );
    assert_ne!(
        status("com.microsoft:peek-message").await,
        Some(SimpleValue::Int(401))
    );
    // An unknown key name is refused at put-token.
    let audience = format!("sb://{}/orders", emulator.local_addr());
    let token = sign_sas(
        &audience,
        "nobody",
        "x",
        SystemTime::now(),
        Duration::from_secs(60),
    )
    .token;
    let request = put_token_request(audience, token);
    let ApplicationProperties(props) = cbs
        .request(request)
        .await
        .unwrap()
        .application_properties
        .unwrap();
    assert_eq!(props.get("status-code"), Some(&SimpleValue::Int(401)));
}
