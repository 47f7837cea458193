//! Message sessions (issue 17): session receiver links under the same link controls as plain
//! ones (idle timer, forced detaches), `amqp:link:stolen` for a link whose session another
//! receiver took, and the session receiver of the client.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use sb_amqp::codec::Value;
use sb_amqp::types::messaging::{FilterSet, Message, Properties};
use sb_amqp::types::primitives::Symbol;
use sb_amqp::{ReceiverOptions, Sendable, SenderOptions, Session, condition};
use sb_emulator::{Emulator, EmulatorOptions, LinkRole};
use sb_servicebus::{ReceiveError, SettlementError};

use crate::strict::authorized;
use crate::support::emulator::{queue, session_properties, start};

/// A session queue `sq` (lock `lock`, max delivery count 5), served with `options`.
pub(crate) async fn session_emulator(lock: &str, options: EmulatorOptions) -> Emulator {
    start(vec![queue("sq", session_properties(lock))], options).await
}

/// Sends `(message id, session id)` pairs to `sq` over a raw link, as a producer would.
pub(crate) async fn send_session_messages(emulator: &Emulator, messages: &[(&str, &str)]) {
    let (_conn, session, _cbs) = authorized(emulator, "sq").await;
    let sender = session
        .attach_sender(SenderOptions::new("producer", "sq"))
        .await
        .unwrap();
    for (id, group) in messages {
        let message = Message::builder()
            .properties(
                Properties::builder()
                    .message_id(id.to_string())
                    .group_id(group.to_string())
                    .build(),
            )
            .value("x")
            .build();
        let outcome = sender
            .send(Sendable::message(&message).unwrap())
            .await
            .unwrap();
        assert!(outcome.is_accepted(), "{outcome:?}");
    }
}

/// Force-detaches the oldest receiver link on `sq` (links are listed by id), as the service
/// detaches links.
fn detach_first_receiver(emulator: &Emulator) {
    let link = emulator
        .links()
        .into_iter()
        .find(|l| l.entity == "sq" && l.role == LinkRole::Receiver)
        .unwrap();
    assert!(emulator.force_detach_link(
        link.id,
        sb_amqp::AmqpError::new(condition::DETACH_FORCED, None)
    ));
}

/// A raw receiver link on `sq` asking for `session` (`None`: the next available one).
async fn session_link(
    session: &Session,
    name: &str,
    wanted: Option<&str>,
    credit: u32,
) -> sb_amqp::Result<sb_amqp::Receiver> {
    let mut filter = FilterSet::default();
    filter.insert(
        Symbol::from("com.microsoft:session-filter"),
        wanted.map_or(Value::Null, |s| Value::String(s.to_owned())),
    );
    let mut options = ReceiverOptions::new(name, "sq").filter(filter);
    if credit > 0 {
        options = options.credit(credit);
    }
    session.attach_receiver(options).await
}

