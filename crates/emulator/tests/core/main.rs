//! Broker core integration tests, all on tokio's paused clock (`start_paused = true` and
//! `tokio::time::advance`): no test sleeps for real.

#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sb_emulator::{
    Broker, BrokerMessage, Config, CorrelationFilter, DispositionStatus, Entity, EntityProperties,
    Error, Filter, MessageState, Properties, PropertyValue, QueueConfig, ReceiveMode, Rule,
    SendOutcome, Settlement, SqlFilter, SubscriptionConfig, TopicConfig, TopicProperties,
};
use tokio::time::advance;

const SEC: Duration = Duration::from_secs(1);
const WAIT: Option<Duration> = Some(Duration::from_millis(10));

fn props(f: impl FnOnce(&mut EntityProperties)) -> EntityProperties {
    let mut p = EntityProperties {
        lock_duration: Duration::from_secs(5),
        max_delivery_count: 3,
        ..EntityProperties::default()
    };
    f(&mut p);
    p
}

fn queue_broker(p: EntityProperties) -> (Broker, Entity) {
    let broker =
        Broker::new(Config::new("ns").with_queue(QueueConfig::new("q").with_properties(p)))
            .unwrap();
    let q = broker.entity("q").unwrap();
    (broker, q)
}

fn msg(id: &str) -> BrokerMessage {
    BrokerMessage::new(format!("body-{id}")).with_message_id(id)
}

async fn recv(e: &Entity) -> sb_emulator::ReceivedMessage {
    e.receive(ReceiveMode::PeekLock, WAIT)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no message on {}", e.path()))
}

fn token(m: &sb_emulator::ReceivedMessage) -> uuid::Uuid {
    m.lock_token
        .expect("peek-lock deliveries carry a lock token")
}

#[tokio::test(start_paused = true)]
async fn lock_expiry_redelivers_with_delivery_count_plus_one() {
    let (broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    let first = recv(&q).await;
    assert_eq!(first.delivery_count, 0);
    assert_eq!(first.sequence_number, 1);
    assert_eq!(
        first.locked_until,
        Some(first.enqueued_time + Duration::from_secs(5))
    );
    assert!(
        q.try_receive(ReceiveMode::PeekLock).unwrap().is_none(),
        "locked"
    );
    advance(Duration::from_millis(4_999)).await;
    assert!(
        q.try_receive(ReceiveMode::PeekLock).unwrap().is_none(),
        "still locked"
    );
    advance(Duration::from_millis(1)).await;
    let second = q.try_receive(ReceiveMode::PeekLock).unwrap().unwrap();
    assert_eq!(second.sequence_number, 1);
    assert_eq!(second.delivery_count, 1);
    assert_ne!(second.lock_token, first.lock_token);
    assert_eq!(
        second.locked_until,
        Some(broker.clock().now() + Duration::from_secs(5))
    );
    // The old token is gone.
    let err = q.complete(token(&first)).await.unwrap_err();
    assert!(err.is_lock_lost(), "{err}");
    assert_eq!(err.condition(), "com.microsoft:message-lock-lost");
    q.complete(token(&second)).await.unwrap();
    assert_eq!(q.counts().completed, 1);
}

#[tokio::test(start_paused = true)]
async fn waiting_receiver_gets_the_message_when_its_lock_expires() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    let first = recv(&q).await;
    let q2 = q.clone();
    let waiter = tokio::spawn(async move { q2.receive(ReceiveMode::PeekLock, None).await });
    tokio::task::yield_now().await;
    advance(Duration::from_secs(5)).await;
    let again = waiter.await.unwrap().unwrap().unwrap();
    assert_eq!(again.sequence_number, first.sequence_number);
    assert_eq!(again.delivery_count, 1);
}

#[tokio::test(start_paused = true)]
async fn abandon_redelivers_and_merges_properties_to_modify() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a").with_property("kept", 1)).unwrap();
    let m = recv(&q).await;
    let mut modify = Properties::new();
    modify.insert("attempt".into(), PropertyValue::Long(1));
    q.abandon(token(&m), modify).await.unwrap();
    let m = recv(&q).await;
    assert_eq!(m.delivery_count, 1);
    let props = &m.message.application_properties;
    assert_eq!(props.get("attempt"), Some(&PropertyValue::Long(1)));
    assert_eq!(props.get("kept"), Some(&PropertyValue::Long(1)));
    assert_eq!(
        m.message.properties_to_modify.keys().collect::<Vec<_>>(),
        ["attempt"],
        "the overlay holds only what the wire layer must re-encode"
    );
    // Release does not count as an attempt.
    q.settle(token(&m), Settlement::Release).await.unwrap();
    assert_eq!(recv(&q).await.delivery_count, 1);
}

#[tokio::test(start_paused = true)]
async fn max_delivery_count_dead_letters_with_reason() {
    let (broker, q) = queue_broker(props(|p| p.max_delivery_count = 2));
    q.send(msg("a")).unwrap();
    let m = recv(&q).await;
    q.abandon(token(&m), Properties::new()).await.unwrap();
    let m = recv(&q).await;
    assert_eq!(m.delivery_count, 1);
    // The second failure, by lock expiry, reaches MaxDeliveryCount.
    advance(Duration::from_secs(5)).await;
    assert!(q.try_receive(ReceiveMode::PeekLock).unwrap().is_none());
    let counts = q.counts();
    assert_eq!(
        (counts.active, counts.locked, counts.dead_lettered),
        (0, 0, 1)
    );
    let dlq = broker.entity("q/$DeadLetterQueue").unwrap();
    assert!(dlq.is_dead_letter_queue());
    let d = recv(&dlq).await;
    assert_eq!(d.dead_letter_reason(), Some("MaxDeliveryCountExceeded"));
    assert!(d.dead_letter_description().is_some());
    assert_eq!(d.delivery_count, 2);
    assert_eq!(d.dead_letter_source.as_deref(), Some("q"));
    assert_eq!(
        d.expires_at, None,
        "TTL does not apply in the dead-letter queue"
    );
    assert_eq!(d.message.message_id.as_deref(), Some("a"));
    dlq.complete(token(&d)).await.unwrap();
    assert_eq!(q.counts().dead_lettered, 0);
}

