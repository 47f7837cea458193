//! Entity links: deliveries to receiving clients and messages from sending clients.

use std::time::Duration;

use sb_amqp::codec::Value;
use sb_amqp::servicebus::dead_letter;
use sb_amqp::types::definitions::{ReceiverSettleMode, SenderSettleMode};
use sb_amqp::types::messaging::DeliveryState;
use sb_amqp::types::messaging::Modified;
use sb_amqp::{
    IncomingDisposition, LinkAnswer, LinkFlow, LinkRequest, Outcome, Sendable, condition,
};
use tokio_util::sync::CancellationToken;

use super::codec::{self, value_property};
use super::control::LinkControl;
use super::wire_error;
use crate::{Entity, Properties, ReceiveMode, SessionLock, Settlement};

/// How long one receive waits before the link looks at its credit again (a drain or a credit
/// change may have arrived meanwhile).
const RECEIVE_SLICE: Duration = Duration::from_millis(200);

/// A client's attach to a queue, topic or subscription that passed the checks, with what
/// the link's task needs; [`serve`] or a session link's `sessions::serve` answers it.
#[derive(Debug)]
pub(crate) struct EntityLink {
    pub(crate) request: LinkRequest,
    pub(crate) entity: Entity,
    pub(crate) control: LinkControl,
    /// Cancelled when the emulator stops.
    pub(crate) stop: CancellationToken,
    /// How long to wait before answering the attach (`--attach-delay`); a session link waits
    /// with its session already locked, as a slow accept on the service holds it.
    pub(crate) answer_delay: Duration,
}

