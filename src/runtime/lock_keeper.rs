//! The lock keeper: renews a delivery's lock from receipt to settlement and fences the commit
//! once the lock is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Clock;
use crate::ports::{Delivery, SettleError};

/// Keeps a delivery's lock alive while it waits for a handler slot and while its handler runs.
///
/// Lock timing does not trust the host's wall clock: at receipt the lock's remaining time is
/// taken as `locked_until − now`, but never more than `locked_until − enqueued_time` (both broker
/// timestamps: the broker was at least at the enqueued time when it delivered), and a host
/// clock so far ahead that the lock looks expired falls back to that broker-side bound. That bound
/// is loose for a backlog (a message enqueued an hour ago bounds its lock by an hour), so the
/// keeper also learns the entity's lock duration: no lock lasts longer than the shortest
/// `locked_until − enqueued_time` seen (a message delivered right after it was enqueued gives
/// the duration itself), and every lock at receipt is bounded by it too. From then
/// on the expiry is a point on the monotonic clock, moved by each renewal by exactly how far the
/// broker moved `locked_until`. So a host clock behind the broker cannot make renewals late
/// (for messages delivered soon after they were enqueued), and one ahead of it only makes them
/// earlier.
///
/// It renews at `expiry − margin`, but never before half of the remaining lock has passed (a
/// margin as long as the lock would otherwise renew without pause). A renewal that fails
/// transiently is retried every `margin / 4` (at least 50 ms) for as long as the current lock
/// lasts. The lock counts as lost when the broker says so or when its expiry passes without a
/// successful renewal; the keeper then cancels [`KeptLock::lost`], which stops the handler and
/// forbids the commit.
#[derive(Debug, Clone)]
pub struct LockKeeper {
    margin: Duration,
    clock: Clock,
    meter: Option<RenewalMeter>,
    /// The shortest `locked_until − enqueued_time` seen, in nanoseconds (`u64::MAX`: none
    /// yet): an upper bound of the entity's lock duration, shared by the keeper's clones.
    longest_lock: Arc<AtomicU64>,
}

/// Counts renewal attempts by result (`sb_inbox.lock.renewals`).
#[derive(Debug, Clone)]
pub(crate) struct RenewalMeter {
    pub(crate) counter: opentelemetry::metrics::Counter<u64>,
    pub(crate) labels: Arc<[opentelemetry::KeyValue]>,
}

impl RenewalMeter {
    fn record(&self, result: &'static str) {
        let mut labels = self.labels.to_vec();
        labels.push(opentelemetry::KeyValue::new(
            crate::telemetry::names::attr::RENEWAL_RESULT,
            result,
        ));
        self.counter.add(1, &labels);
    }
}

/// The lock of one delivery under a [`LockKeeper`]. Dropping it stops the renewals.
#[derive(Debug)]
pub struct KeptLock {
    lost: CancellationToken,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    state: Arc<LockState>,
}

/// The lock's expiry on the monotonic clock: nanoseconds after `base`.
#[derive(Debug)]
struct LockState {
    base: Instant,
    expiry_ns: AtomicU64,
    renewals: AtomicU32,
    /// The span each renewal's client span is a child of: the one current at receipt, then the
    /// process span once handling starts ([`KeptLock::follow`]).
    parent: std::sync::Mutex<tracing::Span>,
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl LockState {
    fn expiry(&self) -> Instant {
        self.base + Duration::from_nanos(self.expiry_ns.load(Ordering::Acquire))
    }

    fn extend(&self, by: Duration) {
        // Only the renewing task writes; readers see the old or the new expiry.
        let old = self.expiry_ns.load(Ordering::Acquire);
        self.expiry_ns
            .store(old.saturating_add(nanos(by)), Ordering::Release);
    }
}

/// How long a lock has left at receipt, from the broker's timestamps as far as they allow (see
/// [`LockKeeper`]): the host's view `locked_until − now`, bounded by `locked_until −
/// enqueued_time` and by `longest_lock`, the longest any lock of the entity lasts; the bounds
/// alone when the host's clock is so far ahead that the lock looks expired.
pub(crate) fn remaining_at_receipt(
    locked_until: SystemTime,
    enqueued: Option<SystemTime>,
    now: SystemTime,
    longest_lock: Option<Duration>,
) -> Duration {
    let host_view = locked_until.duration_since(now).ok();
    let broker_bound = enqueued.and_then(|at| locked_until.duration_since(at).ok());
    [host_view, broker_bound, longest_lock]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::ZERO)
}