#[tokio::test(start_paused = true)]
async fn max_delivery_count_one_dead_letters_on_first_abandon() {
    let (broker, q) = queue_broker(props(|p| p.max_delivery_count = 1));
    q.send(msg("a")).unwrap();
    let m = recv(&q).await;
    q.abandon(token(&m), Properties::new()).await.unwrap();
    let dlq = broker
        .entity("amqp://localhost/Q/$deadletterqueue")
        .unwrap();
    assert_eq!(
        recv(&dlq).await.dead_letter_reason(),
        Some("MaxDeliveryCountExceeded")
    );
}

#[tokio::test(start_paused = true)]
async fn explicit_dead_letter_sets_reason_and_description() {
    let (broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    let m = recv(&q).await;
    q.dead_letter(
        token(&m),
        Some("Poison".into()),
        Some("cannot parse".into()),
        Properties::new(),
    )
    .await
    .unwrap();
    let dlq = broker.entity("q/$DeadLetterQueue").unwrap();
    let d = recv(&dlq).await;
    assert_eq!(d.dead_letter_reason(), Some("Poison"));
    assert_eq!(d.dead_letter_description(), Some("cannot parse"));
    assert_eq!(
        d.message.properties_to_modify.get("DeadLetterReason"),
        Some(&PropertyValue::from("Poison"))
    );
    // Dead-lettering again from the dead-letter queue is not allowed.
    let err = dlq
        .settle(token(&d), Settlement::dead_letter("again", "no"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotAllowed { .. }), "{err}");
    // Abandon in the DLQ redelivers there with delivery count + 1.
    dlq.abandon(token(&d), Properties::new()).await.unwrap();
    assert_eq!(recv(&dlq).await.delivery_count, 1);
    // Sending to a dead-letter queue is not allowed.
    assert!(matches!(dlq.send(msg("x")), Err(Error::NotAllowed { .. })));
}

#[tokio::test(start_paused = true)]
async fn ttl_expired_message_is_dropped() {
    let (_broker, q) = queue_broker(props(|p| p.default_message_time_to_live = 10 * SEC));
    q.send(msg("a")).unwrap();
    advance(Duration::from_millis(9_999)).await;
    assert_eq!(q.peek(1, 10).unwrap().len(), 1);
    advance(Duration::from_millis(1)).await;
    assert!(q.try_receive(ReceiveMode::PeekLock).unwrap().is_none());
    let c = q.counts();
    assert_eq!((c.active, c.expired, c.dead_lettered), (0, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn ttl_is_the_smaller_of_header_and_default_and_dead_letters_when_configured() {
    let (broker, q) = queue_broker(props(|p| {
        p.default_message_time_to_live = 10 * SEC;
        p.dead_lettering_on_message_expiration = true;
        p.lock_duration = 60 * SEC;
    }));
    let mut short = msg("short");
    short.time_to_live = Some(2 * SEC);
    let mut long = msg("long");
    long.time_to_live = Some(3_600 * SEC);
    q.send(short).unwrap();
    q.send(long).unwrap();
    advance(2 * SEC).await;
    let m = recv(&q).await;
    assert_eq!(m.message.message_id.as_deref(), Some("long"));
    assert_eq!(m.expires_at, Some(m.enqueued_time + 10 * SEC));
    let dlq = broker.entity("q/$DeadLetterQueue").unwrap();
    let d = recv(&dlq).await;
    assert_eq!(d.message.message_id.as_deref(), Some("short"));
    assert_eq!(d.dead_letter_reason(), Some("TTLExpiredException"));
    // A locked message does not expire under its lock; it expires once unlocked.
    advance(9 * SEC).await;
    q.abandon(token(&m), Properties::new()).await.unwrap();
    assert!(q.try_receive(ReceiveMode::PeekLock).unwrap().is_none());
    assert_eq!(q.counts().expired, 2);
    assert_eq!(
        dlq.counts().active,
        1,
        "one left in the DLQ (the other is locked)"
    );
}

#[tokio::test(start_paused = true)]
async fn duplicate_detection_window() {
    let (_broker, q) = queue_broker(props(|p| {
        p.requires_duplicate_detection = true;
        p.duplicate_detection_history_time_window = 10 * SEC;
    }));
    assert!(matches!(
        q.send(msg("a")).unwrap(),
        SendOutcome::Accepted { sequence_number: 1 }
    ));
    advance(9 * SEC).await;
    assert_eq!(q.send(msg("a")).unwrap(), SendOutcome::Duplicate);
    assert!(q.send(msg("b")).unwrap().sequence_number().is_some());
    advance(SEC).await;
    assert_eq!(q.send(msg("a")).unwrap().sequence_number(), Some(3));
    let c = q.counts();
    assert_eq!((c.active, c.sent, c.duplicates), (3, 3, 1));
}

#[tokio::test(start_paused = true)]
async fn no_duplicate_detection_unless_required() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    assert!(q.send(msg("a")).unwrap().sequence_number().is_some());
}

#[tokio::test(start_paused = true)]
async fn scheduled_messages_appear_at_their_time_and_can_be_cancelled() {
    let (broker, q) = queue_broker(props(|_| {}));
    let now = broker.clock().now();
    let mut later = msg("later");
    later.scheduled_enqueue_time = Some(now + 10 * SEC);
    let mut cancelled = msg("cancelled");
    cancelled.scheduled_enqueue_time = Some(now + 10 * SEC);
    let seqs = q.schedule(vec![later, cancelled]).unwrap();
    assert_eq!(seqs, vec![1, 2]);
    assert_eq!(q.counts().scheduled, 2);
    q.cancel_scheduled(&[2, 99]).unwrap();
    assert_eq!(q.counts().scheduled, 1);
    let peeked = q.peek(1, 10).unwrap();
    assert_eq!(peeked.len(), 1);
    assert_eq!(peeked[0].state, MessageState::Scheduled);
    // A waiting receiver wakes at the scheduled time.
    let q2 = q.clone();
    let waiter = tokio::spawn(async move { q2.receive(ReceiveMode::PeekLock, None).await });
    tokio::task::yield_now().await;
    advance(Duration::from_millis(9_999)).await;
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    advance(Duration::from_millis(1)).await;
    let m = waiter.await.unwrap().unwrap().unwrap();
    assert_eq!(m.message.message_id.as_deref(), Some("later"));
    assert_eq!(m.state, MessageState::Active);
    assert_eq!(m.enqueued_time, now + 10 * SEC);
    // Cancelling a message that is no longer scheduled does nothing.
    q.cancel_scheduled(&[1]).unwrap();
    q.complete(token(&m)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn defer_and_receive_deferred() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    q.send(msg("b")).unwrap();
    let a = recv(&q).await;
    q.defer(token(&a), Properties::new()).await.unwrap();
    // Deferred messages are invisible to receive.
    let b = recv(&q).await;
    assert_eq!(b.message.message_id.as_deref(), Some("b"));
    assert!(q.try_receive(ReceiveMode::PeekLock).unwrap().is_none());
    assert_eq!(q.counts().deferred, 1);
    let err = q
        .receive_deferred(&[a.sequence_number, 42], ReceiveMode::PeekLock)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::MessageNotFound {
                sequence_number: 42
            }
        ),
        "{err}"
    );
    let got = q
        .receive_deferred(&[a.sequence_number], ReceiveMode::PeekLock)
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].state, MessageState::Deferred);
    let t = token(&got[0]);
    // Locked: not receivable by sequence number twice.
    assert!(
        q.receive_deferred(&[a.sequence_number], ReceiveMode::PeekLock)
            .is_err()
    );
    // Abandon keeps it deferred (with delivery count + 1).
    q.abandon(t, Properties::new()).await.unwrap();
    let got = q
        .receive_deferred(&[a.sequence_number], ReceiveMode::PeekLock)
        .unwrap();
    assert_eq!(got[0].delivery_count, 1);
    // Lock expiry keeps it deferred too.
    advance(5 * SEC).await;
    let got = q
        .receive_deferred(&[a.sequence_number], ReceiveMode::ReceiveAndDelete)
        .unwrap();
    assert_eq!(got[0].delivery_count, 2);
    assert_eq!(got[0].lock_token, None);
    assert_eq!(q.counts().deferred, 0);
}