/// Waits `delay` before an attach is answered; false when the emulator stopped meanwhile.
pub(crate) async fn answer_late(delay: Duration, stop: &CancellationToken) -> bool {
    if delay.is_zero() {
        return true;
    }
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// Serves a link without sessions: messages from a sending client, or the entity's messages
/// to a receiving one.
pub(crate) async fn serve(link: EntityLink) -> Result<(), sb_amqp::Error> {
    let max_size = u64::try_from(link.entity.max_message_size()).unwrap_or(u64::MAX);
    let (request, control, stop) = (link.request, link.control, link.stop);
    if !answer_late(link.answer_delay, &stop).await {
        return Ok(());
    }
    if request.is_peer_sender() {
        receive_from_client(request, link.entity, max_size, control, stop).await
    } else {
        let answer = LinkAnswer::default()
            .initial_delivery_count(0)
            .max_message_size(max_size);
        deliver_to_client(request, &link.entity, answer, &Feed::Entity, control, stop).await
    }
}

/// Where a receiving client's messages come from.
#[derive(Debug)]
pub(super) enum Feed {
    /// The entity's receivable messages.
    Entity,
    /// The messages of one accepted session, for as long as this acceptance holds it.
    Session(SessionLock),
}

impl Feed {
    async fn next(
        &self,
        entity: &Entity,
        mode: ReceiveMode,
    ) -> crate::Result<Option<crate::ReceivedMessage>> {
        match self {
            Feed::Entity => entity.receive(mode, Some(RECEIVE_SLICE)).await,
            Feed::Session(lock) => {
                entity
                    .receive_from_held_session(lock, mode, Some(RECEIVE_SLICE))
                    .await
            }
        }
    }

    /// A session message's lock ends with its session lock: say which lock was lost.
    fn reply(&self, entity: &Entity, reply: Outcome) -> Outcome {
        let Feed::Session(lock) = self else {
            return reply;
        };
        let message_lock_lost = matches!(&reply, Outcome::Rejected(Some(e)) if e.condition == condition::MESSAGE_LOCK_LOST);
        if message_lock_lost && entity.session_state(&lock.session_id).is_err() {
            let lost = crate::Error::SessionLockLost {
                session_id: lock.session_id.clone(),
            };
            return Outcome::Rejected(Some(wire_error(lost.condition(), Some(lost.to_string()))));
        }
        reply
    }
}

/// The credit a client's sending link is granted and kept topped up at (refilled at half).
/// azure-amqp, which the service is built on, gives a link it accepts from a peer's attach
/// 1000 (`AmqpLinkSettings.Create(Attach)`: `TotalLinkCredit = AmqpConstants.DefaultLinkCredit`,
/// with `AutoSendFlow`). With 100, refilled at 50, a sender could have only 50 to 100 sends
/// on their way per round trip whatever it kept in flight (5000 to 10 000 a second at 10 ms):
/// the emulator, not the distance, would bound a relay that keeps more in flight.
const SEND_LINK_CREDIT: u32 = 1000;

async fn receive_from_client(
    request: LinkRequest,
    entity: Entity,
    max_size: u64,
    mut control: LinkControl,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    // Answer `first` whatever the client asked: Python asks `second` and then never settles.
    // The engine takes a batch's envelope beyond the advertised size; the service's own
    // measure (`codec::measured_size`) decides below.
    let answer = LinkAnswer::default()
        .credit(SEND_LINK_CREDIT)
        .max_message_size(max_size)
        .max_incoming(max_size.saturating_add(codec::BATCH_ENVELOPE_ALLOWANCE))
        .rcv_settle_mode(ReceiverSettleMode::First);
    let receiver = request.accept_receiver(answer).await?;
    control.watch(receiver.status());
    loop {
        let delivery = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            error = control.must_detach() => {
                control.unlist();
                return receiver.detach_with_error(error).await;
            }
            delivery = receiver.recv() => delivery?,
        };
        control.after_transfer();
        let outcome = if control.is_throttled() {
            Outcome::Rejected(Some(wire_error(
                condition::SERVER_BUSY,
                Some(super::survival::THROTTLED.to_owned()),
            )))
        } else {
            match codec::broker_messages(delivery.message_format, delivery.payload.clone()) {
                Ok(messages)
                    if codec::measured_size(
                        delivery.message_format,
                        delivery.payload.len(),
                        &messages,
                    ) as u64
                        > max_size =>
                {
                    Outcome::Rejected(Some(wire_error(
                        sb_amqp::condition::MESSAGE_SIZE_EXCEEDED,
                        Some(format!("message larger than {max_size} bytes")),
                    )))
                }
                Ok(messages) => match entity.send_batch(messages) {
                    Ok(_) => Outcome::Accepted,
                    Err(error) => Outcome::Rejected(Some(wire_error(
                        error.condition(),
                        Some(error.to_string()),
                    ))),
                },
                Err(error) => Outcome::Rejected(Some(wire_error(
                    condition::DECODE_ERROR,
                    Some(error.to_string()),
                ))),
            }
        };
        if !delivery.settled {
            receiver.settle(&delivery, outcome).await?;
        }
    }
}

