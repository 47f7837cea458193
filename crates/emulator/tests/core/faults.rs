//! Fault hooks: expired locks, refused renewals and dispositions, delays, paused delivery.

use super::*;

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
