//! The client's receive, settle, renew and send against the emulator.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use std::sync::Arc;

use sb_inbox::entra::EntraCredential;
use sb_inbox::servicebus::{
    ConnectionString, EntraProvider, SERVICE_BUS_SCOPE, SendErrorKind, ServiceBusClient,
};
use sb_inbox::{
    Delivery, Message, PropertyValue, ReceiveError, Receiver, SendFailure, Sender, SettleError,
};

use crate::support::emulator::{client, emulator, queue, start};
use crate::support::orders::order_with_lines;

/// Order `id` under message id `id`: one unit of `A`.
fn order(id: &str) -> Message {
    order_with_lines(id, id, &[("A", 1)])
}

#[tokio::test]
async fn send_receive_complete_keeps_every_field() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    let mut message = order("m-1");
    message.correlation_id = Some("c-1".into());
    message
        .application_properties
        .insert("tenant".into(), "t1".into());
    client.sender("orders").send(message.clone()).await.unwrap();

    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    assert_eq!(delivery.message(), &message);
    assert_eq!(delivery.delivery_count(), 0);
    assert!(!delivery.lock_token().is_nil());
    let lock_left = delivery
        .locked_until()
        .duration_since(SystemTime::now())
        .unwrap();
    assert!(
        lock_left > Duration::from_secs(25) && lock_left <= Duration::from_secs(30),
        "{lock_left:?}"
    );
    assert_eq!(delivery.sequence_number(), Some(1));
    delivery.complete().await.unwrap();
    assert_eq!(
        emulator.broker().entity("orders").unwrap().counts().active,
        0
    );
}

#[tokio::test]
async fn abandon_redelivers_with_the_properties_and_a_higher_count() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    client.sender("orders").send(order("m-1")).await.unwrap();
    let receiver = client.receiver("orders", 0);
    let first = receiver.receive().await.unwrap().unwrap();
    let mut properties = BTreeMap::new();
    properties.insert(
        "sb-inbox-last-error".to_owned(),
        PropertyValue::String("timeout".into()),
    );
    first.abandon(properties).await.unwrap();
    let second = receiver.receive().await.unwrap().unwrap();
    assert_eq!(second.delivery_count(), 1);
    assert_eq!(
        second
            .message()
            .application_properties
            .get("sb-inbox-last-error"),
        Some(&PropertyValue::String("timeout".into()))
    );
    second.complete().await.unwrap();
}

#[tokio::test]
async fn publisher_schedules_with_the_enqueue_time() {
    let emulator = emulator("PT30S").await;
    let publisher = sb_inbox::servicebus::ServiceBusSenderPort::new(client(&emulator).clone());
    let later = SystemTime::now() + Duration::from_secs(3600);
    publisher
        .send("orders", order("m-later"), Some(later))
        .await
        .unwrap();
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.scheduled, counts.active), (1, 0));

    let past = SystemTime::now() - Duration::from_secs(1);
    publisher
        .send("orders", order("m-now"), Some(past))
        .await
        .unwrap();
    publisher
        .send("orders", order("m-plain"), None)
        .await
        .unwrap();
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.scheduled, counts.active), (1, 2));

    let missing = publisher.send("no-such-queue", order("m-x"), None).await;
    assert!(
        matches!(missing, Err(SendFailure::Permanent(_))),
        "{missing:?}"
    );
}

#[tokio::test]
async fn dead_letter_carries_reason_and_description() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    client.sender("orders").send(order("m-1")).await.unwrap();
    let delivery = receive_one(&client).await;
    delivery
        .dead_letter("InvalidPayload", "invalid JSON at line 1 column 2")
        .await
        .unwrap();
    let dead = client
        .receiver("orders/$DeadLetterQueue", 0)
        .receive()
        .await
        .unwrap()
        .unwrap();
    let props = &dead.message().application_properties;
    assert_eq!(
        props.get("DeadLetterReason"),
        Some(&PropertyValue::String("InvalidPayload".into()))
    );
    assert_eq!(
        props.get("DeadLetterErrorDescription"),
        Some(&PropertyValue::String(
            "invalid JSON at line 1 column 2".into()
        ))
    );
    assert_eq!(dead.message().message_id.as_deref(), Some("m-1"));
    dead.complete().await.unwrap();
}

#[tokio::test]
async fn renew_extends_and_an_expired_lock_is_lost_on_settle_and_renew() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    client.sender("orders").send(order("m-1")).await.unwrap();
    let delivery = receive_one(&client).await;
    let before = delivery.locked_until();
    let renewed = delivery.renew_lock().await.unwrap();
    assert!(renewed >= before);
    assert_eq!(delivery.locked_until(), renewed);

    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .expire_lock(delivery.lock_token())
        .unwrap();
    assert_eq!(delivery.complete().await, Err(SettleError::LockLost));
    assert_eq!(delivery.renew_lock().await, Err(SettleError::LockLost));
}

#[tokio::test]
async fn refused_renewals_surface_as_lock_lost() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    client.sender("orders").send(order("m-1")).await.unwrap();
    let delivery = receive_one(&client).await;
    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .refuse_renewals(1)
        .unwrap();
    assert_eq!(delivery.renew_lock().await, Err(SettleError::LockLost));
}

