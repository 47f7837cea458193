//! Delayed retries: on a transient failure, schedule a copy of the message for later and complete
//! the original, instead of abandoning it for an immediate redelivery.
//!
//! The copy keeps the *logical* message id in [`LOGICAL_ID_PROPERTY`] and gets a broker message
//! id of its own, derived from the broker id of the delivery that failed (`{delivered}/retry-{n}`):
//! broker duplicate detection would drop a copy that kept the original's broker id, or repeated
//! the id of an earlier copy (a dead letter resubmitted and failing again would otherwise send
//! `{logical}/retry-1` a second time, which the broker drops within its window); the inbox keys
//! on the logical id, so a copy and its original can never both take effect. [`RETRY_ATTEMPT_PROPERTY`] counts the retries; once
//! [`RetryPolicy::max_retries`] copies have failed too, the message is dead-lettered with
//! `RetriesExhausted`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::jitter::JitterSource;
use crate::envelope::{LOGICAL_ID_PROPERTY, derived_message_id};
use crate::ports::{Message, PropertyValue, SendFailure, Sender};

/// The application property an abandon writes with the failure that caused it (a delayed
/// retry's copy carries it too).
pub const LAST_ERROR_PROPERTY: &str = "sb-inbox-last-error";

/// The application property that counts the delayed retries a message copy stands for (1 on
/// the first copy).
pub const RETRY_ATTEMPT_PROPERTY: &str = "sb-inbox-retry-attempt";

/// The application property counting how often a message was resubmitted from a dead-letter
/// queue (1 on the first resubmission; `sb_inbox::servicebus::resubmission` writes it).
pub const RESUBMISSION_PROPERTY: &str = "sb-inbox-resubmission";

/// How often the message was resubmitted ([`RESUBMISSION_PROPERTY`]; 0 for none or an
/// unreadable value).
pub(crate) fn resubmissions(message: &Message) -> i64 {
    match message.application_properties.get(RESUBMISSION_PROPERTY) {
        Some(PropertyValue::Long(n)) => (*n).max(0),
        _ => 0,
    }
}

/// The application property holding when the broker first enqueued the message a copy stands
/// for, in milliseconds since the Unix epoch: a copy is enqueued anew, so without it a
/// dead-lettered copy's age (the DLQ resubmission window) would count from the copy.
pub const ORIGINAL_ENQUEUED_TIME_PROPERTY: &str = "sb-inbox-original-enqueued-time";

/// When the message was first enqueued, as a copy carries it in
/// [`ORIGINAL_ENQUEUED_TIME_PROPERTY`]; `None` for an original (its own enqueued time counts)
/// or an unreadable value.
pub fn original_enqueued_time(message: &Message) -> Option<SystemTime> {
    match message
        .application_properties
        .get(ORIGINAL_ENQUEUED_TIME_PROPERTY)
    {
        Some(PropertyValue::Long(ms)) => u64::try_from(*ms)
            .ok()
            .and_then(|ms| SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))),
        _ => None,
    }
}

/// A retry policy that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid retry policy: {0}")]
pub struct InvalidRetryPolicy(&'static str);

/// How many delayed retries, and how long each waits: exponential backoff with jitter.
///
/// Retry `n` (1-based) waits `base × 2^(n−1)`, capped at `max`, then shortened by up to the
/// jitter fraction: `backoff × (1 − jitter × u)` with `u` from the [`JitterSource`]. Jitter
/// spreads the copies of messages that failed together (a database failover) so they do not
/// come back as one burst; it only ever shortens a delay, so `max` stays an upper bound.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_inbox::runtime::{JitterSource, RetryPolicy};
/// let policy = RetryPolicy::new(5, Duration::from_secs(10), Duration::from_secs(60))?
///     .with_jitter(0.2, JitterSource::fixed(0.5))?;
/// let delays: Vec<u64> = (1..=5).map(|n| policy.delay(n).as_secs()).collect();
/// assert_eq!(delays, [9, 18, 36, 54, 54]);
/// # Ok::<(), sb_inbox::runtime::InvalidRetryPolicy>(())
/// ```
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    max_retries: u32,
    base_delay: Duration,
    max_delay: Duration,
    jitter: f64,
    source: JitterSource,
}

/// The jitter fraction [`RetryPolicy::new`] starts with.
pub const DEFAULT_JITTER: f64 = 0.2;

