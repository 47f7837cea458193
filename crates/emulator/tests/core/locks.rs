//! Peek-lock locks: expiry and redelivery, renewal.

use super::*;

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
