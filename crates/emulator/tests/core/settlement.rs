//! Settling messages: abandon, dead-letter, defer, update-disposition, receive-and-delete.

use super::*;

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
