//! `sb-inbox dlq peek|resubmit`: look at a dead-letter queue, and put its messages back on their
//! entity so that one that was in fact processed is recognised as a duplicate.
//!
//! A resubmitted copy gets a fresh broker message id (`{logical}/resubmit-{n}`: broker duplicate
//! detection would drop the original id) and keeps the logical id in
//! [`sb_inbox::runtime::LOGICAL_ID_PROPERTY`], which the inbox keys on. The copy is sent and
//! accepted before the dead letter is completed, so a crash in between leaves at most a
//! duplicate; running again sends a copy with the same broker id.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::OpsError;
use sb_inbox::envelope::{EnvelopeReader, SubjectVersioned, envelope_logical_id};
use sb_inbox::runtime::{LOGICAL_ID_PROPERTY, logical_id, original_enqueued_time};
use sb_inbox::servicebus::PeekedMessage;
use sb_inbox::{Clock, Delivery, Message, PropertyValue, Receiver, Sender};

pub use sb_inbox::servicebus::{RESUBMISSION_PROPERTY, resubmission, resubmission_of};

/// The dead-letter subqueue of `entity`.
pub fn dead_letter_queue(entity: &str) -> String {
    format!("{entity}/$DeadLetterQueue")
}

/// Where resubmitted copies of `entity`'s dead letters go: the entity itself for a queue. A
/// subscription has no send address: `to` must name one (the topic reaches every subscription;
/// a queue the subscription forwards to reaches only it).
///
/// # Errors
/// [`OpsError::Input`] for a subscription without `to`.
pub fn resubmit_destination(entity: &str, to: Option<&str>) -> Result<String, OpsError> {
    match to {
        Some(to) => Ok(to.to_owned()),
        None if entity.to_ascii_lowercase().contains("/subscriptions/") => {
            Err(OpsError::Input(format!(
                "{entity} is a subscription, which cannot be sent to: pass --to with the topic \
                 (every subscription gets the copy) or the queue it forwards to"
            )))
        }
        None => Ok(entity.to_owned()),
    }
}

/// One line per peeked dead letter: sequence number, message id, logical id, subject,
/// delivery count, reason and description. Never the body.
pub fn describe(peeked: &PeekedMessage) -> String {
    let message = &Message::from(&peeked.message);
    let text = |value: Option<&str>| format!("{:?}", value.unwrap_or(""));
    let logical = match message.application_properties.get(LOGICAL_ID_PROPERTY) {
        Some(PropertyValue::String(id)) => Some(id.as_str()),
        _ => message.message_id.as_deref(),
    };
    let mut line = String::new();
    // Writing to a String cannot fail.
    let _ = write!(
        line,
        "seq={} message_id={} logical_id={} subject={} delivery_count={} reason={} description={}",
        peeked.sequence_number,
        text(message.message_id.as_deref()),
        text(logical),
        text(message.subject.as_deref()),
        peeked.delivery_count,
        text(peeked.dead_letter_reason()),
        text(peeked.dead_letter_description()),
    );
    line
}

pub use sb_inbox::worker::DEFAULT_RESUBMIT_WINDOW;

/// Which dead letters to resubmit.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ResubmitOptions {
    /// Resubmit at most this many.
    pub max: usize,
    /// Only messages whose broker or logical message id is this.
    pub message_id: Option<String>,
    /// Stop once no message arrives for this long.
    pub idle: Duration,
    /// The resubmission window the retention was sized for (part of the replay horizon):
    /// a dead letter enqueued longer ago is refused, since the inbox row that recognises it as
    /// a duplicate may already be deleted.
    pub window: Duration,
    /// The clock ages are read on (tests pass the broker's).
    pub clock: Clock,
    /// The envelope the entity's consumer reads: a copy keeps *its* logical id (a MassTransit
    /// `messageId`, an `NServiceBus.MessageId`), the inbox key of the first delivery.
    pub envelope: Arc<dyn EnvelopeReader>,
}

