//! In-process emulators on an ephemeral port, configured with `sb_emulator::Config`'s builders
//! (never hand-written `Config.json`), and our client for them.

use std::time::Duration;

use sb_emulator::{
    Broker, Config, Emulator, EmulatorOptions, EntityProperties, QueueConfig,
    parse_iso8601_duration,
};
use sb_inbox::Message;
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};

/// The namespace of Microsoft's emulator, which ours serves too.
pub const NAMESPACE: &str = "sbemulatorns";

/// An ISO-8601 duration written in a test (`PT30S`).
pub fn duration(iso8601: &str) -> Duration {
    parse_iso8601_duration(iso8601).expect("an ISO-8601 duration")
}

/// Queue properties: lock `lock` (ISO-8601), `max_delivery_count`, the rest the defaults.
pub fn properties(lock: &str, max_delivery_count: u32) -> EntityProperties {
    EntityProperties {
        lock_duration: duration(lock),
        max_delivery_count,
        ..EntityProperties::default()
    }
}

/// Properties of a session queue: lock `lock` (ISO-8601), max delivery count 5, receivers
/// through sessions only.
pub fn session_properties(lock: &str) -> EntityProperties {
    EntityProperties {
        requires_session: true,
        ..properties(lock, 5)
    }
}

/// A queue `name` with `properties`.
pub fn queue(name: &str, properties: EntityProperties) -> QueueConfig {
    QueueConfig::new(name).with_properties(properties)
}

/// An emulator serving `queues` in the [`NAMESPACE`], with `options`.
pub async fn start(queues: Vec<QueueConfig>, options: EmulatorOptions) -> Emulator {
    start_on_clock(queues, options, sb_emulator::Clock::new()).await
}

/// As [`start`], the broker on `clock` (`Clock::shifted`: a broker whose clock is off from the
/// host's, as `--clock-offset` runs it).
pub async fn start_on_clock(
    queues: Vec<QueueConfig>,
    options: EmulatorOptions,
    clock: sb_emulator::Clock,
) -> Emulator {
    let config = queues
        .into_iter()
        .fold(Config::new(NAMESPACE), Config::with_queue);
    let broker = Broker::with_clock(config, clock).expect("the configuration validates");
    Emulator::start(broker, options)
        .await
        .expect("the emulator starts")
}

/// A queue `orders` (lock `lock`, max delivery count 5) and `outbox`.
pub async fn emulator(lock: &str) -> Emulator {
    emulator_with(lock, EmulatorOptions::default()).await
}

/// As [`emulator`], served with `options`.
pub async fn emulator_with(lock: &str, options: EmulatorOptions) -> Emulator {
    start(
        vec![
            queue("orders", properties(lock, 5)),
            queue("outbox", EntityProperties::default()),
        ],
        options,
    )
    .await
}

/// Sends `message` to `queue` through `client`.
pub async fn send(client: &ServiceBusClient, queue: &str, message: Message) {
    client
        .sender(queue)
        .send(message)
        .await
        .expect("the emulator takes the message");
}

/// Our client, authorised by the emulator's connection string.
pub fn client(emulator: &Emulator) -> ServiceBusClient {
    let cs: ConnectionString = emulator
        .connection_string()
        .parse()
        .expect("the emulator's connection string parses");
    ServiceBusClient::from_connection_string(&cs)
}
