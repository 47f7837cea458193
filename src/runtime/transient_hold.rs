//! Holding a transiently failed delivery for a short backoff before its abandon.
//!
//! An abandon makes the message available again at once, and Service Bus counts every
//! delivery against the entity's `MaxDeliveryCount` (10 by default): a dependency that fails
//! fast for a few seconds would spend all ten attempts within those seconds and dead-letter the
//! message `MaxDeliveryCountExceeded`. Service Bus has no abandon-with-delay (the SDKs' retry
//! options cover client operations, not message redelivery: `ServiceBusRetryOptions` in
//! azure-sdk-for-net `sdk/servicebus/Azure.Messaging.ServiceBus/src/Primitives/
//! ServiceBusRetryOptions.cs`), so the delay is spent holding the lock, which the lock keeper
//! renews meanwhile, as NServiceBus's immediate-retry delay and MassTransit's in-memory
//! `UseMessageRetry` intervals do.

use std::time::Duration;

use rand::{RngExt, SeedableRng as _};
use tokio_util::sync::CancellationToken;

use std::collections::BTreeMap;

use super::backoff::{equal_jitter, exponential_step};
use super::circuit::{Circuit, CircuitPhase};
use crate::ports::{Delivery, PropertyValue, SettleError};

/// The first step of the hold; it doubles with each delivery of the message.
pub(super) const FIRST_STEP: Duration = Duration::from_millis(250);

/// How long to hold delivery number `number` (1-based) before its abandon: half of
/// the step `FIRST_STEP × 2^(n−1)` (capped at `max`) plus a random part up to the other half,
/// so that deliveries failed together are not redelivered together; and at most half of the
/// lock left, so the hold never depends on a renewal.
pub(super) fn delay(
    number: u32,
    max: Duration,
    lock_left: Duration,
    rng: &mut impl RngExt,
) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    let step = exponential_step(FIRST_STEP.min(max), max, number.max(1));
    equal_jitter(step, rng).min(lock_left / 2)
}

/// Gives a transiently failed delivery back: released at once while the kill switch is open
/// (the store fails for every message alike, so the attempt was not the message's and AMQP
/// `released` does not count it: without this the one trial delivery let in after each probe,
/// the head of the queue every time, would reach the max delivery count over a long outage),
/// else abandoned after [`hold`] (cut short by `cancel`).
pub(super) async fn give_back<D: Delivery>(
    delivery: &D,
    circuit: &Circuit,
    lock_left: Duration,
    max: Duration,
    jitter: &super::JitterSource,
    properties: BTreeMap<String, PropertyValue>,
    cancel: &CancellationToken,
) -> Result<(), SettleError> {
    if circuit.phase() == CircuitPhase::Open {
        tracing::debug!("Kill switch open: releasing the failed delivery uncounted.");
        return delivery.release().await;
    }
    hold(delivery, lock_left, max, jitter, cancel).await;
    delivery.abandon(properties).await
}

/// Holds `delivery` (its lock kept by the caller's lock keeper) for [`delay`]. `lock_left` is
/// the keeper's reckoning on the monotonic clock, not `locked_until − now` on the host's wall
/// clock: a host ahead of the broker by a lock duration would see every lock expired and hold
/// nothing, one behind would hold past the real lock. `cancel` (a shutdown past its grace)
/// ends the hold at once: the hold only spreads redeliveries, and a process about to be killed
/// should settle, not sleep through its last seconds.
pub(super) async fn hold<D: Delivery>(
    delivery: &D,
    lock_left: Duration,
    max: Duration,
    jitter: &super::JitterSource,
    cancel: &CancellationToken,
) {
    // The port's count is of deliveries before this one.
    let number = delivery.delivery_count().saturating_add(1);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(jitter.draw_seed());
    let wait = delay(number, max, lock_left, &mut rng);
    if !wait.is_zero() {
        tracing::debug!(?wait, "Holding a transient failure before its abandon.");
        if cancel
            .run_until_cancelled(tokio::time::sleep(wait))
            .await
            .is_none()
        {
            tracing::debug!("Shutdown: the transient hold was cut short.");
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    const LONG_LOCK: Duration = Duration::from_secs(60);

    #[test]
    fn the_hold_grows_with_the_delivery_count_up_to_the_cap() {
        let mut rng = SmallRng::seed_from_u64(1);
        let max = Duration::from_secs(5);
        let steps_ms = [250, 500, 1000, 2000, 4000, 5000, 5000];
        for (i, step) in steps_ms.into_iter().enumerate() {
            let count = u32::try_from(i + 1).unwrap();
            let d = delay(count, max, LONG_LOCK, &mut rng);
            let step = Duration::from_millis(step);
            assert!(d >= step / 2 && d <= step, "delivery {count}: {d:?}");
        }
        // Ten deliveries of a fast failure now span seconds, not milliseconds.
        let total: Duration = (1..=10).map(|n| delay(n, max, LONG_LOCK, &mut rng)).sum();
        assert!(total >= Duration::from_secs(16), "{total:?}");
    }

    #[test]
    fn the_hold_stays_inside_the_lock_and_zero_turns_it_off() {
        let mut rng = SmallRng::seed_from_u64(2);
        let d = delay(9, Duration::from_secs(5), Duration::from_secs(2), &mut rng);
        assert!(d <= Duration::from_secs(1), "{d:?}");
        assert_eq!(
            delay(9, Duration::ZERO, LONG_LOCK, &mut rng),
            Duration::ZERO
        );
    }

    #[test]
    fn deliveries_failed_together_are_spread() {
        let mut rng = SmallRng::seed_from_u64(3);
        let delays: std::collections::BTreeSet<_> = (0..20)
            .map(|_| delay(4, Duration::from_secs(5), LONG_LOCK, &mut rng))
            .collect();
        assert!(delays.len() > 15, "{delays:?}");
    }
}
