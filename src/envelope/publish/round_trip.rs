//! Round trips: what the writers put in the outbox, sent as the relay sends it
//! ([`OutboxRow::to_message`]), read back by the envelope readers and the envelope check the
//! runtime applies: the same contract, logical id, payload and headers.
#![allow(clippy::unwrap_used)]

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::super::{
    CloudEvents, Contract, EnvelopeReader, MassTransit, TypeMap, check, cloudevent_id,
};
use super::{CloudEvent, MassTransitEnvelope};
use crate::ports::{Message, OutboxMessage, OutboxRow, PropertyValue};
use crate::runtime::{ConsumerName, Context};

const MT_TYPE: &str = "urn:message:Shop.Contracts:OrderConfirmed";
const CONTRACT: &str = "shop.order-confirmed.v1";

/// The message the relay sends for `message` (a first attempt).
fn relayed(message: OutboxMessage) -> Message {
    OutboxRow {
        id: 1,
        message,
        attempts: 1,
        created_at: UNIX_EPOCH,
    }
    .to_message()
}

fn confirmed() -> serde_json::Value {
    serde_json::json!({ "orderId": "o-1", "lines": [{ "sku": "A", "quantity": 2 }] })
}

fn masstransit() -> MassTransit {
    MassTransit::new(TypeMap::new().with(MT_TYPE, CONTRACT).unwrap()).unwrap()
}

fn accepted() -> Vec<Contract> {
    vec![CONTRACT.parse().unwrap()]
}

#[test]
fn a_masstransit_envelope_reads_back_as_written() {
    let envelope = MassTransitEnvelope::new("confirmations", MT_TYPE)
        .unwrap()
        .implements("urn:message:Shop.Contracts:OrderEvent")
        .unwrap()
        .with_correlation_id("7c9e6679-7425-40de-944b-e07fc1f90ae7")
        .unwrap()
        .with_header("tenant", "t-1")
        .unwrap();
    let message = relayed(envelope.message(&confirmed()).unwrap());

    let checked = check(&message, &masstransit(), &accepted()).unwrap();
    assert_eq!(checked.contract, CONTRACT.parse::<Contract>().unwrap());
    // The inbox key is the envelope's messageId, whatever form the broker id takes.
    assert_eq!(
        checked.logical_id,
        envelope.message_id().hyphenated().to_string()
    );
    assert_ne!(
        message.message_id.as_deref(),
        Some(checked.logical_id.as_str())
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&checked.body).unwrap(),
        confirmed()
    );
    assert_eq!(
        checked.headers.get("tenant"),
        Some(&PropertyValue::from("t-1"))
    );
    assert_eq!(
        checked.headers.get("CorrelationId"),
        Some(&PropertyValue::from("7c9e6679-7425-40de-944b-e07fc1f90ae7"))
    );
    let conversation = envelope.message_id().hyphenated().to_string();
    assert_eq!(
        checked.headers.get("ConversationId"),
        Some(&PropertyValue::from(conversation.as_str())),
        "a first message starts its own conversation"
    );

    // A relay retry sends the same bytes: the same inbox key.
    let again = relayed(envelope.message(&confirmed()).unwrap());
    assert_eq!(again.body, message.body);
    assert_eq!(
        check(&again, &masstransit(), &accepted())
            .unwrap()
            .logical_id,
        checked.logical_id
    );
}

/// Both ways: an event consumed through the MassTransit reader, whose handler publishes the
/// next event with `caused_by`, which the reader then opens again: the conversation carries
/// over, and the consumed message is the initiator.
#[test]
fn a_consumed_masstransit_conversation_continues_in_the_published_event() {
    let conversation = "9a3e4b1c-0000-4000-8000-000000000001";
    let consumed_id = "181c0000-6393-3630-36a4-08daf4e7c6da";
    let received = relayed(
        MassTransitEnvelope::new("orders", MT_TYPE)
            .unwrap()
            .with_message_id(consumed_id)
            .unwrap()
            .with_conversation_id(conversation)
            .unwrap()
            .message(&confirmed())
            .unwrap(),
    );
    let opened = masstransit().open(&received).unwrap();
    let consumer = ConsumerName::new("shop.shipping").unwrap();
    let logical_id = opened.id.as_deref().unwrap();
    let ctx = Context {
        payload: (),
        message: &received,
        logical_id,
        consumer: &consumer,
        contract: &opened.contract,
        headers: &opened.headers,
        delivery_count: 0,
    };
    let next = relayed(
        MassTransitEnvelope::new("shipping", MT_TYPE)
            .unwrap()
            .caused_by(&ctx)
            .message(&serde_json::json!({ "orderId": "o-1" }))
            .unwrap(),
    );
    let reopened = masstransit().open(&next).unwrap();
    assert_eq!(
        reopened.headers.get("ConversationId"),
        Some(&PropertyValue::from(conversation))
    );
    let body: serde_json::Value = serde_json::from_slice(&next.body).unwrap();
    assert_eq!(body["initiatorId"], consumed_id);
}

#[test]
fn a_cloudevent_reads_back_the_same_in_both_modes() {
    let event = CloudEvent::new(
        "payments",
        "/shop/orders",
        "com.example.shop.order.confirmed",
    )
    .unwrap()
    .with_subject("o-1")
    .unwrap()
    .with_extension("tenant", "t-1")
    .unwrap()
    .at(UNIX_EPOCH + Duration::from_secs(1_673_560_553));
    let reader = CloudEvents::new(
        TypeMap::new()
            .with("com.example.shop.order.confirmed", CONTRACT)
            .unwrap(),
    )
    .unwrap();
    let expected_id = cloudevent_id("/shop/orders", event.id());
    for mode in [event.clone().structured(), event.clone().binary()] {
        let message = relayed(mode.message(&confirmed()).unwrap());
        let checked = check(&message, &reader, &accepted()).unwrap();
        assert_eq!(checked.contract, CONTRACT.parse::<Contract>().unwrap());
        assert_eq!(checked.logical_id, expected_id);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&checked.body).unwrap(),
            confirmed()
        );
        assert_eq!(
            checked.headers.get("tenant"),
            Some(&PropertyValue::from("t-1"))
        );
        assert_eq!(
            checked.headers.get("subject"),
            Some(&PropertyValue::from("o-1"))
        );
    }

    // A type written as `name.vN` needs no type map entry.
    let versioned = CloudEvent::new("payments", "/shop/orders", CONTRACT)
        .unwrap()
        .binary()
        .message(&confirmed())
        .unwrap();
    let versioned = relayed(versioned);
    let opened = CloudEvents::new(TypeMap::new())
        .unwrap()
        .open(&versioned)
        .unwrap();
    assert_eq!(opened.contract, CONTRACT.parse::<Contract>().unwrap());
    assert!(matches!(opened.body, Cow::Borrowed(_)));
}

/// The writers' own `time` is what the readers' headers show, as written.
#[test]
fn the_event_time_survives_the_round_trip() {
    let at: SystemTime = UNIX_EPOCH + Duration::new(1_673_560_553, 715_882_000);
    let message = relayed(
        CloudEvent::new("payments", "/shop/orders", CONTRACT)
            .unwrap()
            .at(at)
            .binary()
            .message(&confirmed())
            .unwrap(),
    );
    let opened = CloudEvents::new(TypeMap::new())
        .unwrap()
        .open(&message)
        .unwrap();
    assert_eq!(
        opened.headers.get("time"),
        Some(&PropertyValue::from("2023-01-12T21:55:53.715882Z"))
    );
}