#[tokio::test(start_paused = true)]
async fn peek_returns_active_locked_deferred_and_scheduled_in_sequence_order() {
    let (broker, q) = queue_broker(props(|_| {}));
    for id in ["1", "2", "3", "4"] {
        q.send(msg(id)).unwrap();
    }
    let mut s = msg("5");
    s.scheduled_enqueue_time = Some(broker.clock().now() + 60 * SEC);
    q.schedule(vec![s]).unwrap();
    let locked = recv(&q).await; // 1
    let deferred = recv(&q).await; // 2
    q.defer(token(&deferred), Properties::new()).await.unwrap();
    let dead = recv(&q).await; // 3
    q.dead_letter(token(&dead), None, None, Properties::new())
        .await
        .unwrap();
    let all = q.peek(1, 100).unwrap();
    let seqs: Vec<i64> = all.iter().map(|m| m.sequence_number).collect();
    assert_eq!(
        seqs,
        vec![1, 2, 4, 5],
        "dead-lettered messages are not peeked"
    );
    let states: Vec<MessageState> = all.iter().map(|m| m.state).collect();
    assert_eq!(
        states,
        [
            MessageState::Active,
            MessageState::Deferred,
            MessageState::Active,
            MessageState::Scheduled
        ]
    );
    assert!(
        all.iter().all(|m| m.lock_token.is_none()),
        "peek never locks"
    );
    assert_eq!(
        q.peek(2, 2)
            .unwrap()
            .iter()
            .map(|m| m.sequence_number)
            .collect::<Vec<_>>(),
        [2, 4]
    );
    assert!(q.peek(6, 10).unwrap().is_empty());
    // Peek changes nothing: the locked message is still locked.
    q.complete(token(&locked)).await.unwrap();
    let dlq = broker.entity("q/$DeadLetterQueue").unwrap();
    assert_eq!(dlq.peek(0, 10).unwrap()[0].sequence_number, 3);
}

fn topic_broker() -> Broker {
    let mut corr = CorrelationFilter {
        label: Some("created".into()),
        ..Default::default()
    };
    corr.properties.insert("region".into(), "eu".into());
    let config = Config::new("ns")
        .with_queue(QueueConfig::new("audit"))
        .with_topic(
            TopicConfig::new("orders")
                .with_subscription(SubscriptionConfig::new("all"))
                .with_subscription(SubscriptionConfig::new("eu-created").with_rule(Rule {
                    name: "corr".into(),
                    filter: Filter::Correlation(corr),
                    action: None,
                }))
                .with_subscription(SubscriptionConfig::new("big").with_rule(Rule {
                    name: "sql".into(),
                    filter: Filter::Sql(
                        SqlFilter::parse("quantity >= 10 AND sys.Label <> 'cancelled'").unwrap(),
                    ),
                    action: None,
                }))
                .with_subscription(
                    SubscriptionConfig::new("either")
                        .with_rule(Rule {
                            name: "a".into(),
                            filter: Filter::Sql(SqlFilter::parse("region = 'us'").unwrap()),
                            action: None,
                        })
                        .with_rule(Rule {
                            name: "b".into(),
                            filter: Filter::Sql(SqlFilter::parse("quantity < 5").unwrap()),
                            action: None,
                        }),
                )
                .with_subscription(SubscriptionConfig::new("none").with_rule(Rule {
                    name: "never".into(),
                    filter: Filter::False,
                    action: None,
                })),
        );
    Broker::new(config).unwrap()
}