impl RetryPolicy {
    /// `max_retries` delayed retries from `base_delay` doubling up to `max_delay`, with
    /// [`DEFAULT_JITTER`] from [`JitterSource::random`].
    ///
    /// # Errors
    /// [`InvalidRetryPolicy`] for zero retries, a zero base delay or a cap below the base.
    pub fn new(
        max_retries: u32,
        base_delay: Duration,
        max_delay: Duration,
    ) -> Result<Self, InvalidRetryPolicy> {
        if max_retries == 0 {
            return Err(InvalidRetryPolicy(
                "max_retries must be at least 1 (leave delayed retries off for plain abandon)",
            ));
        }
        if base_delay.is_zero() {
            return Err(InvalidRetryPolicy("base_delay must be positive"));
        }
        if max_delay < base_delay {
            return Err(InvalidRetryPolicy(
                "max_delay must not be shorter than base_delay",
            ));
        }
        Ok(RetryPolicy {
            max_retries,
            base_delay,
            max_delay,
            jitter: DEFAULT_JITTER,
            source: JitterSource::random(),
        })
    }

    /// The same policy with jitter `fraction` (0 = exact delays, 1 = anywhere in `(0, backoff]`)
    /// drawn from `source`.
    ///
    /// # Errors
    /// [`InvalidRetryPolicy`] when `fraction` is outside `[0, 1]`.
    pub fn with_jitter(
        mut self,
        fraction: f64,
        source: JitterSource,
    ) -> Result<Self, InvalidRetryPolicy> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(InvalidRetryPolicy("jitter must be a fraction in 0..=1"));
        }
        self.jitter = fraction;
        self.source = source;
        Ok(self)
    }

    /// Delayed retries before the message is dead-lettered with `RetriesExhausted`.
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The first retry's backoff.
    pub fn base_delay(&self) -> Duration {
        self.base_delay
    }

    /// The longest backoff.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The jitter fraction.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// Retry `attempt`'s backoff before jitter: `base × 2^(attempt−1)`, capped at the maximum.
    pub fn backoff(&self, attempt: u32) -> Duration {
        super::backoff::exponential_step(self.base_delay, self.max_delay, attempt)
    }

    /// Retry `attempt`'s delay: the backoff shortened by up to the jitter fraction.
    pub fn delay(&self, attempt: u32) -> Duration {
        let backoff = self.backoff(attempt);
        let cut = self.jitter * self.source.sample();
        backoff.mul_f64((1.0 - cut).clamp(0.0, 1.0))
    }
}

/// The object-safe face of a [`Sender`], so [`DelayedRetry`] needs no type parameter.
trait ErasedSender: Send + Sync + 'static {
    fn send_boxed<'a>(
        &'a self,
        destination: &'a str,
        message: Message,
        at: SystemTime,
    ) -> Pin<Box<dyn Future<Output = Result<(), SendFailure>> + Send + 'a>>;
}

impl<T: Sender> ErasedSender for T {
    fn send_boxed<'a>(
        &'a self,
        destination: &'a str,
        message: Message,
        at: SystemTime,
    ) -> Pin<Box<dyn Future<Output = Result<(), SendFailure>> + Send + 'a>> {
        Box::pin(self.send(destination, message, Some(at)))
    }
}

/// Delayed retries for a runtime: the policy, and where the copies go through which [`Sender`].
///
/// The destination is the consumed entity's send address: for a queue, the queue itself. A
/// topic subscription has no send address of its own (a copy sent to the topic would reach every
/// subscription): forward the subscription to a queue (`ForwardTo`) and consume that queue, or
/// keep plain abandon.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # fn example(publisher: sb_inbox::servicebus::ServiceBusSenderPort) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use sb_inbox::runtime::{DelayedRetry, RetryPolicy};
/// use sb_inbox::{ConsumerName, RuntimeConfig};
/// let policy = RetryPolicy::new(5, Duration::from_secs(10), Duration::from_secs(600))?;
/// let mut config = RuntimeConfig::new(ConsumerName::new("inventory.order-placed.v1")?);
/// config.delayed_retry = Some(DelayedRetry::new(policy, publisher, "orders"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DelayedRetry {
    policy: RetryPolicy,
    destination: String,
    sender: Arc<dyn ErasedSender>,
}

impl DelayedRetry {
    /// Copies go to `destination` through `sender`, as `policy` says.
    pub fn new(policy: RetryPolicy, sender: impl Sender, destination: impl Into<String>) -> Self {
        DelayedRetry {
            policy,
            destination: destination.into(),
            sender: Arc::new(sender),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Where the copies go.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    pub(crate) async fn send(&self, copy: Message, at: SystemTime) -> Result<(), SendFailure> {
        self.sender.send_boxed(&self.destination, copy, at).await
    }
}

impl fmt::Debug for DelayedRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayedRetry")
            .field("policy", &self.policy)
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}

/// A delayed retry the runtime scheduled: the copy was accepted by the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduledRetry {
    /// Which retry the copy is (1 for the first).
    pub attempt: u32,
    /// How long the copy waits.
    pub delay: Duration,
    /// When the broker makes the copy available.
    pub at: SystemTime,
}