#[tokio::test(start_paused = true)]
async fn a_session_link_obeys_the_idle_timer_and_forced_detaches() {
    crate::support::init_tracing();
    let emulator = session_emulator(
        "PT5M",
        EmulatorOptions::default().with_link_idle_timeout(Duration::from_secs(60)),
    )
    .await;
    send_session_messages(&emulator, &[("a1", "A"), ("b1", "B")]).await;
    let (_conn, session, _cbs) = authorized(&emulator, "sq").await;
    let started = tokio::time::Instant::now();
    let idle = session_link(&session, "idle-session", Some("A"), 0)
        .await
        .unwrap();
    // Listed like any entity link, so a forced detach reaches it.
    let busy = session_link(&session, "forced-session", Some("B"), 1)
        .await
        .unwrap();
    assert_eq!(
        busy.recv()
            .await
            .unwrap()
            .message()
            .unwrap()
            .properties
            .unwrap()
            .message_id,
        Some("b1".to_owned().into())
    );
    let links = emulator.links();
    assert_eq!(links.len(), 2, "{links:?}");
    let forced = links.iter().find(|l| l.name == "forced-session").unwrap();
    let busy_error = sb_amqp::AmqpError::new(condition::SERVER_BUSY, None);
    assert!(emulator.force_detach_link(forced.id, busy_error));
    let error = busy.recv().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::SERVER_BUSY), "{error}");
    // The forced link's session is free again at once (its message lock with it).
    let again = session_link(&session, "again", Some("B"), 0).await;
    assert!(again.is_ok(), "{again:?}");
    // The idle one: force detached after 60 s without a transfer, flow or disposition, well
    // before its 5 min session lock would run out.
    let error = idle.recv().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::DETACH_FORCED), "{error}");
    let text = error.amqp_error().unwrap().description.clone().unwrap();
    assert!(
        text.contains("IdleTimerExpired: Idle timeout: 00:01:00."),
        "{text}"
    );
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(60)..Duration::from_secs(62)).contains(&waited),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_taken_over_session_steals_the_stale_link_which_cannot_release_the_new_lock() {
    let emulator = session_emulator("PT30S", EmulatorOptions::default()).await;
    send_session_messages(&emulator, &[("a1", "A")]).await;
    let (_conn, session, _cbs) = authorized(&emulator, "sq").await;
    // No credit: this link never asks, so it does not notice its lock running out.
    let stale = session_link(&session, "stale", Some("A"), 0).await.unwrap();
    let refused = session_link(&session, "early", Some("A"), 0)
        .await
        .unwrap_err();
    assert_eq!(
        refused.condition(),
        Some("com.microsoft:session-cannot-be-locked"),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_secs(31)).await;
    let (_conn2, session2, _cbs2) = authorized(&emulator, "sq").await;
    let newer = session_link(&session2, "newer", None, 1).await.unwrap();
    // The stale link learns at once that its session was attached elsewhere.
    let error = stale.recv().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::LINK_STOLEN), "{error}");
    // Its end did not release the newer holder's lock: the session is still taken ...
    let refused = session_link(&session2, "third", Some("A"), 0)
        .await
        .unwrap_err();
    assert_eq!(
        refused.condition(),
        Some("com.microsoft:session-cannot-be-locked"),
        "{refused}"
    );
    // ... and the newer link receives its message (delivery count 1: the stale lock expired).
    let delivery = newer.recv().await.unwrap();
    let message = delivery.message().unwrap();
    assert_eq!(
        message.properties.unwrap().message_id,
        Some("a1".to_owned().into())
    );
}

