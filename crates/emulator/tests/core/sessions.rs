//! Message sessions: session locks, order, renewal, release and state.

use super::*;

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
