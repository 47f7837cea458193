//! The Service Bus client against the emulator, in-process on an ephemeral port, and the
//! runtime end to end over both.
#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

#[path = "../support.rs"]
mod support;

// The runtime tests' handler wrappers (`Slow`), shared rather than written again.
#[path = "../runtime/handlers.rs"]
#[allow(dead_code)]
mod handlers;

mod bad_input;
mod cli;
mod client;
mod emulator_wire;
mod external;
mod external_key;
mod holes;
mod host;
mod js;
mod python;
mod recovery;
mod relay;
mod retry;
mod sessions;
mod strict;
mod survival;
mod verification;
mod vocabulary;
mod websocket;
mod worker;

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions};
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};

/// A queue `orders` (lock `lock`, max delivery count 5) and `outbox`.
pub(crate) async fn emulator(lock: &str) -> Emulator {
    emulator_with(lock, EmulatorOptions::default()).await
}

/// As [`emulator`], served with `options`.
pub(crate) async fn emulator_with(lock: &str, options: EmulatorOptions) -> Emulator {
    let json = format!(
        r#"{{"UserConfig":{{"Namespaces":[{{"Name":"sbemulatorns","Queues":[
            {{"Name":"orders","Properties":{{"LockDuration":"{lock}","MaxDeliveryCount":5}}}},
            {{"Name":"outbox","Properties":{{}}}}],"Topics":[]}}],"Logging":{{"Type":"File"}}}}}}"#
    );
    let broker = Broker::new(Config::from_json(&json).unwrap()).unwrap();
    Emulator::start(broker, options).await.unwrap()
}

pub(crate) fn client(emulator: &Emulator) -> ServiceBusClient {
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    ServiceBusClient::from_connection_string(&cs)
}