#[tokio::test]
async fn unknown_entity_and_bad_key_are_permanent_errors() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    let error = client.receiver("nope", 0).receive().await.unwrap_err();
    assert!(
        matches!(&error, ReceiveError::Permanent(text) if text.to_string().contains("not found")),
        "{error:?}"
    );
    let error = client.sender("nope").send(order("m")).await.unwrap_err();
    assert!(
        matches!(error.error, SendErrorKind::NotFound(_)),
        "{error:?}"
    );
    assert_eq!(
        error.message.message_id.as_deref(),
        Some("m"),
        "the message is handed back"
    );

    let bad: ConnectionString = emulator
        .connection_string()
        .replace("SAS_KEY_VALUE", "wrong")
        .parse()
        .unwrap();
    let error = ServiceBusClient::from_connection_string(&bad)
        .receiver("orders", 0)
        .receive()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ReceiveError::Permanent(text) if text.to_string().contains("401")),
        "{error:?}"
    );
}

#[tokio::test]
async fn dropped_connection_fences_old_deliveries_and_the_receiver_recovers() {
    // A short lock: if the old link took the redelivery before the close reached it, the
    // message comes back once more after this lock, as on Service Bus. The lock of `first` is
    // dropped with its connection, as the service drops it (issue 29).
    let emulator = emulator("PT2S").await;
    let client = client(&emulator);
    let sender = client.sender("orders");
    sender.send(order("m-1")).await.unwrap();
    let receiver = client.receiver("orders", 0);
    let first = receiver.receive().await.unwrap().unwrap();
    emulator.drop_all_connections();
    // The first receive after the loss may fail transiently; the next one reconnects.
    let mut again = None;
    for _ in 0..5 {
        match receiver.receive().await {
            Ok(delivery) => {
                again = delivery;
                break;
            }
            Err(ReceiveError::Transient(_)) => {}
            Err(error) => panic!("{error:?}"),
        }
    }
    let again = again.expect("redelivered once the connection's lock was dropped");
    assert_eq!(again.message().message_id.as_deref(), Some("m-1"));
    assert!(again.delivery_count() >= 1);
    assert_eq!(
        first.renew_lock().await,
        Err(SettleError::LockLost),
        "the old link is fenced"
    );
    assert_eq!(first.complete().await, Err(SettleError::LockLost));
    again.complete().await.unwrap();
}

/// An Entra ID credential double: records the scopes it was asked for.
#[derive(Debug, Default)]
struct FakeEntra {
    scopes: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl azure_core::credentials::TokenCredential for FakeEntra {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<azure_core::credentials::AccessToken> {
        self.scopes
            .lock()
            .unwrap()
            .extend(scopes.iter().map(|s| (*s).to_owned()));
        let expires =
            azure_core::time::OffsetDateTime::now_utc() + azure_core::time::Duration::hours(1);
        Ok(azure_core::credentials::AccessToken::new(
            "eyJhbGciOiJub25lIn0.eyJhdWQiOiJodHRwczovL3NlcnZpY2VidXMuYXp1cmUubmV0In0.",
            expires,
        ))
    }
}

fn entra_client(emulator: &sb_emulator::Emulator, fake: &Arc<FakeEntra>) -> ServiceBusClient {
    let credential = EntraCredential::from_credential(fake.clone());
    ServiceBusClient::new(
        format!("amqp://{}", emulator.local_addr()),
        "sbemulatorns.servicebus.windows.net",
        Arc::new(EntraProvider::new(credential)),
    )
}

#[tokio::test]
async fn entra_id_tokens_are_put_as_jwt_for_the_service_bus_scope() {
    let options = sb_emulator::EmulatorOptions {
        accept_jwt: true,
        ..Default::default()
    };
    let emulator = start(
        vec![queue("orders", sb_emulator::EntityProperties::default())],
        options,
    )
    .await;
    let fake = Arc::new(FakeEntra::default());
    let client = entra_client(&emulator, &fake);
    client.sender("orders").send(order("m-1")).await.unwrap();
    let delivery = receive_one(&client).await;
    delivery.complete().await.unwrap();
    let scopes = fake.scopes.lock().unwrap().clone();
    assert!(!scopes.is_empty());
    assert!(scopes.iter().all(|s| s == SERVICE_BUS_SCOPE), "{scopes:?}");

    // The same token against an emulator that refuses JWTs: the client reports it as an
    // authorization failure, not as a connection problem.
    let strict = crate::support::emulator::emulator("PT30S").await;
    let client = entra_client(&strict, &fake);
    let error = client
        .sender("orders")
        .send(order("m-2"))
        .await
        .unwrap_err();
    assert!(!error.error.is_transient(), "{error}");
    assert!(error.to_string().contains("JWT"), "{error}");
}

/// The next delivery of `orders`.
async fn receive_one(client: &ServiceBusClient) -> sb_inbox::servicebus::ServiceBusDelivery {
    client
        .receiver("orders", 0)
        .receive()
        .await
        .unwrap()
        .unwrap()
}

/// Peek pages past the 100 messages one request returns, in sequence order, locks nothing and
/// carries every field; an unknown entity is `NotFound`.
#[tokio::test]
async fn peek_pages_in_sequence_order_without_locking() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    let sender = client.sender("orders");
    for i in 0..130 {
        let mut message = order(&format!("m-{i}"));
        message
            .application_properties
            .insert("n".into(), PropertyValue::Long(i));
        sender.send(message).await.unwrap();
    }
    let peeked = client.peek("orders", 0, 120).await.unwrap();
    assert_eq!(peeked.len(), 120);
    for (i, p) in (0..).zip(&peeked) {
        assert_eq!(p.message.message_id, Some(format!("m-{i}")));
        assert_eq!(
            p.message.application_properties.get("n"),
            Some(&sb_servicebus::PropertyValue::Long(i))
        );
        assert_eq!(p.message.body, order(&format!("m-{i}")).body);
        assert_eq!(p.delivery_count, 0);
    }
    assert!(
        peeked
            .windows(2)
            .all(|w| w[0].sequence_number < w[1].sequence_number)
    );
    let rest = client
        .peek("orders", peeked[119].sequence_number + 1, 50)
        .await
        .unwrap();
    assert_eq!(rest.len(), 10);
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.active, counts.locked), (130, 0));
    let missing = client.peek("nope", 0, 1).await;
    assert!(
        matches!(
            missing,
            Err(sb_inbox::servicebus::ServiceBusError::NotFound(_))
        ),
        "{missing:?}"
    );
}

