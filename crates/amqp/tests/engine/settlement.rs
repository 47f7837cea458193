//! Settlements asked for together leave as AMQP ranges (issue 15, item 4): a raw-frame broker
//! counts the `disposition` frames our engine writes when many deliveries are settled at once
//! from concurrent tasks.

use std::collections::BTreeMap;

use sb_amqp::performative::{Attach, Disposition, Performative};
use sb_amqp::types::definitions::{Handle, ReceiverSettleMode, Role, SenderSettleMode};
use sb_amqp::types::messaging::{DeliveryState, Source, Target, TargetArchetype};
use sb_amqp::{
    Connection, ConnectionOptions, Frame, FramedIo, Outcome, ReceiverOptions, SaslClient, frame,
};

use crate::raw_peer::{begin, next, open, transfer};
use crate::support::data_message;

fn sender_attach(name: String) -> Attach {
    Attach {
        name,
        handle: Handle(0),
        role: Role::Sender,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Box::new(Source {
            address: Some("q".into()),
            ..Default::default()
        })),
        target: Some(Box::new(TargetArchetype::Target(Target::default()))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// A broker that sends `n` deliveries on the client's receiving link and returns the
/// dispositions it reads until `expected` ids are all covered (and the socket, kept open).
async fn raw_broker(mut f: FramedIo, n: u32, expected: usize) -> (Vec<Disposition>, FramedIo) {
    assert_eq!(f.read_header().await.unwrap().unwrap(), frame::AMQP_HEADER);
    f.write_header(frame::AMQP_HEADER).await.unwrap();
    assert!(matches!(next(&mut f).await, Performative::Open(_)));
    f.write_frame(&Frame::amqp(0, open("raw-broker")))
        .await
        .unwrap();
    assert!(matches!(next(&mut f).await, Performative::Begin(_)));
    f.write_frame(&Frame::amqp(0, begin(Some(0), 1000)))
        .await
        .unwrap();
    let Performative::Attach(a) = next(&mut f).await else {
        panic!("expected attach")
    };
    f.write_frame(&Frame::amqp(0, sender_attach(a.name)))
        .await
        .unwrap();
    assert!(matches!(next(&mut f).await, Performative::Flow(_)));
    for id in 0..n {
        f.write_frame(&transfer(
            id,
            id.to_be_bytes().to_vec(),
            data_message(b"m").payload,
        ))
        .await
        .unwrap();
    }
    let mut seen = Vec::new();
    let mut covered = 0;
    while covered < expected {
        match next(&mut f).await {
            Performative::Disposition(d) => {
                covered += (d.last.unwrap_or(d.first) - d.first + 1) as usize;
                seen.push(d);
            }
            Performative::Flow(_) => {}
            other => panic!("unexpected {}", other.name()),
        }
    }
    (seen, f)
}

/// Receives `n` deliveries from a raw broker and settles each id `plan` names, all at once
/// from one task per delivery; returns the broker's dispositions.
async fn settle_together(n: u32, plan: &BTreeMap<u32, Outcome>) -> Vec<Disposition> {
    let (ours, theirs) = tokio::io::duplex(1 << 20);
    let broker = tokio::spawn(raw_broker(
        FramedIo::new(Box::new(theirs), 65536),
        n,
        plan.len(),
    ));
    let opts = ConnectionOptions {
        sasl: Some(SaslClient::None),
        ..Default::default()
    };
    let conn = Connection::open_io(Box::new(ours), opts).await.unwrap();
    let session = conn.begin().await.unwrap();
    let receiver = session
        .attach_receiver(ReceiverOptions::new("r", "q").credit(n))
        .await
        .unwrap();
    for id in 0..n {
        assert_eq!(receiver.recv().await.unwrap().delivery_id, id);
    }
    let settler = receiver.settler();
    let tasks: Vec<_> = plan
        .iter()
        .map(|(id, outcome)| {
            let (settler, id, outcome) = (settler.clone(), *id, outcome.clone());
            tokio::spawn(async move { settler.settle(id, outcome).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), None);
    }
    let (seen, _open) = broker.await.unwrap();
    assert_eq!(settler.unsettled().await.unwrap(), n as usize - plan.len());
    seen
}

/// Every id the dispositions cover, with the state it got.
fn covered(seen: &[Disposition]) -> BTreeMap<u32, Option<Outcome>> {
    let mut out = BTreeMap::new();
    for d in seen {
        assert!(d.settled, "{d:?}");
        for id in d.first..=d.last.unwrap_or(d.first) {
            let outcome = d.state.as_ref().and_then(Outcome::from_state);
            assert!(out.insert(id, outcome).is_none(), "id {id} disposed twice");
        }
    }
    out
}

fn wanted(plan: &BTreeMap<u32, Outcome>) -> BTreeMap<u32, Option<Outcome>> {
    plan.iter().map(|(id, o)| (*id, Some(o.clone()))).collect()
}

#[tokio::test]
async fn contiguous_settlements_with_one_outcome_share_frames() {
    let plan: BTreeMap<u32, Outcome> = (0..32).map(|id| (id, Outcome::Accepted)).collect();
    let seen = settle_together(32, &plan).await;
    assert!(seen.len() < 32, "{} frames for 32 settlements", seen.len());
    assert!(
        seen.iter().any(|d| d.last.is_some()),
        "no range in {seen:?}"
    );
    assert_eq!(covered(&seen), wanted(&plan));
}

#[tokio::test]
async fn gaps_and_different_outcomes_are_not_merged() {
    // Even ids only: no two are contiguous.
    let plan: BTreeMap<u32, Outcome> = (0..16)
        .filter(|id| id % 2 == 0)
        .map(|id| (id, Outcome::Accepted))
        .collect();
    let seen = settle_together(16, &plan).await;
    assert_eq!(seen.len(), plan.len(), "{seen:?}");
    assert_eq!(covered(&seen), wanted(&plan));
    // Contiguous ids with alternating outcomes: each keeps its own.
    let plan: BTreeMap<u32, Outcome> = (0..16)
        .map(|id| {
            let o = if id % 2 == 0 {
                Outcome::Accepted
            } else {
                Outcome::Released
            };
            (id, o)
        })
        .collect();
    let seen = settle_together(16, &plan).await;
    assert_eq!(seen.len(), 16, "{seen:?}");
    assert_eq!(covered(&seen), wanted(&plan));
}

#[tokio::test]
async fn a_range_of_one_outcome_is_split_where_another_outcome_interrupts_it() {
    // 0..=9 accepted except 4 released: accepted 0..=3 and 5..=9 as ranges, 4 alone.
    let plan: BTreeMap<u32, Outcome> = (0..10)
        .map(|id| {
            let o = if id == 4 {
                Outcome::Released
            } else {
                Outcome::Accepted
            };
            (id, o)
        })
        .collect();
    let seen = settle_together(10, &plan).await;
    assert_eq!(covered(&seen), wanted(&plan));
    let accepted_ranges: Vec<(u32, Option<u32>)> = seen
        .iter()
        .filter(|d| matches!(d.state, Some(DeliveryState::Accepted(_))))
        .map(|d| (d.first, d.last))
        .collect();
    assert!(accepted_ranges.len() < 9, "{accepted_ranges:?}");
    assert!(
        accepted_ranges
            .iter()
            .all(|(first, last)| !(*first..=last.unwrap_or(*first)).contains(&4)),
        "{accepted_ranges:?}"
    );
}
