//! Receivers: waiting, timing out, competing, cancel safety, Send and Sync handles.

use super::*;

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