/// Delivers `feed` to a receiving client under the link controls (idle timer, token expiry,
/// forced detaches, faults): plain and session receiver links alike.
pub(super) async fn deliver_to_client(
    request: LinkRequest,
    entity: &Entity,
    answer: LinkAnswer,
    feed: &Feed,
    mut control: LinkControl,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    let settled = request.remote_attach().snd_settle_mode == SenderSettleMode::Settled;
    let mode = if settled {
        ReceiveMode::ReceiveAndDelete
    } else {
        ReceiveMode::PeekLock
    };
    let sender = request.accept_sender(answer).await?;
    control.watch(sender.status());
    let mut credit = Credit::new(sender.flow());
    // Messages sent and not settled by a disposition yet (peek-lock).
    let mut unsettled = 0u32;
    let lost = control.lost();
    loop {
        let available = credit.available(sender.flow(), &mut control);
        control.record_flow(available, unsettled);
        tokio::select! {
            // Dispositions first: a client that releases its prefetched messages and then
            // detaches and closes at once (Python on close) must have its releases applied.
            biased;
            disposition = sender.next_disposition() => {
                unsettled = unsettled.saturating_sub(1);
                answer_disposition(&sender, entity, feed, &mut control, disposition?).await?;
            }
            () = stop.cancelled() => {
                settle_queued(&sender, entity).await;
                return Ok(());
            }
            () = lost.cancelled() => {
                control.hold_lost(sender.status(), &stop).await;
                return Ok(());
            }
            error = control.must_detach() => {
                control.unlist();
                // Still attached: what the client disposed before our detach is applied and
                // answered, never applied behind its back.
                settle_queued(&sender, entity).await;
                return sender.detach_with_error(error).await;
            }
            received = feed.next(entity, mode), if available > 0 => {
                match deliver(&sender, entity, feed, received, settled).await {
                    Delivered::Sent(lock_token) => {
                        credit.sent();
                        if !settled {
                            unsettled += 1;
                        }
                        // A session's message locks are its session lock, which ends with
                        // this link.
                        if let (Some(token), Feed::Entity) = (lock_token, feed) {
                            control.hold_lock(entity, token);
                        }
                        control.after_transfer();
                    }
                    Delivered::Nothing => {}
                    Delivered::Detach(error) => return sender.detach_with_error(error).await,
                    Delivered::LinkEnds(result) => return result,
                }
            }
            flow = sender.flow_changed(), if available == 0 => {
                if let Err(error) = flow {
                    settle_queued(&sender, entity).await;
                    return Err(error);
                }
            }
        }
    }
}

/// The client's credit as this link counts it. The engine's flow snapshot may not count the
/// latest sends yet; taking a message without real credit would lock it while it waits, and
/// block the delivery loop (and the client's settlements) until the client grants more.
#[derive(Debug)]
struct Credit {
    /// Transfers started on this link.
    started: u32,
    last_flow: LinkFlow,
}

impl Credit {
    fn new(flow: LinkFlow) -> Self {
        Credit {
            started: 0,
            last_flow: flow,
        }
    }

    /// The credit left given the engine's latest `flow`; a changed flow (credit, drain) is
    /// activity for the idle timer.
    fn available(&mut self, flow: LinkFlow, control: &mut LinkControl) -> u32 {
        if flow != self.last_flow {
            control.touch();
            self.last_flow = flow;
        }
        let ahead = flow.delivery_count.wrapping_sub(self.started);
        if ahead != 0 && ahead < 1 << 31 {
            // A drain advanced the delivery count past our sends.
            self.started = flow.delivery_count;
        }
        flow.credit
            .saturating_sub(self.started.wrapping_sub(flow.delivery_count))
    }

    /// One more transfer started.
    fn sent(&mut self) {
        self.started = self.started.wrapping_add(1);
    }
}

/// Applies and answers one disposition from the client, unless a `busy-settle` fault refuses
/// it (then it stays unapplied).
async fn answer_disposition(
    sender: &sb_amqp::Sender,
    entity: &Entity,
    feed: &Feed,
    control: &mut LinkControl,
    disposition: IncomingDisposition,
) -> Result<(), sb_amqp::Error> {
    if !disposition.settled && control.settlement_unanswered() {
        // Lost on the service's side: no outcome ever comes, nothing is applied, and the
        // message stays locked until its lock runs out. The SDKs bound the wait and retry
        // (azure-amqp's dispose waited forever until 2.3.3, Azure/azure-amqp#114; Java's
        // "Update disposition request timed out", Azure/azure-sdk-for-java#41967).
        tracing::info!(
            delivery_id = disposition.delivery_id,
            "Fault: leaving a disposition unanswered (--settlement-timeouts)."
        );
        control.touch();
        return Ok(());
    }
    if !disposition.settled && control.settlement_timed_out() {
        // The service's answer when an operation ran past its time ("The operation did not
        // complete within the allotted timeout", `com.microsoft:timeout`).
        let timeout = wire_error(
            condition::TIMEOUT,
            Some(
                "The operation did not complete within the allotted timeout (injected by the emulator)."
                    .to_owned(),
            ),
        );
        return sender
            .settle(disposition.delivery_id, Outcome::Rejected(Some(timeout)))
            .await;
    }
    if control.after_disposition(disposition.settled) {
        let busy = wire_error(
            condition::SERVER_BUSY,
            Some(
                "The server is busy. Please retry the operation (injected by --fault busy-settle or throttling)."
                    .to_owned(),
            ),
        );
        return sender
            .settle(disposition.delivery_id, Outcome::Rejected(Some(busy)))
            .await;
    }
    let Some(reply) = settle_answerable(sender, entity, &disposition).await else {
        return Ok(());
    };
    let reply = feed.reply(entity, reply);
    if !disposition.settled {
        sender.settle(disposition.delivery_id, reply).await?;
    }
    Ok(())
}