#[tokio::test]
async fn the_session_receiver_accepts_renews_keeps_state_and_fences_a_lost_link() {
    let emulator = session_emulator("PT30S", EmulatorOptions::default()).await;
    send_session_messages(
        &emulator,
        &[("a1", "A"), ("b1", "B"), ("a2", "A"), ("a3", "A")],
    )
    .await;
    let client = crate::support::emulator::client(&emulator);
    let wait = Duration::from_secs(5);
    // Next available: the session of the oldest message.
    let a = client
        .accept_next_session("sq", wait)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.session_id(), "A");
    let first_lock = a.locked_until();
    assert!(
        first_lock > SystemTime::now() + Duration::from_secs(20),
        "{first_lock:?}"
    );
    let a1 = a.receive(wait).await.unwrap().unwrap();
    assert_eq!(a1.message().message_id.as_deref(), Some("a1"));
    assert_eq!(a1.message().session_id.as_deref(), Some("A"));
    assert_eq!(
        a1.locked_until(),
        a.locked_until(),
        "a session message's lock is the session lock"
    );
    a1.complete().await.unwrap();
    let a2 = a.receive(wait).await.unwrap().unwrap();
    assert_eq!(a2.message().message_id.as_deref(), Some("a2"));
    // State and renewal.
    assert_eq!(a.state().await.unwrap(), None);
    a.set_state(Some(b"after-a1")).await.unwrap();
    assert_eq!(a.state().await.unwrap().as_deref(), Some(&b"after-a1"[..]));
    let renewed = a.renew_session_lock().await.unwrap();
    assert!(renewed >= first_lock, "{renewed:?} after {first_lock:?}");
    assert_eq!(a.locked_until(), renewed);
    // Renewing through the delivery renews the session lock (the lock keeper's way).
    let through_delivery = a2.renew_lock().await.unwrap();
    assert!(through_delivery >= renewed);
    assert_eq!(a.locked_until(), through_delivery);
    // Another receiver cannot take A meanwhile; it gets B as the next available.
    let other = crate::support::emulator::client(&emulator);
    let refused = other.accept_session("sq", "A").await.unwrap_err();
    assert!(
        matches!(&refused, ReceiveError::Transient(why) if why.to_string().contains("session-cannot-be-locked")),
        "{refused:?}"
    );
    let b = other
        .accept_next_session("sq", wait)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.session_id(), "B");
    assert!(
        other
            .accept_next_session("sq", Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "every session with messages is held"
    );
    // The service detaches A's link: the session lock is gone with it, so the unsettled a2
    // cannot be settled any more (its commit would be fenced) and the receiver is done.
    // Links are listed by id: A's was attached before B's.
    detach_first_receiver(&emulator);
    assert!(matches!(
        a.receive(wait).await,
        Err(ReceiveError::Transient(_))
    ));
    assert!(matches!(
        a2.complete().await,
        Err(SettlementError::LockLost)
    ));
    assert!(!a.is_attached());
    // A is free again, in order: a2 first (delivery count 1), then a3; the state survived.
    let again = other.accept_session("sq", "A").await.unwrap();
    let a2 = again.receive(wait).await.unwrap().unwrap();
    assert_eq!(a2.message().message_id.as_deref(), Some("a2"));
    assert_eq!(a2.delivery_count(), 1);
    assert_eq!(
        again.state().await.unwrap().as_deref(),
        Some(&b"after-a1"[..])
    );
    a2.complete().await.unwrap();
    let a3 = again.receive(wait).await.unwrap().unwrap();
    assert_eq!(a3.message().message_id.as_deref(), Some("a3"));
    a3.complete().await.unwrap();
    // Close releases the session at once.
    again.close().await;
    let reopened = client.accept_session("sq", "A").await.unwrap();
    assert!(
        reopened
            .receive(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    b.close().await;
    reopened.close().await;
}

/// The per-session record the process test reads: filled by a trigger on the inventory
/// consumer's reservation insert, inside the handler's transaction, so a row exists exactly
/// when that order's effect committed. `overlapped` is true when another open transaction was
/// working on the same session at that moment (it holds the session's advisory lock).
const SESSION_LOG: &str = r"
CREATE TABLE session_log (
    id         bigserial PRIMARY KEY,
    session    text    NOT NULL,
    seq        integer NOT NULL,
    backend    integer NOT NULL,
    overlapped boolean NOT NULL
);
CREATE FUNCTION log_session() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    s text := split_part(NEW.order_id, '-', 2);
BEGIN
    INSERT INTO session_log (session, seq, backend, overlapped)
    VALUES (s, split_part(NEW.order_id, '-', 3)::integer, pg_backend_pid(),
            NOT pg_try_advisory_xact_lock(hashtext(s)));
    RETURN NEW;
END $$;
CREATE TRIGGER log_session AFTER INSERT ON inventory_reservation
    FOR EACH ROW EXECUTE FUNCTION log_session();
";

/// Must show: `sb-inbox run` in session mode, two worker processes, 3 sessions × 200 ordered
/// orders with 30 % sent twice (the copy five orders later, as a publisher's retry), one worker
/// SIGKILLed mid-way: per session every order took effect exactly once and in sequence order,
/// and no two transactions ever worked on one session at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_session_workers_one_killed_apply_each_session_once_in_order() {
    use crate::survival::{EmulatorProcess, reservations, send, until};
    use crate::verification::WorkerProcess;
    use sb_inbox::Message;
    use sb_inbox_cli::inventory::InventoryStore as _;

    let test = "session_workers";
    let Some(emulator) = EmulatorProcess::spawn_with_queues(
        test,
        r#"{"Name":"orders","Properties":{"LockDuration":"PT10S","MaxDeliveryCount":10,"RequiresSession":true}}"#,
        &[],
    ) else {
        return;
    };
    const SESSIONS: [&str; 3] = ["s0", "s1", "s2"];
    const PER_SESSION: usize = 200;
    let store = crate::support::pg_store(test, 2).await;
    let schema = crate::support::schema_for(test);
    crate::verification::session(&schema)
        .await
        .batch_execute(SESSION_LOG)
        .await
        .unwrap();
    let url = crate::support::with_search_path(&crate::support::pg_url(), &schema);
    let env = [
        ("SB_INBOX_SESSIONS", "true"),
        ("SB_INBOX_MAX_SESSIONS", "2"),
        ("SB_INBOX_SESSION_IDLE_SECS", "2"),
    ];
    let mut workers: Vec<WorkerProcess> = (0..2)
        .map(|_| WorkerProcess::spawn_on(&emulator.connection, &url, 2, &env))
        .collect();
    let order = |session: &str, seq: usize| {
        let mut message = Message::new(
            format!("m-{session}-{seq}"),
            "orders.order-placed.v1",
            format!(
                r#"{{"orderId":"o-{session}-{seq}","lines":[{{"sku":"{}","quantity":1}}]}}"#,
                ["A", "B", "C"][seq % 3]
            ),
        );
        message.session_id = Some(session.to_owned());
        message
    };
    let client = emulator.client();
    let copied = |seq: usize| seq % 10 < 3;
    let senders: Vec<_> = SESSIONS
        .iter()
        .map(|session| {
            let sender = client.sender("orders");
            let messages: Vec<Message> = (0..PER_SESSION + 5)
                .flat_map(|n| {
                    let original = (n < PER_SESSION).then(|| order(session, n));
                    let copy = (n >= 5 && copied(n - 5)).then(|| order(session, n - 5));
                    original.into_iter().chain(copy)
                })
                .collect();
            assert_eq!(messages.len(), PER_SESSION * 13 / 10);
            tokio::spawn(async move {
                for message in messages {
                    send(&sender, message).await;
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
    let total = (SESSIONS.len() * PER_SESSION) as i64;
    until(
        "a third of the orders took effect",
        Duration::from_secs(120),
        || async { reservations(&store).await >= total / 3 },
    )
    .await;
    let killed = workers.remove(0);
    killed.kill().await;
    let at_kill = reservations(&store).await;
    until(
        "every order took effect",
        Duration::from_secs(300),
        || async { reservations(&store).await == total },
    )
    .await;
    let survivor = workers.remove(0);
    let stats = survivor.terminate().await;
    eprintln!(
        "{test}: {at_kill} effects at the kill; the survivor processed {}, {} duplicates",
        stats.get("processed"),
        stats.get("duplicate")
    );
    assert!(at_kill < total, "killed after everything was done");
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (total, total));
    let log = crate::verification::session(&schema)
        .await
        .query(
            "SELECT session, seq, backend, overlapped FROM session_log ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(log.len(), total as usize, "one effect per order");
    let overlapped = log.iter().filter(|row| row.get::<_, bool>(3)).count();
    assert_eq!(
        overlapped, 0,
        "two transactions worked on one session at once"
    );
    let mut backends = HashSet::new();
    for session in SESSIONS {
        let sequence: Vec<i32> = log
            .iter()
            .filter(|row| row.get::<_, String>(0) == session)
            .map(|row| row.get(1))
            .collect();
        let expected: Vec<i32> = (0..PER_SESSION as i32).collect();
        assert_eq!(sequence, expected, "session {session} out of order");
        backends.extend(
            log.iter()
                .filter(|row| row.get::<_, String>(0) == session)
                .map(|row| row.get::<_, i32>(2)),
        );
    }
    assert!(backends.len() >= 2, "both workers took part: {backends:?}");
}

/// The runtime in session mode, in-process: a handler three times as long as the 1 s lock keeps
/// the session lock through renew-session-lock (two messages, one after the other, in order);
/// then the session link is detached mid-handler, the session lock is lost with it, and the
/// commit is fenced: lock lost, no second effect, the message processed once after the session
/// is accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_runtime_keeps_the_session_lock_and_a_lost_one_fences_the_commit() {
    use crate::survival::until;
    use sb_inbox::servicebus::ServiceBusSessionSource;
    use sb_inbox::{ConsumerName, Message, Runtime, RuntimeConfig};
    use sb_inbox_cli::inventory::{InventoryStore as _, OrderPlacedConsumer};

    let test = "session_runtime";
    let store = crate::support::pg_store(test, 2).await;
    let emulator = session_emulator("PT1S", EmulatorOptions::default()).await;
    let client = crate::support::emulator::client(&emulator);
    let order = |id: &str, session: &str| {
        let mut message = Message::new(
            id,
            "orders.order-placed.v1",
            format!(r#"{{"orderId":"o-{id}","lines":[{{"sku":"A","quantity":1}}]}}"#),
        );
        message.session_id = Some(session.to_owned());
        message
    };
    let sender = client.sender("sq");
    for (id, session) in [("a1", "A"), ("a2", "A")] {
        sender.send(order(id, session)).await.unwrap();
    }
    let mut config =
        RuntimeConfig::new(ConsumerName::new(sb_inbox_cli::inventory::CONSUMER).unwrap());
    config.lock_margin = Duration::from_millis(300);
    let runtime = std::sync::Arc::new(Runtime::for_sessions(
        ServiceBusSessionSource::new(client.clone(), "sq").with_accept_wait(Duration::from_secs(1)),
        store.clone(),
        crate::support::handlers::Slow {
            inner: OrderPlacedConsumer::new(),
            duration: Duration::from_secs(3),
        },
        config,
    ));
    let (stop, running) = run_one_session_at_a_time(&runtime, Duration::from_secs(1));
    let stats = runtime.stats();
    let processed = |n: u64| {
        let stats = stats.clone();
        until(
            "messages are processed",
            Duration::from_secs(30),
            move || {
                let processed = stats.snapshot().processed;
                async move { processed == n }
            },
        )
    };
    processed(2).await;
    let kept = stats.snapshot();
    assert!(kept.renewals >= 4, "{kept:?}");
    assert_eq!(kept.lock_lost, 0, "{kept:?}");
    // A's messages took effect in their order.
    let rows = crate::verification::session(&crate::support::schema_for(test))
        .await
        .query(
            "SELECT order_id FROM inventory_reservation ORDER BY reserved_at",
            &[],
        )
        .await
        .unwrap();
    let reserved: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(reserved, ["o-a1", "o-a2"]);

    sender.send(order("b1", "B")).await.unwrap();
    let q = emulator.broker().entity("sq").unwrap();
    until("b1 is in hand", Duration::from_secs(30), || {
        let locked = q.counts().locked;
        async move { locked == 1 }
    })
    .await;
    detach_first_receiver(&emulator);
    // b1 is processed once the session is accepted again.
    processed(3).await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let done = stats.snapshot();
    assert_eq!((done.lock_lost, done.duplicate), (1, 0), "{done:?}");
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (3, 3));
}

/// Runs `runtime` on one session at a time, each let go after `idle`; stopped by the token.
fn run_one_session_at_a_time<R, S, H>(
    runtime: &std::sync::Arc<sb_inbox::Runtime<R, S, H>>,
    idle: Duration,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), sb_inbox::RuntimeError>>,
)
where
    R: sb_inbox::SessionSource,
    S: sb_inbox::Store,
    H: sb_inbox::Handler<S::Tx>,
{
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let (runtime, stop) = (runtime.clone(), stop.clone());
        async move {
            let sessions = sb_inbox::SessionConfig::default()
                .with_max_sessions(1)
                .with_idle(idle);
            runtime.run_sessions(sessions, stop).await
        }
    });
    (stop, running)
}

/// A host clock 60 s ahead of the broker's (the emulator's clock shifted back, as
/// `--clock-offset -60` runs it): every fresh 2 s session lock looks expired on the host. The
/// session runtime keeps the session through its messages (a 3 s handler on a 2 s lock) and
/// idle waits, renewing on its monotonic clock (with the host's view of the broker's timestamps
/// the second message's lock was renewed too late: its settlement failed and its redelivery
/// was a duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_clock_ahead_of_the_broker_keeps_its_sessions() {
    use crate::survival::until;
    use sb_inbox::servicebus::ServiceBusSessionSource;
    use sb_inbox::{ConsumerName, Message, Runtime, RuntimeConfig};

    let store = crate::support::sqlite_store("session_clock_ahead", 2).await;
    let emulator = crate::support::emulator::start_on_clock(
        vec![queue("sq", session_properties("PT2S"))],
        EmulatorOptions::default(),
        sb_emulator::Clock::shifted(-60),
    )
    .await;
    let client = crate::support::emulator::client(&emulator);
    let sender = client.sender("sq");
    for id in ["a1", "a2"] {
        let mut message = Message::new(id, "orders.order-placed.v1", "{}");
        message.session_id = Some("A".to_owned());
        sender.send(message).await.unwrap();
    }
    let mut config = RuntimeConfig::new(ConsumerName::new("billing.order-placed.v1").unwrap());
    config.lock_margin = Duration::from_millis(500);
    let runtime = std::sync::Arc::new(Runtime::for_sessions(
        ServiceBusSessionSource::new(client.clone(), "sq").with_accept_wait(Duration::from_secs(1)),
        store,
        crate::support::handlers::Slow {
            inner: crate::support::handlers::Noop::new(),
            duration: Duration::from_secs(3),
        },
        config,
    ));
    let (stop, running) = run_one_session_at_a_time(&runtime, Duration::from_secs(3));
    let stats = runtime.stats();
    until(
        "both messages are processed",
        Duration::from_secs(30),
        || {
            let processed = stats.snapshot().processed;
            async move { processed == 2 }
        },
    )
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let done = stats.snapshot();
    assert_eq!(
        (
            done.processed,
            done.duplicate,
            done.lock_lost,
            done.settle_failed
        ),
        (2, 0, 0, 0),
        "one delivery each, every settlement within its lock: {done:?}"
    );
    assert!(done.renewals >= 2, "{done:?}");
}

/// The service detaches a session link when the token that authorised it expires; accepting a
/// session afterwards puts a fresh token instead of failing for ever with the cached one.
#[tokio::test]
async fn a_session_accepted_after_its_token_expired_gets_a_fresh_token() {
    let emulator = session_emulator(
        "PT30S",
        EmulatorOptions::default().with_max_token_lifetime(Duration::from_secs(2)),
    )
    .await;
    send_session_messages(&emulator, &[("a1", "A")]).await;
    let client = crate::support::emulator::client(&emulator);
    let a = client.accept_session("sq", "A").await.unwrap();
    let a1 = a.receive(Duration::from_secs(5)).await.unwrap().unwrap();
    // Waits for the service to detach the link (unauthorized) once the 2 s grant ran out.
    let lost = a.receive(Duration::from_secs(30)).await;
    assert!(matches!(lost, Err(ReceiveError::Transient(_))), "{lost:?}");
    assert!(matches!(
        a1.complete().await,
        Err(SettlementError::LockLost)
    ));
    let again = client.accept_session("sq", "A").await.unwrap();
    let redelivered = again
        .receive(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(redelivered.message().message_id.as_deref(), Some("a1"));
    redelivered.complete().await.unwrap();
    again.close().await;
}

/// Issue 29 item 8: the worker's session source waits the service's 60 s for a next available
/// session, as .NET's session processor does (its `TryTimeout`), not the 5 s session idle time
/// it used to pass: a session whose first message comes 50 s into the accept is taken by that
/// accept.
#[tokio::test(start_paused = true)]
async fn a_next_session_accept_waits_60_s_for_a_session() {
    use sb_inbox::servicebus::ServiceBusSessionSource;

    let emulator = session_emulator("PT5M", EmulatorOptions::default()).await;
    let client = crate::support::emulator::client(&emulator);
    // Built as `sb-inbox run` builds it (src/worker/host.rs).
    let source = ServiceBusSessionSource::new(client, "sq");
    let accepting = tokio::spawn(async move { source.accept_next().await });
    tokio::time::sleep(Duration::from_secs(50)).await;
    send_session_messages(&emulator, &[("late", "L")]).await;
    let accepted = accepting.await.unwrap().unwrap();
    let session = accepted.expect("the pending accept takes the session that became available");
    assert_eq!(session.session_id(), "L");
}