/// Issue 21: peek of a queue and of its dead-letter queue from a fresh connection whose first
/// link is the `$management` node (no receiver or sender on that entity first), as
/// `sb-inbox dlq peek` does.
#[tokio::test]
async fn peek_and_dead_letter_peek_work_from_a_fresh_connection() {
    let emulator = emulator("PT30S").await;
    let writer = client(&emulator);
    for id in ["m-1", "m-2"] {
        writer.sender("orders").send(order(id)).await.unwrap();
    }
    receive_one(&writer)
        .await
        .dead_letter("Poison", "bad body")
        .await
        .unwrap();

    let fresh = client(&emulator);
    let dead = fresh.peek("orders/$DeadLetterQueue", 0, 10).await.unwrap();
    assert_eq!(
        dead.iter()
            .map(|p| p.message.message_id.as_deref())
            .collect::<Vec<_>>(),
        [Some("m-1")]
    );
    let fresh = client(&emulator);
    let active = fresh.peek("orders", 0, 10).await.unwrap();
    assert_eq!(
        active
            .iter()
            .map(|p| p.message.message_id.as_deref())
            .collect::<Vec<_>>(),
        [Some("m-2")]
    );
}

/// Issue 21: renewals of many locks at once, all in flight on one receiver's management link,
/// each answered by correlation id.
#[tokio::test]
async fn concurrent_renewals_on_one_management_link() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    let sender = client.sender("orders");
    for i in 0..16 {
        sender.send(order(&format!("m-{i}"))).await.unwrap();
    }
    let receiver = client.receiver("orders", 16);
    let mut deliveries = Vec::new();
    while deliveries.len() < 16 {
        deliveries.push(receiver.receive().await.unwrap().unwrap());
    }
    let mut renewals = tokio::task::JoinSet::new();
    for delivery in deliveries {
        renewals.spawn(async move {
            let before = delivery.locked_until();
            let renewed = delivery.renew_lock().await;
            (delivery, before, renewed)
        });
    }
    while let Some(joined) = renewals.join_next().await {
        let (delivery, before, renewed) = joined.unwrap();
        let renewed = renewed.unwrap();
        assert!(renewed >= before, "{renewed:?} < {before:?}");
        assert_eq!(delivery.locked_until(), renewed);
        delivery.complete().await.unwrap();
    }
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.active, counts.locked, counts.completed), (0, 0, 16));
}

/// Found by the external suite: a link the peer detached is dropped later, by which time its
/// handle belongs to a new link; that late detach must not end the new link. Here the
/// emulator's side of a closed receiver and of a dropped sender ends while the client attaches a
/// new receiver on the freed handle; it races, so the sequence runs 30 times (two worker
/// threads: the emulator's link task ends on one while the client attaches on the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_link_on_a_freed_handle_survives_the_old_links_late_detach() {
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);
    let mut receiver = client.receiver("orders", 0);
    for i in 0..30 {
        let id = format!("m-{i}");
        client.sender("orders").send(order(&id)).await.unwrap();
        let delivery = tokio::time::timeout(Duration::from_secs(10), receiver.receive())
            .await
            .expect("a delivery in time");
        let delivery = delivery
            .unwrap_or_else(|e| panic!("round {i}: {e:?}"))
            .unwrap();
        assert_eq!(delivery.message().message_id, Some(id));
        delivery.complete().await.unwrap();
        receiver.close().await;
        receiver = client.receiver("orders", 0);
    }
}