/// The delayed retries a message (copy) stands for: 0 for an original; unreadable values count
/// as 0 so a tampered property can only lengthen, never skip, the retries.
pub(crate) fn attempts_so_far(message: &Message) -> u32 {
    match message.application_properties.get(RETRY_ATTEMPT_PROPERTY) {
        Some(PropertyValue::Long(n)) => u32::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

/// The broker message id of retry `attempt` of the delivery whose broker id is `delivered`:
/// `{delivered}/retry-{n}`. Each delivered broker id is new along a message's life (the
/// original, each copy, each resubmission), so no copy repeats an earlier copy's id; and the id
/// is deterministic, so a copy sent again after an ambiguous send failure is dropped by broker
/// duplicate detection where it is on.
pub(crate) fn copy_message_id(delivered: &str, attempt: u32) -> String {
    derived_message_id(delivered, &format!("retry-{attempt}"))
}

/// The copy of `message` for retry `attempt`: the same subject, body and properties, a fresh
/// broker id, the logical id kept, the attempt and the failure recorded, and the first enqueue
/// time kept: the one an earlier copy carries, else `enqueued` (the delivery's).
pub(crate) fn copy(
    message: &Message,
    logical_id: &str,
    attempt: u32,
    last_error: &str,
    enqueued: Option<SystemTime>,
) -> Message {
    let mut copy = message.clone();
    let first = original_enqueued_time(message).or(enqueued);
    if let Some(ms) = first
        .and_then(|at| at.duration_since(SystemTime::UNIX_EPOCH).ok())
        .and_then(|since| i64::try_from(since.as_millis()).ok())
    {
        copy.application_properties.insert(
            ORIGINAL_ENQUEUED_TIME_PROPERTY.to_owned(),
            PropertyValue::Long(ms),
        );
    }
    let delivered = message.message_id.as_deref().unwrap_or(logical_id);
    copy.message_id = Some(copy_message_id(delivered, attempt));
    let properties = &mut copy.application_properties;
    properties.insert(LOGICAL_ID_PROPERTY.to_owned(), logical_id.into());
    properties.insert(
        RETRY_ATTEMPT_PROPERTY.to_owned(),
        PropertyValue::Long(i64::from(attempt)),
    );
    properties.insert(LAST_ERROR_PROPERTY.to_owned(), last_error.to_owned().into());
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(jitter: f64, u: f64) -> RetryPolicy {
        RetryPolicy::new(10, Duration::from_secs(10), Duration::from_secs(300))
            .unwrap()
            .with_jitter(jitter, JitterSource::fixed(u))
            .unwrap()
    }

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap() {
        let policy = policy(0.0, 0.0);
        let delays: Vec<u64> = (1..=7).map(|n| policy.delay(n).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(300));
        assert_eq!(policy.backoff(0), Duration::from_secs(10));
    }

    #[test]
    fn jitter_only_shortens_within_its_fraction() {
        assert_eq!(policy(0.5, 0.0).delay(2), Duration::from_secs(20));
        assert_eq!(policy(0.5, 1.0).delay(2), Duration::from_secs(10));
        assert_eq!(policy(0.2, 0.5).delay(1), Duration::from_secs(9));
        let random = RetryPolicy::new(3, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
        for _ in 0..1000 {
            let delay = random.delay(3);
            assert!(
                delay <= Duration::from_secs(40) && delay >= Duration::from_secs(32),
                "{delay:?}"
            );
        }
        let wild = JitterSource::from_fn(|| f64::NAN);
        let policy = policy(1.0, 0.0).with_jitter(1.0, wild).unwrap();
        assert_eq!(policy.delay(1), Duration::from_secs(10));
    }

    #[test]
    fn bad_policies_are_refused() {
        let s = Duration::from_secs;
        assert!(RetryPolicy::new(0, s(1), s(2)).is_err());
        assert!(RetryPolicy::new(1, Duration::ZERO, s(2)).is_err());
        assert!(RetryPolicy::new(1, s(3), s(2)).is_err());
        let ok = RetryPolicy::new(1, s(1), s(1)).unwrap();
        assert!(ok.clone().with_jitter(1.5, JitterSource::random()).is_err());
        assert!(ok.with_jitter(-0.1, JitterSource::random()).is_err());
    }

    #[test]
    fn copies_keep_the_logical_id_under_a_fresh_broker_id() {
        let mut original = Message::new("m-1", "orders.order-placed.v1", "{}");
        original
            .application_properties
            .insert("tenant".into(), "t-1".into());
        let copy = copy(&original, "m-1", 2, "database unavailable", None);
        assert_eq!(copy.message_id.as_deref(), Some("m-1/retry-2"));
        assert_eq!(
            (copy.subject.as_ref(), &copy.body),
            (original.subject.as_ref(), &original.body)
        );
        let props = &copy.application_properties;
        assert_eq!(props.get(LOGICAL_ID_PROPERTY), Some(&"m-1".into()));
        assert_eq!(
            props.get(RETRY_ATTEMPT_PROPERTY),
            Some(&PropertyValue::Long(2))
        );
        assert_eq!(props.get("tenant"), Some(&"t-1".into()));
        assert_eq!(attempts_so_far(&copy), 2);
        assert_eq!(attempts_so_far(&original), 0);
    }

    /// A dead letter resubmitted (`m-1/resubmit-1`, retry count reset) that fails again must not
    /// send `m-1/retry-1` a second time: broker duplicate detection would drop it.
    #[test]
    fn copy_ids_never_repeat_along_a_messages_life() {
        let original = Message::new("m-1", "orders.order-placed.v1", "{}");
        let first = copy(&original, "m-1", 1, "e", None);
        let second = copy(&first, "m-1", 2, "e", None);
        let resubmitted = crate::servicebus::resubmission(&second).unwrap();
        let after = copy(&resubmitted, "m-1", 1, "e", None);
        let ids = [&first, &second, &resubmitted, &after].map(|m| m.message_id.clone().unwrap());
        assert_eq!(
            ids,
            [
                "m-1/retry-1",
                "m-1/retry-1/retry-2",
                "m-1/resubmit-1",
                "m-1/resubmit-1/retry-1"
            ]
        );
        assert_eq!(
            copy(&first, "m-1", 2, "e", None).message_id,
            second.message_id,
            "deterministic"
        );
    }

    /// Every copy carries the original's enqueue time, not its own: the second copy (enqueued
    /// later still) keeps the first's, and a resubmission keeps it too.
    #[test]
    fn copies_carry_the_first_enqueue_time() {
        let original = Message::new("m-1", "orders.order-placed.v1", "{}");
        let enqueued = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(original_enqueued_time(&original), None);
        let first = copy(&original, "m-1", 1, "e", Some(enqueued));
        assert_eq!(
            first
                .application_properties
                .get(ORIGINAL_ENQUEUED_TIME_PROPERTY),
            Some(&PropertyValue::Long(1_700_000_000_123))
        );
        assert_eq!(original_enqueued_time(&first), Some(enqueued));
        let later = enqueued + Duration::from_secs(600);
        let second = copy(&first, "m-1", 2, "e", Some(later));
        assert_eq!(original_enqueued_time(&second), Some(enqueued));
        let resubmitted = crate::servicebus::resubmission(&second).unwrap();
        assert_eq!(original_enqueued_time(&resubmitted), Some(enqueued));
        // Without a broker time there is nothing to carry; a tampered value reads as none.
        assert_eq!(
            original_enqueued_time(&copy(&original, "m-1", 1, "e", None)),
            None
        );
        let mut tampered = original;
        tampered.application_properties.insert(
            ORIGINAL_ENQUEUED_TIME_PROPERTY.to_owned(),
            PropertyValue::Long(-1),
        );
        assert_eq!(original_enqueued_time(&tampered), None);
    }

    #[test]
    fn copy_ids_fit_the_broker_limit() {
        use super::super::MAX_MESSAGE_ID_LEN;
        let long = "x".repeat(MAX_MESSAGE_ID_LEN);
        let id = copy_message_id(&long, 12);
        assert!(id.len() <= MAX_MESSAGE_ID_LEN, "{id}");
        assert!(id.ends_with("/retry-12"));
        assert_eq!(id, copy_message_id(&long, 12), "deterministic");
        assert_ne!(id, copy_message_id(&"y".repeat(MAX_MESSAGE_ID_LEN), 12));
        let tampered = Message {
            application_properties: [(RETRY_ATTEMPT_PROPERTY.to_owned(), PropertyValue::Long(-3))]
                .into_iter()
                .collect(),
            ..Message::default()
        };
        assert_eq!(attempts_so_far(&tampered), 0);
    }
}