fn order(id: &str, label: &str, region: &str, quantity: i64) -> BrokerMessage {
    let mut m = msg(id)
        .with_property("region", region)
        .with_property("quantity", quantity);
    m.subject = Some(label.into());
    m
}

async fn ids(e: &Entity) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(m) = e.try_receive(ReceiveMode::ReceiveAndDelete).unwrap() {
        out.push(m.message.message_id.unwrap_or_default());
    }
    out
}

/// The `$management` rule operations change fan-out for messages sent afterwards.
#[tokio::test(start_paused = true)]
async fn rules_added_and_removed_at_run_time_drive_fan_out() {
    let broker = topic_broker();
    let topic = broker.entity("orders").unwrap();
    let all = broker.entity("orders/Subscriptions/all").unwrap();
    let names = |e: &Entity| {
        e.rules()
            .unwrap()
            .into_iter()
            .map(|(r, _)| r.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&all), ["$Default"]);
    all.add_rule(Rule {
        name: "eu".into(),
        filter: Filter::Sql(SqlFilter::parse("region = 'eu'").unwrap()),
        action: None,
    })
    .unwrap();
    assert!(matches!(
        all.add_rule(Rule {
            name: "EU".into(),
            filter: Filter::True,
            action: None,
        }),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        all.add_rule(Rule {
            name: "x".repeat(51),
            filter: Filter::True,
            action: None,
        }),
        Err(Error::InvalidRule { .. })
    ));
    all.remove_rule("$default").unwrap();
    assert_eq!(names(&all), ["eu"]);
    assert!(matches!(
        all.remove_rule("$Default"),
        Err(Error::NotFound { .. })
    ));
    topic.send(order("1", "created", "us", 1)).unwrap();
    topic.send(order("2", "created", "eu", 1)).unwrap();
    assert_eq!(ids(&all).await, ["2"]);
    all.remove_rule("eu").unwrap();
    topic.send(order("3", "created", "eu", 1)).unwrap();
    assert!(ids(&all).await.is_empty(), "no rule, no messages");
    // Rules belong to subscriptions only.
    for entity in [
        "orders",
        "audit",
        "orders/Subscriptions/all/$DeadLetterQueue",
    ] {
        assert!(
            matches!(
                broker.entity(entity).unwrap().rules(),
                Err(Error::NotAllowed { .. })
            ),
            "{entity}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn topic_fans_out_by_correlation_sql_and_default_rules() {
    let broker = topic_broker();
    let topic = broker.entity("orders").unwrap();
    assert!(topic.is_topic());
    topic.send(order("1", "created", "eu", 1)).unwrap();
    topic.send(order("2", "created", "us", 20)).unwrap();
    topic.send(order("3", "cancelled", "eu", 50)).unwrap();
    topic.send(order("4", "created", "eu", 12)).unwrap();
    let sub = |name: &str| {
        broker
            .entity(&format!("orders/Subscriptions/{name}"))
            .unwrap()
    };
    assert_eq!(
        ids(&sub("all")).await,
        ["1", "2", "3", "4"],
        "$Default matches all"
    );
    assert_eq!(ids(&sub("EU-CREATED")).await, ["1", "4"]);
    assert_eq!(ids(&sub("big")).await, ["2", "4"]);
    assert_eq!(
        ids(&sub("either")).await,
        ["1", "2"],
        "any matching rule suffices"
    );
    assert!(ids(&sub("none")).await.is_empty());
    assert_eq!(topic.counts().sent, 4);
    // Subscriptions share the topic's sequence numbers.
    topic.send(order("5", "x", "eu", 0)).unwrap();
    assert_eq!(
        sub("all")
            .try_receive(ReceiveMode::PeekLock)
            .unwrap()
            .unwrap()
            .sequence_number,
        5
    );
    // Topics cannot be received from; subscriptions cannot be sent to.
    assert!(matches!(
        topic.try_receive(ReceiveMode::PeekLock),
        Err(Error::NotAllowed { .. })
    ));
    assert!(matches!(
        sub("all").send(msg("x")),
        Err(Error::NotAllowed { .. })
    ));
    assert!(
        broker
            .entity("orders/Subscriptions/missing")
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(start_paused = true)]
async fn topic_duplicate_detection_ttl_and_scheduling() {
    let config = Config::new("ns").with_topic(
        TopicConfig::new("t")
            .with_properties(TopicProperties {
                requires_duplicate_detection: true,
                duplicate_detection_history_time_window: 5 * SEC,
                default_message_time_to_live: 20 * SEC,
                ..TopicProperties::default()
            })
            .with_subscription(SubscriptionConfig::new("s").with_properties(props(|p| {
                p.dead_lettering_on_message_expiration = true;
            }))),
    );
    let broker = Broker::new(config).unwrap();
    let topic = broker.entity("t").unwrap();
    let sub = broker.entity("t/Subscriptions/s").unwrap();
    topic.send(msg("a")).unwrap();
    assert_eq!(topic.send(msg("a")).unwrap(), SendOutcome::Duplicate);
    assert_eq!(topic.counts().duplicates, 1);
    // Scheduled on the topic: invisible in the subscription's peek, cancellable on the topic.
    let mut s1 = msg("s1");
    s1.scheduled_enqueue_time = Some(broker.clock().now() + 10 * SEC);
    let mut s2 = msg("s2");
    s2.scheduled_enqueue_time = Some(broker.clock().now() + 10 * SEC);
    let seqs = topic.schedule(vec![s1, s2]).unwrap();
    assert_eq!(
        sub.peek(0, 10).unwrap().len(),
        1,
        "scheduled messages are not peeked on subscriptions"
    );
    assert_eq!(sub.counts().scheduled, 2);
    topic.cancel_scheduled(&seqs[1..]).unwrap();
    advance(10 * SEC).await;
    let got = ids(&sub).await;
    assert_eq!(got, ["a", "s1"]);
    // The topic's TTL (20 s) caps the subscription's default (1 h).
    topic.send(msg("b")).unwrap();
    advance(20 * SEC).await;
    let dlq = broker.entity("t/Subscriptions/s/$DeadLetterQueue").unwrap();
    let d = recv(&dlq).await;
    assert_eq!(d.dead_letter_reason(), Some("TTLExpiredException"));
    assert_eq!(d.dead_letter_source.as_deref(), Some("t/Subscriptions/s"));
}

#[tokio::test(start_paused = true)]
async fn receive_and_delete_removes_on_delivery() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    q.send(msg("b")).unwrap();
    let m = q
        .receive(ReceiveMode::ReceiveAndDelete, WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.message.message_id.as_deref(), Some("a"));
    assert_eq!((m.lock_token, m.locked_until), (None, None));
    advance(60 * SEC).await;
    let m = q
        .receive(ReceiveMode::ReceiveAndDelete, WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.message.message_id.as_deref(), Some("b"));
    assert!(
        q.receive(ReceiveMode::ReceiveAndDelete, WAIT)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(q.counts().completed, 2);
}

#[tokio::test(start_paused = true)]
async fn receive_times_out_on_the_paused_clock() {
    let (broker, q) = queue_broker(props(|_| {}));
    let start = broker.clock().now();
    let got = q
        .receive(ReceiveMode::PeekLock, Some(30 * SEC))
        .await
        .unwrap();
    assert!(got.is_none());
    assert!(broker.clock().now() >= start + 30 * SEC);
}

#[tokio::test(start_paused = true)]
async fn waiting_receiver_wakes_on_send() {
    let (_broker, q) = queue_broker(props(|_| {}));
    let q2 = q.clone();
    let waiter =
        tokio::spawn(async move { q2.receive(ReceiveMode::PeekLock, Some(60 * SEC)).await });
    tokio::task::yield_now().await;
    q.send(msg("a")).unwrap();
    let m = waiter.await.unwrap().unwrap().unwrap();
    assert_eq!(m.message.message_id.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn competing_receivers_never_get_the_same_locked_message() {
    let (_broker, q) = queue_broker(props(|p| p.lock_duration = 60 * SEC));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(m) = q.receive(ReceiveMode::PeekLock, Some(SEC)).await.unwrap() {
                got.push(m.sequence_number);
                tokio::task::yield_now().await;
            }
            got
        }));
    }
    tokio::task::yield_now().await;
    for i in 0..200 {
        q.send(msg(&i.to_string())).unwrap();
        if i % 7 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let mut seen = HashSet::new();
    for t in tasks {
        for seq in t.await.unwrap() {
            assert!(seen.insert(seq), "sequence number {seq} delivered twice");
        }
    }
    assert_eq!(seen.len(), 200);
    assert_eq!(q.counts().locked, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_receivers_across_threads() {
    let (_broker, q) = queue_broker(props(|p| p.lock_duration = 600 * SEC));
    for i in 0..500 {
        q.send(msg(&i.to_string())).unwrap();
    }
    let seen = Arc::new(std::sync::Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (q, seen) = (q.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(m) = q.try_receive(ReceiveMode::PeekLock).unwrap() {
                assert!(seen.lock().unwrap().insert(m.sequence_number));
                if m.sequence_number % 2 == 0 {
                    q.complete(token(&m)).await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(seen.lock().unwrap().len(), 500);
    let c = q.counts();
    assert_eq!((c.completed, c.locked), (250, 250));
}

#[tokio::test(start_paused = true)]
async fn renew_extends_the_lock() {
    let (broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    let m = recv(&q).await;
    advance(4 * SEC).await;
    let expirations = q.renew_lock(&[token(&m)]).unwrap();
    assert_eq!(expirations, vec![broker.clock().now() + 5 * SEC]);
    advance(4 * SEC).await;
    assert!(
        q.try_receive(ReceiveMode::PeekLock).unwrap().is_none(),
        "renewed lock holds"
    );
    q.complete(token(&m)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn renew_after_expiry_is_lock_lost() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    q.send(msg("b")).unwrap();
    let a = recv(&q).await;
    advance(3 * SEC).await;
    let b = recv(&q).await;
    advance(2 * SEC).await;
    // `a` expired; all-or-nothing: `b` is not renewed either.
    let err = q.renew_lock(&[token(&b), token(&a)]).unwrap_err();
    assert!(
        matches!(err, Error::LockLost { lock_token } if lock_token == token(&a)),
        "{err}"
    );
    assert!(
        q.renew_lock(&[uuid::Uuid::new_v4()])
            .unwrap_err()
            .is_lock_lost()
    );
    assert!(
        q.settle(token(&a), Settlement::abandon())
            .await
            .unwrap_err()
            .is_lock_lost()
    );
    q.renew_lock(&[token(&b)]).unwrap();
}

#[tokio::test(start_paused = true)]
async fn update_disposition_by_lock_tokens() {
    let (broker, q) = queue_broker(props(|_| {}));
    for id in ["a", "b", "c", "d", "e"] {
        q.send(msg(id)).unwrap();
    }
    let mut ms = Vec::new();
    for _ in 0..5 {
        ms.push(recv(&q).await);
    }
    let t: Vec<_> = ms.iter().map(token).collect();
    assert_eq!(
        DispositionStatus::parse("defered"),
        Some(DispositionStatus::Defered)
    );
    assert_eq!(DispositionStatus::parse("bogus"), None);
    q.update_disposition(
        DispositionStatus::Completed,
        &t[0..2],
        None,
        None,
        Properties::new(),
    )
    .await
    .unwrap();
    let mut modify = Properties::new();
    modify.insert("why".into(), "retry".into());
    q.update_disposition(DispositionStatus::Abandoned, &t[2..3], None, None, modify)
        .await
        .unwrap();
    q.update_disposition(
        DispositionStatus::Defered,
        &t[3..4],
        None,
        None,
        Properties::new(),
    )
    .await
    .unwrap();
    q.update_disposition(
        DispositionStatus::Suspended,
        &t[4..5],
        Some("Bad".into()),
        Some("bad input".into()),
        Properties::new(),
    )
    .await
    .unwrap();
    let again = recv(&q).await;
    assert_eq!(again.message.message_id.as_deref(), Some("c"));
    assert_eq!(
        again.message.application_properties.get("why"),
        Some(&PropertyValue::from("retry"))
    );
    let c = q.counts();
    assert_eq!(
        (c.completed, c.deferred, c.dead_lettered, c.locked),
        (2, 1, 1, 1)
    );
    let d = recv(&broker.entity("q/$DeadLetterQueue").unwrap()).await;
    assert_eq!(
        (d.dead_letter_reason(), d.dead_letter_description()),
        (Some("Bad"), Some("bad input"))
    );
    let err = q
        .update_disposition(
            DispositionStatus::Completed,
            &t[0..1],
            None,
            None,
            Properties::new(),
        )
        .await
        .unwrap_err();
    assert!(err.is_lock_lost());
}

#[tokio::test(start_paused = true)]
async fn fault_expire_lock_now() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    let m = recv(&q).await;
    q.expire_lock(token(&m)).unwrap();
    assert!(q.complete(token(&m)).await.unwrap_err().is_lock_lost());
    let again = q.try_receive(ReceiveMode::PeekLock).unwrap().unwrap();
    assert_eq!(again.delivery_count, 1);
    assert!(
        q.expire_lock(uuid::Uuid::new_v4())
            .unwrap_err()
            .is_lock_lost()
    );
}

#[tokio::test(start_paused = true)]
async fn fault_refuse_renewals() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    let m = recv(&q).await;
    q.refuse_renewals(2).unwrap();
    assert!(q.renew_lock(&[token(&m)]).unwrap_err().is_lock_lost());
    assert!(q.renew_lock(&[token(&m)]).unwrap_err().is_lock_lost());
    q.renew_lock(&[token(&m)]).unwrap();
    // A refused renewal leaves the lock itself in place.
    q.complete(token(&m)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn fault_refuse_and_delay_dispositions() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(msg("a")).unwrap();
    let m = recv(&q).await;
    q.refuse_dispositions(1).unwrap();
    let err = q.complete(token(&m)).await.unwrap_err();
    assert!(
        matches!(err, Error::Refused { .. }) && err.is_transient(),
        "{err}"
    );
    assert_eq!(
        q.counts().locked,
        1,
        "a refused disposition leaves the message locked"
    );
    // A delay shorter than the lock: the disposition applies after it.
    q.delay_dispositions(1, 2 * SEC).unwrap();
    let start = tokio::time::Instant::now();
    q.abandon(token(&m), Properties::new()).await.unwrap();
    assert_eq!(start.elapsed(), 2 * SEC);
    // A delay that outlasts the lock: lock lost.
    let m = recv(&q).await;
    q.delay_dispositions(1, 6 * SEC).unwrap();
    assert!(q.complete(token(&m)).await.unwrap_err().is_lock_lost());
    assert_eq!(recv(&q).await.delivery_count, 2);
}

#[tokio::test(start_paused = true)]
async fn fault_pause_delivery() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.pause_delivery().unwrap();
    q.send(msg("a")).unwrap();
    assert!(q.try_receive(ReceiveMode::PeekLock).unwrap().is_none());
    let q2 = q.clone();
    let waiter = tokio::spawn(async move { q2.receive(ReceiveMode::PeekLock, None).await });
    advance(60 * SEC).await;
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    q.resume_delivery().unwrap();
    let m = waiter.await.unwrap().unwrap().unwrap();
    assert_eq!(m.message.message_id.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn size_limits_and_unknown_entities() {
    let (broker, q) = queue_broker(props(|p| p.max_message_size = 1024));
    assert_eq!(q.max_message_size(), 1024);
    q.send(BrokerMessage::new(vec![0u8; 1024])).unwrap();
    let err = q.send(BrokerMessage::new(vec![0u8; 1025])).unwrap_err();
    assert!(
        matches!(
            err,
            Error::MessageSizeExceeded {
                size: 1025,
                max: 1024
            }
        ),
        "{err}"
    );
    assert_eq!(err.condition(), "amqp:link:message-size-exceeded");
    // Batches are checked before anything is stored.
    let batch = vec![msg("ok"), BrokerMessage::new(vec![0u8; 2048])];
    assert!(q.send_batch(batch).is_err());
    assert_eq!(q.counts().active, 1);
    let err = broker.entity("nope").unwrap_err();
    assert!(err.is_not_found());
    assert_eq!(err.condition(), "amqp:not-found");
    assert!(broker.entity("$cbs").is_err());
    assert_eq!(
        broker.entity("sb://host/q/$management").unwrap().path(),
        "q"
    );
    assert!(Broker::new(Config::new("ns")).unwrap().entity("q").is_err());
}

#[tokio::test(start_paused = true)]
async fn broker_assigns_missing_message_ids() {
    let (_broker, q) = queue_broker(props(|_| {}));
    q.send(BrokerMessage::new("x")).unwrap();
    let id = recv(&q).await.message.message_id.unwrap();
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[tokio::test(start_paused = true)]
async fn forward_to_and_forward_dead_lettered_messages_to() {
    let config = Config::from_json(
        r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[
            {"Name":"inbox","Properties":{"ForwardTo":"work"}},
            {"Name":"work","Properties":{"MaxDeliveryCount":1,"ForwardDeadLetteredMessagesTo":"poison"}},
            {"Name":"poison"}],
          "Topics":[{"Name":"events","Subscriptions":[{"Name":"fwd","Properties":{"ForwardTo":"work"}}]}]}]}}"#,
    )
    .unwrap();
    let broker = Broker::new(config).unwrap();
    let inbox = broker.entity("inbox").unwrap();
    let work = broker.entity("work").unwrap();
    let poison = broker.entity("poison").unwrap();
    inbox.send(msg("a")).unwrap();
    broker.entity("events").unwrap().send(msg("b")).unwrap();
    assert_eq!(inbox.counts().forwarded, 1);
    assert!(inbox.try_receive(ReceiveMode::PeekLock).unwrap().is_none());
    let a = recv(&work).await;
    assert_eq!(a.message.message_id.as_deref(), Some("a"));
    let b = recv(&work).await;
    assert_eq!(b.message.message_id.as_deref(), Some("b"));
    work.abandon(token(&a), Properties::new()).await.unwrap();
    let p = recv(&poison).await;
    assert_eq!(p.message.message_id.as_deref(), Some("a"));
    poison.complete(token(&p)).await.unwrap();
    assert_eq!(
        p.message.application_properties.get("DeadLetterReason"),
        Some(&"MaxDeliveryCountExceeded".into())
    );
    assert_eq!(work.counts().dead_lettered, 0, "forwarded, not kept");
    // Lock expiry also forwards (through the next operation's timer pass).
    advance(60 * SEC).await;
    assert_eq!(recv(&poison).await.message.message_id.as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn counts_per_state() {
    let (broker, q) = queue_broker(props(|_| {}));
    for id in ["a", "b", "c", "d"] {
        q.send(msg(id)).unwrap();
    }
    let mut s = msg("e");
    s.scheduled_enqueue_time = Some(broker.clock().now() + SEC);
    q.schedule(vec![s]).unwrap();
    let a = recv(&q).await;
    let b = recv(&q).await;
    let c = recv(&q).await;
    q.defer(token(&b), Properties::new()).await.unwrap();
    q.dead_letter(token(&c), None, None, Properties::new())
        .await
        .unwrap();
    let counts = q.counts();
    assert_eq!(
        (
            counts.active,
            counts.locked,
            counts.deferred,
            counts.scheduled,
            counts.dead_lettered,
            counts.sent
        ),
        (1, 1, 1, 1, 1, 5)
    );
    q.complete(token(&a)).await.unwrap();
    let dlq = broker.entity("q/$DeadLetterQueue").unwrap().counts();
    assert_eq!((dlq.active, dlq.sent), (1, 1));
    assert_eq!(q.counts().completed, 1);
}

/// Handles and futures cross tasks and threads in the wire layer.
#[test]
fn handles_and_futures_are_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let broker = Broker::new(Config::new("ns").with_queue(QueueConfig::new("q"))).unwrap();
    let q = broker.entity("q").unwrap();
    send_sync(&broker);
    send_sync(&q);
    send(&q.receive(ReceiveMode::PeekLock, None));
    send(&q.settle(uuid::Uuid::nil(), Settlement::Complete));
    send(&q.update_disposition(
        DispositionStatus::Completed,
        &[],
        None,
        None,
        Properties::new(),
    ));
    send_sync(&Error::Refused { operation: "x" });
}

fn session_msg(id: &str, session: &str) -> BrokerMessage {
    let mut m = msg(id);
    m.session_id = Some(session.into());
    m
}

#[tokio::test(start_paused = true)]
async fn sessions_lock_a_session_per_receiver_and_keep_order() {
    let (_broker, q) = queue_broker(props(|p| p.requires_session = true));
    assert!(q.requires_session());
    assert!(matches!(
        q.send(msg("no-session")),
        Err(Error::NotAllowed { .. })
    ));
    assert!(matches!(
        q.try_receive(ReceiveMode::PeekLock),
        Err(Error::NotAllowed { .. })
    ));
    for (id, s) in [("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B")] {
        q.send(session_msg(id, s)).unwrap();
    }
    // Next available session: the one of the oldest message.
    let a = q.accept_session(None, WAIT).await.unwrap().unwrap();
    assert_eq!(a.session_id, "A");
    let err = q.accept_session(Some("A"), None).await.unwrap_err();
    assert!(matches!(err, Error::SessionCannotBeLocked { .. }), "{err}");
    assert_eq!(err.condition(), "com.microsoft:session-cannot-be-locked");
    let b = q.accept_session(None, WAIT).await.unwrap().unwrap();
    assert_eq!(b.session_id, "B");
    assert!(
        q.accept_session(None, WAIT).await.unwrap().is_none(),
        "every session is taken"
    );
    let a1 = q
        .receive_from_session("A", ReceiveMode::PeekLock, WAIT)
        .await
        .unwrap()
        .unwrap();
    let a2 = q
        .receive_from_session("A", ReceiveMode::PeekLock, WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        [
            a1.message.message_id.as_deref(),
            a2.message.message_id.as_deref()
        ],
        [Some("a1"), Some("a2")]
    );
    assert_eq!(
        a1.locked_until,
        Some(a.locked_until),
        "message locks end with the session lock"
    );
    assert!(
        q.receive_from_session("A", ReceiveMode::PeekLock, WAIT)
            .await
            .unwrap()
            .is_none()
    );
    q.complete(token(&a1)).await.unwrap();
    // Accepting a specific session without messages is allowed.
    assert_eq!(
        q.accept_session(Some("C"), None)
            .await
            .unwrap()
            .unwrap()
            .session_id,
        "C"
    );
    // The session lock expires: the session and its unsettled message come back.
    advance(5 * SEC).await;
    let err = q
        .receive_from_session("A", ReceiveMode::PeekLock, WAIT)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SessionLockLost { .. }), "{err}");
    assert!(q.complete(token(&a2)).await.unwrap_err().is_lock_lost());
    let again = q.accept_session(Some("A"), None).await.unwrap().unwrap();
    let a2 = q
        .receive_from_session(&again.session_id, ReceiveMode::PeekLock, WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a2.delivery_count, 1);
}

#[tokio::test(start_paused = true)]
async fn session_renewal_release_and_state() {
    let (broker, q) = queue_broker(props(|p| p.requires_session = true));
    q.send(session_msg("a1", "A")).unwrap();
    let s = q.accept_session(Some("A"), None).await.unwrap().unwrap();
    let m = q
        .receive_from_session("A", ReceiveMode::PeekLock, WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(q.session_state("A").unwrap(), None);
    q.set_session_state("A", Some(bytes::Bytes::from_static(b"step-1")))
        .unwrap();
    assert_eq!(
        q.session_state("A").unwrap().as_deref(),
        Some(&b"step-1"[..])
    );
    advance(4 * SEC).await;
    let until = q.renew_session_lock("A").unwrap();
    assert_eq!(until, broker.clock().now() + 5 * SEC);
    assert!(until > s.locked_until);
    advance(4 * SEC).await;
    // The message lock was renewed with the session.
    q.complete(token(&m)).await.unwrap();
    q.release_session("A").unwrap();
    assert!(matches!(
        q.session_state("A"),
        Err(Error::SessionLockLost { .. })
    ));
    assert!(matches!(
        q.renew_session_lock("A"),
        Err(Error::SessionLockLost { .. })
    ));
    // State survives the lock.
    q.accept_session(Some("A"), None).await.unwrap();
    assert_eq!(
        q.session_state("A").unwrap().as_deref(),
        Some(&b"step-1"[..])
    );
    // A waiting acceptor gets a session as soon as a message for a free session arrives.
    let q2 = q.clone();
    let waiter = tokio::spawn(async move { q2.accept_session(None, None).await });
    tokio::task::yield_now().await;
    q.send(session_msg("b1", "B")).unwrap();
    assert_eq!(waiter.await.unwrap().unwrap().unwrap().session_id, "B");
    // Sessionless entities refuse session operations.
    let (_b, plain) = queue_broker(props(|_| {}));
    assert!(matches!(
        plain.accept_session(None, WAIT).await,
        Err(Error::NotAllowed { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn receive_is_cancel_safe() {
    let (_broker, q) = queue_broker(props(|_| {}));
    tokio::select! {
        r = q.receive(ReceiveMode::PeekLock, None) => panic!("nothing was sent: {r:?}"),
        () = tokio::time::sleep(SEC) => {}
    }
    q.send(msg("a")).unwrap();
    // The cancelled receiver took nothing: the message is still there.
    let m = q.try_receive(ReceiveMode::PeekLock).unwrap().unwrap();
    assert_eq!(m.delivery_count, 0);
}

#[tokio::test(start_paused = true)]
async fn config_json_rules_drive_fan_out() {
    let config = Config::from_json(
        r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns","Queues":[],"Topics":[{"Name":"t",
          "Subscriptions":[
            {"Name":"high","Properties":{"LockDuration":"PT1S","MaxDeliveryCount":1},
             "Rules":[{"Name":"r","Properties":{"FilterType":"Sql","SqlFilter":{"SqlExpression":"priority = 'High' OR sys.Label LIKE 'urgent%'"}}}]},
            {"Name":"corr","Rules":[{"Name":"r","Properties":{"FilterType":"Correlation","CorrelationFilter":{"CorrelationId":"c1","Properties":{"n":1}}}}]},
            {"Name":"all"}]}]}],"Logging":{"Type":"File"}}}"#,
    )
    .unwrap();
    let broker = Broker::new(config).unwrap();
    let t = broker.entity("sb://localhost/t").unwrap();
    t.send(msg("1").with_property("priority", "High")).unwrap();
    let mut m2 = msg("2").with_property("n", 1);
    m2.correlation_id = Some("c1".into());
    m2.subject = Some("urgent-fix".into());
    t.send(m2).unwrap();
    t.send(msg("3").with_property("priority", "Low")).unwrap();
    let sub = |n: &str| broker.entity(&format!("t/subscriptions/{n}")).unwrap();
    assert_eq!(ids(&sub("high")).await, ["1", "2"]);
    assert_eq!(ids(&sub("corr")).await, ["2"]);
    assert_eq!(ids(&sub("all")).await, ["1", "2", "3"]);
    // The subscription's 1 s lock and MaxDeliveryCount 1 from the file apply.
    t.send(msg("4").with_property("priority", "High")).unwrap();
    let high = sub("high");
    recv(&high).await;
    advance(SEC).await;
    let d = recv(
        &broker
            .entity("t/Subscriptions/high/$DeadLetterQueue")
            .unwrap(),
    )
    .await;
    assert_eq!(d.dead_letter_reason(), Some("MaxDeliveryCountExceeded"));
}
