use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Clock;
use crate::ports::{Delivery, SettleError};

/// Keeps a delivery's lock alive while its handler runs.
///
/// It renews at `locked_until − margin`. A renewal that fails transiently is retried every
/// `margin / 4` (at least 50 ms) for as long as the current lock lasts. The lock counts as lost
/// when the broker says so or when its expiry passes without a successful renewal; the keeper
/// then cancels [`KeptLock::lost`], which stops the handler and forbids the commit.
#[derive(Debug, Clone)]
pub struct LockKeeper {
    margin: Duration,
    clock: Clock,
    meter: Option<RenewalMeter>,
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
    clock: Clock,
}

#[derive(Debug)]
struct LockState {
    until_ms: AtomicU64,
    renewals: AtomicU32,
}

fn to_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl LockKeeper {
    /// A keeper renewing `margin` before each expiry.
    pub fn new(margin: Duration, clock: Clock) -> Self {
        LockKeeper {
            margin,
            clock,
            meter: None,
        }
    }

    /// The same keeper, counting each renewal attempt.
    pub(crate) fn metered(mut self, meter: RenewalMeter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Starts keeping `delivery`'s lock in a background task.
    pub fn keep<D: Delivery>(&self, delivery: Arc<D>) -> KeptLock {
        let mut kept = KeptLock {
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            task: None,
            state: Arc::new(LockState {
                until_ms: AtomicU64::new(to_ms(delivery.locked_until())),
                renewals: AtomicU32::new(0),
            }),
            clock: self.clock,
        };
        let task = Renewer {
            delivery,
            margin: self.margin,
            clock: self.clock,
            lost: kept.lost.clone(),
            state: kept.state.clone(),
            meter: self.meter.clone(),
        };
        let stop = kept.stop.clone();
        // In the current (process) span: each renewal's client span is its child.
        kept.task = Some(tokio::spawn(
            async move {
                // Stopping ends the renewals: the delivery is settled or abandoned to redelivery.
                stop.run_until_cancelled(task.run()).await;
            }
            .in_current_span(),
        ));
        kept
    }
}

impl KeptLock {
    /// Cancelled once the lock is lost.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// True while the lock is held: not reported lost and not past its known expiry.
    pub fn is_held(&self) -> bool {
        !self.lost.is_cancelled()
            && to_ms(self.clock.now()) < self.state.until_ms.load(Ordering::Acquire)
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
    clock: Clock,
    lost: CancellationToken,
    state: Arc<LockState>,
    meter: Option<RenewalMeter>,
}

impl<D: Delivery> Renewer<D> {
    async fn run(self) {
        let retry = (self.margin / 4).max(Duration::from_millis(50));
        let mut until = self.delivery.locked_until();
        let mut next = until.checked_sub(self.margin).unwrap_or(until);
        loop {
            self.clock.sleep_until(next).await;
            let renewed = self.delivery.renew_lock().await;
            if let Some(meter) = &self.meter {
                meter.record(match &renewed {
                    Ok(_) => crate::telemetry::names::value::OK,
                    Err(error) => error.error_type(),
                });
            }
            match renewed {
                Ok(new_until) => {
                    until = new_until;
                    next = until.checked_sub(self.margin).unwrap_or(until);
                    self.state.until_ms.store(to_ms(until), Ordering::Release);
                    self.state.renewals.fetch_add(1, Ordering::AcqRel);
                    tracing::debug!(lock_token = %self.delivery.lock_token(), "Lock renewed.");
                }
                Err(SettleError::LockLost) => {
                    tracing::warn!(lock_token = %self.delivery.lock_token(), "Lock lost on renewal.");
                    self.lost.cancel();
                    return;
                }
                Err(error) => {
                    let now = self.clock.now();
                    if now + retry >= until {
                        // No retry can land before the lock runs out: wait for the expiry, then
                        // fence. The handler may still commit until then.
                        self.clock.sleep_until(until).await;
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