/// What one delivery attempt came to.
#[derive(Debug)]
enum Delivered {
    /// A message went out; under this lock token when the client settles it.
    Sent(Option<uuid::Uuid>),
    /// No message yet: look at the credit again.
    Nothing,
    /// The link must be detached with this error.
    Detach(sb_amqp::AmqpError),
    /// The link ends with this result.
    LinkEnds(Result<(), sb_amqp::Error>),
}

/// Sends one received message (or handles the receive's failure).
async fn deliver(
    sender: &sb_amqp::Sender,
    entity: &Entity,
    feed: &Feed,
    received: crate::Result<Option<crate::ReceivedMessage>>,
    settled: bool,
) -> Delivered {
    let received = match received {
        Ok(Some(received)) => received,
        Ok(None) => return Delivered::Nothing,
        // The session lock expired: the service detaches the receiver.
        Err(error) if matches!(feed, Feed::Session(_)) => {
            return Delivered::Detach(wire_error(error.condition(), Some(error.to_string())));
        }
        Err(error) => return Delivered::LinkEnds(Err(sb_amqp::Error::Decode(error.to_string()))),
    };
    let mut payload = match codec::delivered(&received) {
        Ok(payload) => payload,
        Err(e) => return Delivered::LinkEnds(Err(sb_amqp::Error::Encode(e.0))),
    };
    if entity.take_undecodable_delivery() {
        payload = codec::cut_short(&payload);
    }
    let tag = received.lock_token.map_or_else(
        || received.sequence_number.to_le_bytes().to_vec(),
        |t| t.to_bytes_le().to_vec(),
    );
    let sendable = Sendable::raw(payload).tag(tag);
    let sent = if settled {
        sender.send_settled(sendable).await.map(drop)
    } else {
        sender.send_no_wait(sendable).await.map(drop)
    };
    if let Err(error) = sent {
        // Never written: give the message back without counting a delivery.
        if let Some(token) = received.lock_token {
            // A lock lost meanwhile gives the message back anyway.
            let _ = entity.settle(token, Settlement::Release).await;
        }
        return Delivered::LinkEnds(Err(error));
    }
    Delivered::Sent(received.lock_token.filter(|_| !settled))
}

/// Handles the dispositions that arrived before the link stops: each is applied and, when the
/// client waits for it, answered while the link is still attached (a `released` sent just
/// before `detach` still unlocks the message). See [`settle_answerable`] for one that can no
/// longer be answered.
pub(super) async fn settle_queued(sender: &sb_amqp::Sender, entity: &Entity) {
    while let Ok(Ok(disposition)) =
        tokio::time::timeout(QUEUED_DISPOSITION_WAIT, sender.next_disposition()).await
    {
        let Some(reply) = settle_answerable(sender, entity, &disposition).await else {
            continue;
        };
        if !disposition.settled
            && let Err(error) = sender.settle(disposition.delivery_id, reply).await
        {
            tracing::debug!(%error, "Disposition applied, its answer not sent: the link went.");
        }
    }
}

