//! Time-driven behaviour: TTL, duplicate detection windows, scheduled messages, peek across states.

use super::*;

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