impl ResubmitOptions {
    /// At most `max`, any message id, 5 s idle, the default window.
    pub fn new(max: usize) -> Self {
        ResubmitOptions {
            max,
            message_id: None,
            idle: Duration::from_secs(5),
            window: DEFAULT_RESUBMIT_WINDOW,
            clock: Clock::new(),
            envelope: Arc::new(SubjectVersioned),
        }
    }
}

/// Why a dead letter is past the resubmission window, if it is. Its age is counted from the
/// broker's enqueued time, which for a dead letter is no later than its dead-lettering (Service
/// Bus and the emulator keep the message's own), so the check errs on the safe side; for a
/// delayed-retry copy (enqueued anew) from the original's, which the copy carries in
/// [`sb_inbox::runtime::ORIGINAL_ENQUEUED_TIME_PROPERTY`].
fn past_window(
    enqueued: Option<SystemTime>,
    message: &Message,
    options: &ResubmitOptions,
) -> Option<String> {
    let first = match (enqueued, original_enqueued_time(message)) {
        (Some(own), Some(original)) => own.min(original),
        (own, original) => own.or(original)?,
    };
    let age = options.clock.now().duration_since(first).ok()?;
    (age > options.window).then(|| {
        format!(
            "enqueued {} s ago, past the DLQ resubmission window of {} s \
             (SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS): its inbox row may already be deleted, so a \
             resubmission could take effect twice; it stays in the dead-letter queue",
            age.as_secs(),
            options.window.as_secs()
        )
    })
}

/// One resubmitted dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resubmitted {
    /// The dead letter's broker message id.
    pub from: String,
    /// The copy's broker message id.
    pub to: String,
    /// The logical id both carry.
    pub logical_id: String,
}

/// What [`resubmit`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResubmitReport {
    /// Resubmitted and completed in the dead-letter queue.
    pub resubmitted: Vec<Resubmitted>,
    /// Left in the dead-letter queue: not matching `--message-id`, or unusable (with why).
    pub left: Vec<(String, String)>,
}

/// Receives dead letters in peek-lock from `receiver` (the dead-letter queue), sends each
/// matching one's [`resubmission`] to `destination` and, once the broker accepted it,
/// completes the dead letter. Messages not resubmitted are held until the end, then abandoned
/// back to the dead-letter queue (dead letters are never dead-lettered again).
///
/// # Errors
/// [`OpsError::Partial`] when receiving, sending or completing fails: the report of what was
/// done so far is in its text; a dead letter whose copy was sent but not completed stays, and
/// resubmitting it again is recognised as a duplicate.
pub async fn resubmit<R: Receiver>(
    receiver: &R,
    sender: &impl Sender,
    destination: &str,
    options: &ResubmitOptions,
) -> Result<ResubmitReport, OpsError> {
    let mut report = ResubmitReport::default();
    let mut held = Vec::new();
    let result = resubmit_matching(
        receiver,
        sender,
        destination,
        options,
        &mut report,
        &mut held,
    )
    .await;
    for delivery in held {
        // Best effort: a lost abandon only means the lock runs out first.
        let _ = delivery.abandon(Default::default()).await;
    }
    result.map(|()| report)
}

/// `message` with its envelope's logical id in [`LOGICAL_ID_PROPERTY`] when that differs from
/// the broker message id (and none is there yet), so the copy keys on what its first delivery
/// was keyed on; as it is otherwise.
fn keyed<'m>(message: &'m Message, envelope: &dyn EnvelopeReader) -> Cow<'m, Message> {
    if message
        .application_properties
        .contains_key(LOGICAL_ID_PROPERTY)
    {
        return Cow::Borrowed(message);
    }
    match envelope_logical_id(message, envelope) {
        Ok(id) if message.message_id.as_deref() != Some(id.as_str()) => {
            let mut keyed = message.clone();
            keyed
                .application_properties
                .insert(LOGICAL_ID_PROPERTY.to_owned(), id.into());
            Cow::Owned(keyed)
        }
        _ => Cow::Borrowed(message),
    }
}

