//! Entities: size limits, unknown entities, message ids, counts per state.

use super::*;

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