impl LockKeeper {
    /// A keeper renewing `margin` before each expiry.
    pub fn new(margin: Duration, clock: Clock) -> Self {
        LockKeeper {
            margin,
            clock,
            meter: None,
            longest_lock: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// How long a lock received now has left ([`remaining_at_receipt`]), learning from its
    /// timestamps how long the entity's locks last at most.
    pub(crate) fn remaining(
        &self,
        locked_until: SystemTime,
        enqueued: Option<SystemTime>,
    ) -> Duration {
        if let Some(bound) = enqueued.and_then(|at| locked_until.duration_since(at).ok()) {
            self.longest_lock.fetch_min(nanos(bound), Ordering::AcqRel);
        }
        let longest = match self.longest_lock.load(Ordering::Acquire) {
            u64::MAX => None,
            ns => Some(Duration::from_nanos(ns)),
        };
        remaining_at_receipt(locked_until, enqueued, self.clock.now(), longest)
    }

    /// The same keeper, told how long the entity's locks last (its `LockDuration`, read at
    /// start): every lock is bounded by it from the first delivery on. Without it the bound is
    /// learned from `locked_until − enqueued_time`, which a message that waited in the queue
    /// stretches by its wait; on a host behind the broker that stretch was taken as time left,
    /// so a handler stalled past its real lock could still commit.
    pub(crate) fn knowing(self, lock_duration: Option<Duration>) -> Self {
        if let Some(lock) = lock_duration {
            self.longest_lock.fetch_min(nanos(lock), Ordering::AcqRel);
        }
        self
    }

    /// The same keeper, counting each renewal attempt.
    pub(crate) fn metered(mut self, meter: RenewalMeter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Starts keeping `delivery`'s lock in a background task, from now (call it at receipt).
    pub fn keep<D: Delivery>(&self, delivery: Arc<D>) -> KeptLock {
        let remaining = self.remaining(delivery.locked_until(), delivery.enqueued_time());
        self.keep_for(delivery, remaining)
    }

    /// Starts keeping `delivery`'s lock, which has `remaining` left now: a session's delivery,
    /// whose lock is the session's, granted before the delivery (its enqueued time bounds
    /// nothing), as the session's own keep-alive reckons it.
    pub(crate) fn keep_for<D: Delivery>(&self, delivery: Arc<D>, remaining: Duration) -> KeptLock {
        let (mut kept, renewer) = self.renewer(delivery, remaining);
        let stop = kept.stop.clone();
        // In the current span: each renewal's client span is its child.
        kept.task = Some(tokio::spawn(
            async move {
                // Stopping ends the renewals: the delivery is settled or abandoned to redelivery.
                stop.run_until_cancelled(renewer.run()).await;
            }
            .in_current_span(),
        ));
        kept
    }

    /// The kept lock and what renews it, not yet started.
    fn renewer<D: Delivery>(
        &self,
        delivery: Arc<D>,
        remaining: Duration,
    ) -> (KeptLock, Renewer<D>) {
        let base = Instant::now();
        let state = Arc::new(LockState {
            base,
            expiry_ns: AtomicU64::new(nanos(remaining)),
            renewals: AtomicU32::new(0),
            parent: std::sync::Mutex::new(tracing::Span::current()),
        });
        let kept = KeptLock {
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            task: None,
            state: state.clone(),
        };
        let renewer = Renewer {
            delivery,
            margin: self.margin,
            lost: kept.lost.clone(),
            state,
            meter: self.meter.clone(),
        };
        (kept, renewer)
    }
}

impl KeptLock {
    /// Cancelled once the lock is lost.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// True while the lock is held: not reported lost and not past its known expiry.
    pub fn is_held(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.state.expiry()
    }

    /// Makes later renewals children of `span` (the process span, once handling starts).
    pub fn follow(&self, span: &tracing::Span) {
        *self
            .state
            .parent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = span.clone();
    }

    /// How long the lock has left, on the monotonic clock: the broker's lock duration as
    /// learned at receipt and from each renewal, never the host's wall clock against the
    /// broker's timestamp.
    pub(crate) fn left(&self) -> Duration {
        self.state
            .expiry()
            .saturating_duration_since(Instant::now())
    }

    /// Successful renewals so far.
    pub fn renewals(&self) -> u32 {
        self.state.renewals.load(Ordering::Acquire)
    }

    /// Stops the renewals and waits until the renewing task has ended (so no renewal, and no
    /// span of one, outlives the delivery's processing).
    pub async fn release(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // A renewal task that panicked has stopped all the same.
            let _ = task.await;
        }
    }
}

impl Drop for KeptLock {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct Renewer<D> {
    delivery: Arc<D>,
    margin: Duration,
    lost: CancellationToken,
    state: Arc<LockState>,
    meter: Option<RenewalMeter>,
}

impl<D: Delivery> Renewer<D> {
    /// When to renew next: `margin` before the expiry, but not before half of what is left.
    fn next_renewal(&self, now: Instant) -> Instant {
        let expiry = self.state.expiry();
        let half = expiry.saturating_duration_since(now) / 2;
        expiry
            .checked_sub(self.margin)
            .unwrap_or(now)
            .max(now + half)
    }

    async fn run(self) {
        let retry = (self.margin / 4).max(Duration::from_millis(50));
        // The broker's timestamp of the current expiry: each renewal moves the monotonic expiry
        // by as much as the broker moved this.
        let mut until = self.delivery.locked_until();
        let mut next = self.next_renewal(Instant::now());
        loop {
            tokio::time::sleep_until(next).await;
            let parent = self
                .state
                .parent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            // Boxed: a delivery's renewal may be a large future (a client's request on its
            // management link), and this task lives as long as its delivery is held; inline,
            // every delivery in the receive window would carry it (and every spawn copy it)
            // although most are settled before their first renewal.
            let renewed = Box::pin(self.delivery.renew_lock().instrument(parent)).await;
            if let Some(meter) = &self.meter {
                meter.record(match &renewed {
                    Ok(_) => crate::telemetry::names::value::OK,
                    Err(error) => error.error_type(),
                });
            }
            match renewed {
                Ok(new_until) => {
                    self.state
                        .extend(new_until.duration_since(until).unwrap_or(Duration::ZERO));
                    until = new_until;
                    next = self.next_renewal(Instant::now());
                    self.state.renewals.fetch_add(1, Ordering::AcqRel);
                    tracing::debug!(lock_token = %self.delivery.lock_token(), "Lock renewed.");
                }
                Err(SettleError::LockLost) => {
                    tracing::warn!(lock_token = %self.delivery.lock_token(), "Lock lost on renewal.");
                    self.lost.cancel();
                    return;
                }
                Err(error) => {
                    let now = Instant::now();
                    let expiry = self.state.expiry();
                    if now + retry >= expiry {
                        // No retry can land before the lock runs out: wait for the expiry, then
                        // fence. The handler may still commit until then.
                        tokio::time::sleep_until(expiry).await;
                        tracing::warn!(lock_token = %self.delivery.lock_token(), %error, "Lock expired while renewals failed.");
                        self.lost.cancel();
                        return;
                    }
                    tracing::debug!(%error, "Lock renewal failed; retrying.");
                    next = now + retry;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    /// A delivery whose renewal holds 64 KiB across its await, as a management request's future
    /// holds its link's state.
    struct HeavyRenewal(crate::Message);

    impl Delivery for HeavyRenewal {
        fn message(&self) -> &crate::Message {
            &self.0
        }
        fn delivery_count(&self) -> u32 {
            0
        }
        fn lock_token(&self) -> uuid::Uuid {
            uuid::Uuid::nil()
        }
        fn locked_until(&self) -> SystemTime {
            UNIX_EPOCH
        }
        async fn renew_lock(&self) -> Result<SystemTime, SettleError> {
            let request = [1u8; 64 * 1024];
            tokio::task::yield_now().await;
            Ok(UNIX_EPOCH + Duration::from_secs(u64::from(request[0])))
        }
        async fn complete(&self) -> Result<(), SettleError> {
            Ok(())
        }
        async fn abandon(
            &self,
            _: std::collections::BTreeMap<String, crate::PropertyValue>,
        ) -> Result<(), SettleError> {
            Ok(())
        }
        async fn release(&self) -> Result<(), SettleError> {
            Ok(())
        }
        async fn dead_letter(&self, _: &str, _: &str) -> Result<(), SettleError> {
            Ok(())
        }
    }

    /// Every delivery in the receive window has its renewing task from receipt: what the task
    /// holds is paid per delivery held (a batched worker 40 ms from its broker holds over a
    /// thousand), so a renewal's own state must not be part of it until it renews. Before, each
    /// task carried the client's renewal request inline (24 KiB: 30 of a batched worker's 39 MB
    /// of heap at its peak, heaptrack).
    #[test]
    fn a_kept_lock_holds_no_renewal_state_until_it_renews() {
        let keeper = LockKeeper::new(Duration::from_secs(10), Clock::new());
        let delivery = Arc::new(HeavyRenewal(crate::Message::new("m-1", "c.v1", "{}")));
        let (_kept, renewer) = keeper.renewer(delivery, Duration::from_secs(30));
        let task = renewer.run();
        let size = std::mem::size_of_val(&task);
        assert!(size < 1024, "the renewing task takes {size} bytes");
    }

    #[test]
    fn remaining_lock_is_bounded_by_the_broker_timestamps() {
        let s = Duration::from_secs;
        let enqueued = UNIX_EPOCH + s(1_000);
        let until = enqueued + s(30);
        // Host in step with the broker.
        assert_eq!(
            remaining_at_receipt(until, Some(enqueued), enqueued + s(1), None),
            s(29)
        );
        // Host 60 s behind: its view says 90 s, the broker's timestamps say at most 30 s.
        assert_eq!(
            remaining_at_receipt(until, Some(enqueued), enqueued - s(60), None),
            s(30)
        );
        // Host 60 s ahead: the lock looks expired; the broker bound stands in.
        assert_eq!(
            remaining_at_receipt(until, Some(enqueued), enqueued + s(60), None),
            s(30)
        );
        // No enqueued time: the host's view, or nothing.
        assert_eq!(remaining_at_receipt(until, None, enqueued, None), s(30));
        assert_eq!(
            remaining_at_receipt(until, None, enqueued + s(60), None),
            Duration::ZERO
        );
    }

    /// A backlog on a host 60 s ahead of the broker: a message enqueued an hour before its
    /// delivery bounds its 30 s lock by an hour and a half minute, and on the host clock the
    /// lock looks expired; before, the keeper took that hour as the lock's time left and renewed
    /// far too late. Once one message delivered right after its enqueue has shown the locks last
    /// 30 s, every later lock is bounded by that, and a lock that looks expired too.
    #[tokio::test(start_paused = true)]
    async fn a_backlog_on_a_host_ahead_is_bounded_by_the_learned_lock_duration() {
        let s = Duration::from_secs;
        let host = Clock::new();
        let broker_now = || host.now() - s(60);
        let keeper = LockKeeper::new(s(10), host);
        let fresh = keeper.remaining(broker_now() + s(30), Some(broker_now()));
        assert_eq!(fresh, s(30), "looks expired on the host: the broker bound");
        let backlog = keeper.remaining(broker_now() + s(30), Some(broker_now() - s(3600)));
        assert_eq!(backlog, s(30), "not the hour and a half minute");
        // Without the fresh message first, the backlog's own bound is all there is.
        let unlearned = LockKeeper::new(s(10), host);
        let loose = unlearned.remaining(broker_now() + s(30), Some(broker_now() - s(3600)));
        assert_eq!(loose, s(3630));
    }

    /// A host 60 s behind the broker, a message that waited 30 s in the queue before its 5 s
    /// lock: the host's view (65 s) and the broker's bound (35 s) both overstate the lock; the
    /// entity's lock duration, known at start, bounds it to 5 s. Before, the keeper took 35 s,
    /// so a handler stalled past the real lock committed unfenced (found by `sb-inbox verify`'s
    /// lock-loss scenario against a broker whose clock ran a minute ahead).
    #[tokio::test(start_paused = true)]
    async fn a_host_behind_the_broker_is_bounded_by_the_entitys_lock_duration() {
        let s = Duration::from_secs;
        let host = Clock::new();
        let broker_now = || host.now() + s(60);
        let waited =
            |keeper: &LockKeeper| keeper.remaining(broker_now() + s(5), Some(broker_now() - s(30)));
        assert_eq!(waited(&LockKeeper::new(s(1), host)), s(35), "unbounded");
        let told = LockKeeper::new(s(1), host).knowing(Some(s(5)));
        assert_eq!(waited(&told), s(5));
        assert_eq!(
            waited(&LockKeeper::new(s(1), host).knowing(None)),
            s(35),
            "nothing known, nothing changed"
        );
    }
}
