//! Broker core integration tests, all on tokio's paused clock (`start_paused = true` and
//! `tokio::time::advance`): no test sleeps for real. `process`: the `sb-emulator` binary's
//! flags on the wire (real time, bounded waits on events), `fault_flags` its fault flags
//! likewise. `hostile_wire` runs the
//! `sb-emulator` binary against hostile frames on raw sockets, `huge_delivery` against 1 GB
//! deliveries streamed on its node and entity links.

#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

mod entities;
mod fault_flags;
mod faults;
mod hostile_wire;
mod huge_delivery;
mod locks;
mod process;
mod receivers;
mod sessions;
mod settlement;
mod timers;
mod topics;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sb_emulator::{
    Broker, BrokerMessage, Config, CorrelationFilter, DispositionStatus, Entity, EntityProperties,
    Error, Filter, MessageState, Properties, PropertyValue, QueueConfig, ReceiveMode, Rule,
    SendOutcome, Settlement, SqlFilter, SqlRuleAction, SubscriptionConfig, TopicConfig,
    TopicProperties,
};
use tokio::time::advance;

const SEC: Duration = Duration::from_secs(1);

const WAIT: Option<Duration> = Some(Duration::from_millis(10));

fn props(f: impl FnOnce(&mut EntityProperties)) -> EntityProperties {
    let mut p = EntityProperties {
        lock_duration: Duration::from_secs(5),
        max_delivery_count: 3,
        ..EntityProperties::default()
    };
    f(&mut p);
    p
}

fn queue_broker(p: EntityProperties) -> (Broker, Entity) {
    let broker =
        Broker::new(Config::new("ns").with_queue(QueueConfig::new("q").with_properties(p)))
            .unwrap();
    let q = broker.entity("q").unwrap();
    (broker, q)
}

fn msg(id: &str) -> BrokerMessage {
    BrokerMessage::new(format!("body-{id}")).with_message_id(id)
}

async fn recv(e: &Entity) -> sb_emulator::ReceivedMessage {
    e.receive(ReceiveMode::PeekLock, WAIT)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no message on {}", e.path()))
}

fn token(m: &sb_emulator::ReceivedMessage) -> uuid::Uuid {
    m.lock_token
        .expect("peek-lock deliveries carry a lock token")
}