/// Applies a client's disposition and returns the reply; `None` leaves it unapplied. That is
/// the fate of a complete, dead-letter or defer the client waits to see answered (unsettled)
/// when its link is already gone: the answer cannot reach the client, whose settlement then
/// fails, so the message must stay as it was. A release or abandon is applied anyway: it gives
/// the message back, which a failed settlement (a lost lock) tells the client may happen.
///
/// What remains: a client detaching between this check and the answer (its `detach` crossing
/// our answer on the wire) sees its settlement fail although it was applied.
pub(super) async fn settle_answerable(
    sender: &sb_amqp::Sender,
    entity: &Entity,
    disposition: &IncomingDisposition,
) -> Option<Outcome> {
    if !disposition.settled && !gives_back(disposition) && !sender.is_attached() {
        tracing::debug!(
            delivery_id = disposition.delivery_id,
            "Disposition left unapplied: its link is gone, so its answer cannot be sent."
        );
        return None;
    }
    Some(settle(entity, disposition).await)
}

/// `released`, or `modified` without `undeliverable-here` (abandon): the message goes back.
fn gives_back(disposition: &IncomingDisposition) -> bool {
    match &disposition.state {
        Some(DeliveryState::Released(_)) => true,
        Some(DeliveryState::Modified(m)) => m.undeliverable_here != Some(true),
        _ => false,
    }
}

/// How long [`settle_queued`] waits for one more queued disposition.
const QUEUED_DISPOSITION_WAIT: Duration = Duration::from_millis(20);

fn annotations_as_properties(modified: &Modified) -> Properties {
    let mut out = Properties::new();
    if let Some(fields) = &modified.message_annotations {
        for (key, value) in fields.iter() {
            out.insert(key.0.clone(), value_property(value));
        }
    }
    out
}

/// Applies a client's disposition and returns the settled reply: the same outcome type, or
/// `rejected{com.microsoft:message-lock-lost}`.
pub(super) async fn settle(entity: &Entity, disposition: &IncomingDisposition) -> Outcome {
    let Ok(tag) = <[u8; 16]>::try_from(disposition.delivery_tag.as_ref()) else {
        return Outcome::Rejected(Some(wire_error(
            condition::MESSAGE_LOCK_LOST,
            Some("unknown delivery tag".to_owned()),
        )));
    };
    let token = uuid::Uuid::from_bytes_le(tag);
    let settlement = match &disposition.state {
        Some(DeliveryState::Accepted(_)) => Settlement::Complete,
        Some(DeliveryState::Released(_)) => Settlement::Release,
        Some(DeliveryState::Modified(modified)) if modified.undeliverable_here == Some(true) => {
            Settlement::Defer {
                properties_to_modify: annotations_as_properties(modified),
            }
        }
        Some(DeliveryState::Modified(modified)) => Settlement::Abandon {
            properties_to_modify: annotations_as_properties(modified),
        },
        Some(DeliveryState::Rejected(rejected)) => {
            let info = rejected.error.as_ref().and_then(|e| e.info.as_ref());
            let field = |name: &str| {
                info.and_then(|fields| fields.iter().find(|(k, _)| k.0 == name))
                    .and_then(|(_, v)| match v {
                        Value::String(s) => Some(s.clone()),
                        _ => None,
                    })
            };
            let mut properties_to_modify = Properties::new();
            if let Some(fields) = info {
                for (key, value) in fields.iter() {
                    if key.0 != dead_letter::REASON && key.0 != dead_letter::ERROR_DESCRIPTION {
                        properties_to_modify.insert(key.0.clone(), value_property(value));
                    }
                }
            }
            Settlement::DeadLetter {
                reason: field(dead_letter::REASON),
                description: field(dead_letter::ERROR_DESCRIPTION),
                properties_to_modify,
            }
        }
        _ => return Outcome::Accepted,
    };
    let same = disposition
        .outcome()
        .map_or(Outcome::Accepted, |o| o.same_type());
    match entity.settle(token, settlement).await {
        Ok(()) => same,
        Err(error) => {
            Outcome::Rejected(Some(wire_error(error.condition(), Some(error.to_string()))))
        }
    }
}