async fn resubmit_matching<R: Receiver>(
    receiver: &R,
    sender: &impl Sender,
    destination: &str,
    options: &ResubmitOptions,
    report: &mut ResubmitReport,
    held: &mut Vec<R::Delivery>,
) -> Result<(), OpsError> {
    // A held message seen again means its lock ran out and the scan came round.
    let mut seen = HashSet::new();
    let partial = |report: &ResubmitReport, error: String| OpsError::Partial {
        done: report.resubmitted.len(),
        total: options.max,
        error,
    };
    while report.resubmitted.len() < options.max {
        let delivery = match tokio::time::timeout(options.idle, receiver.receive()).await {
            Err(_) | Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(delivery))) => delivery,
            Ok(Err(error)) => return Err(partial(report, error.to_string())),
        };
        let message = keyed(delivery.message(), &*options.envelope);
        let message = message.as_ref();
        let from = message.message_id.clone().unwrap_or_default();
        let matches = options.message_id.as_deref().is_none_or(|wanted| {
            from == wanted || logical_id(message).is_ok_and(|logical| logical == wanted)
        });
        let checked = match past_window(delivery.enqueued_time(), message, options) {
            Some(why) if matches => Err(why),
            _ => resubmission_of(message, delivery.enqueued_time()),
        };
        let copy = match checked {
            Ok(copy) if matches => copy,
            other => {
                let why = other.map_or_else(|why| why, |_| "does not match --message-id".into());
                let came_round = !seen.insert(from.clone());
                if !came_round {
                    report.left.push((from, why));
                }
                held.push(delivery);
                if came_round {
                    return Ok(());
                }
                continue;
            }
        };
        let to = copy.message_id.clone().unwrap_or_default();
        let logical_id = logical_id(&copy).map(str::to_owned).unwrap_or_default();
        if let Err(error) = sender.send(destination, copy, None).await {
            held.push(delivery);
            return Err(partial(report, format!("sending {to}: {error}")));
        }
        if let Err(error) = delivery.complete().await {
            return Err(partial(
                report,
                format!(
                    "{to} was sent but completing dead letter {from} failed ({error}); it stays and a second resubmission is a duplicate"
                ),
            ));
        }
        report.resubmitted.push(Resubmitted {
            from,
            to,
            logical_id,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sb_inbox::runtime::{LAST_ERROR_PROPERTY, RETRY_ATTEMPT_PROPERTY};
    use sb_inbox::servicebus::{DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON};

    /// Resubmits up to ten of `dead_letters` to a fresh in-memory entity, on `clock`.
    async fn resubmit_to_new_entity(
        dead_letters: &sb_inbox::testing::MemoryBroker,
        clock: Clock,
    ) -> (sb_inbox::testing::MemoryBroker, ResubmitReport) {
        let entity = sb_inbox::testing::MemoryBroker::new(clock);
        let mut options = ResubmitOptions::new(10);
        options.clock = clock;
        let report = resubmit(&dead_letters.receiver(), &entity, "orders", &options)
            .await
            .unwrap();
        (entity, report)
    }

    /// The one message left in the dead-letter queue, with why.
    fn the_one_left(report: &ResubmitReport) -> (&str, &str) {
        let [(id, why)] = report.left.as_slice() else {
            panic!("{report:?}");
        };
        (id, why)
    }

    /// The relay strips the inbox's properties by their prefix: every one must carry it.
    #[test]
    fn every_inbox_property_carries_the_prefix_the_relay_strips() {
        use sb_inbox::runtime::ORIGINAL_ENQUEUED_TIME_PROPERTY;
        for name in [
            LOGICAL_ID_PROPERTY,
            RETRY_ATTEMPT_PROPERTY,
            ORIGINAL_ENQUEUED_TIME_PROPERTY,
            LAST_ERROR_PROPERTY,
            RESUBMISSION_PROPERTY,
        ] {
            assert!(name.starts_with(sb_inbox::INBOX_PROPERTY_PREFIX), "{name}");
        }
    }

    #[test]
    fn a_resubmission_keeps_the_logical_id_under_a_fresh_id() {
        let mut dead = Message::new("m-1/retry-3", "orders.order-placed.v1", "{}");
        let props = &mut dead.application_properties;
        props.insert(LOGICAL_ID_PROPERTY.into(), "m-1".into());
        props.insert(RETRY_ATTEMPT_PROPERTY.into(), PropertyValue::Long(3));
        props.insert(DEAD_LETTER_REASON.into(), "RetriesExhausted".into());
        props.insert(DEAD_LETTER_ERROR_DESCRIPTION.into(), "…".into());
        props.insert("tenant".into(), "t-1".into());
        let copy = resubmission(&dead).unwrap();
        assert_eq!(copy.message_id.as_deref(), Some("m-1/resubmit-1"));
        let props = &copy.application_properties;
        assert_eq!(props.get(LOGICAL_ID_PROPERTY), Some(&"m-1".into()));
        assert_eq!(
            props.get(RESUBMISSION_PROPERTY),
            Some(&PropertyValue::Long(1))
        );
        assert_eq!(props.get("tenant"), Some(&"t-1".into()));
        for gone in [
            DEAD_LETTER_REASON,
            DEAD_LETTER_ERROR_DESCRIPTION,
            RETRY_ATTEMPT_PROPERTY,
        ] {
            assert!(!props.contains_key(gone), "{gone}");
        }
        let again = resubmission(&copy).unwrap();
        assert_eq!(again.message_id.as_deref(), Some("m-1/resubmit-2"));

        let plain = Message::new("m-2", "orders.order-placed.v1", "{}");
        assert_eq!(
            resubmission(&plain).unwrap().message_id.as_deref(),
            Some("m-2/resubmit-1")
        );
        // Field by field, not a struct literal: `Message` is `#[non_exhaustive]` outside the
        // library crate, where this module is headed.
        let mut nameless = plain;
        nameless.message_id = None;
        assert!(
            resubmission(&nameless)
                .unwrap_err()
                .contains("no message id")
        );
    }

    /// Issue 34: a dead letter from an NServiceBus producer is resubmitted under its
    /// `NServiceBus.MessageId` (the inbox key of its first delivery), not its broker id; with
    /// the default envelope the broker id stays the key.
    #[tokio::test(start_paused = true)]
    async fn a_resubmission_keys_on_the_envelopes_logical_id() {
        use sb_inbox::envelope::{NServiceBus, TypeMap};
        use sb_inbox::testing::MemoryBroker;
        let dead = || {
            Message::new("broker-7", "", "{}")
                .with_property("NServiceBus.EnclosedMessageTypes", "Shop.OrderPlaced")
                .with_property("NServiceBus.MessageId", "nsb-7")
        };
        let clock = Clock::new();
        let types = TypeMap::new()
            .with("Shop.OrderPlaced", "orders.order-placed.v1")
            .unwrap();
        let mut keys = Vec::new();
        for envelope in [
            Arc::new(NServiceBus::new(types)) as Arc<dyn EnvelopeReader>,
            Arc::new(SubjectVersioned),
        ] {
            let dead_letters = MemoryBroker::new(clock);
            dead_letters.send(dead());
            let entity = MemoryBroker::new(clock);
            let mut options = ResubmitOptions::new(10);
            options.clock = clock;
            options.envelope = envelope;
            let report = resubmit(&dead_letters.receiver(), &entity, "orders", &options)
                .await
                .unwrap();
            let sent = entity.sent();
            let copy = &sent[0].message;
            keys.push((
                report.resubmitted[0].logical_id.clone(),
                copy.message_id.clone().unwrap_or_default(),
                copy.application_properties
                    .get(LOGICAL_ID_PROPERTY)
                    .cloned(),
            ));
        }
        assert_eq!(
            keys,
            [
                (
                    "nsb-7".to_owned(),
                    "nsb-7/resubmit-1".to_owned(),
                    Some("nsb-7".into())
                ),
                (
                    "broker-7".to_owned(),
                    "broker-7/resubmit-1".to_owned(),
                    Some("broker-7".into())
                ),
            ]
        );
    }

    /// Finding 10: a dead letter enqueued longer ago than the window is refused with the
    /// reason and stays in the dead-letter queue; a younger one is resubmitted.
    #[tokio::test(start_paused = true)]
    async fn dead_letters_past_the_window_are_refused_and_stay() {
        use sb_inbox::testing::MemoryBroker;
        let clock = Clock::new();
        let dead_letters = MemoryBroker::new(clock);
        dead_letters.send(Message::new("old", "orders.order-placed.v1", "{}"));
        tokio::time::advance(DEFAULT_RESUBMIT_WINDOW + Duration::from_secs(1)).await;
        dead_letters.send(Message::new("young", "orders.order-placed.v1", "{}"));
        let (entity, report) = resubmit_to_new_entity(&dead_letters, clock).await;
        let resubmitted: Vec<&str> = report.resubmitted.iter().map(|r| r.from.as_str()).collect();
        assert_eq!(resubmitted, ["young"]);
        let (id, why) = the_one_left(&report);
        assert_eq!(id, "old");
        assert!(
            why.contains("enqueued 604801 s ago, past the DLQ resubmission window of 604800 s"),
            "{why}"
        );
        assert_eq!(entity.sent().len(), 1);
        let counts = dead_letters.counts();
        assert_eq!(
            (counts.completed, counts.ready),
            (1, 1),
            "the old one stays"
        );
    }

    /// A delayed-retry copy dead-lettered inside the window, whose original was enqueued before
    /// it, is refused: its age counts from the original (the copy carries that time).
    #[tokio::test(start_paused = true)]
    async fn a_retry_copy_ages_from_its_original_enqueue_time() {
        use sb_inbox::runtime::ORIGINAL_ENQUEUED_TIME_PROPERTY;
        use sb_inbox::testing::MemoryBroker;
        let clock = Clock::new();
        let original_at = clock.now();
        tokio::time::advance(DEFAULT_RESUBMIT_WINDOW + Duration::from_secs(1)).await;
        let dead_letters = MemoryBroker::new(clock);
        let ms = original_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let mut copy = Message::new("m-1/retry-1", "orders.order-placed.v1", "{}");
        copy.application_properties
            .insert(LOGICAL_ID_PROPERTY.into(), "m-1".into());
        copy.application_properties.insert(
            ORIGINAL_ENQUEUED_TIME_PROPERTY.into(),
            PropertyValue::Long(i64::try_from(ms).unwrap()),
        );
        dead_letters.send(copy);
        // Its own enqueue is a second old: inside the window on its own.
        tokio::time::advance(Duration::from_secs(1)).await;
        let (entity, report) = resubmit_to_new_entity(&dead_letters, clock).await;
        assert!(report.resubmitted.is_empty(), "{report:?}");
        let (id, why) = the_one_left(&report);
        assert_eq!(id, "m-1/retry-1");
        assert!(
            why.contains("enqueued 604802 s ago, past the DLQ resubmission window"),
            "{why}"
        );
        assert!(entity.sent().is_empty());
    }

    #[test]
    fn subscriptions_need_an_explicit_destination() {
        assert_eq!(resubmit_destination("orders", None).unwrap(), "orders");
        assert!(resubmit_destination("t/Subscriptions/s", None).is_err());
        assert_eq!(
            resubmit_destination("t/subscriptions/s", Some("q")).unwrap(),
            "q"
        );
    }
}
