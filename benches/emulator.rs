//! Emulator throughput: send → receive (peek-lock) → complete with our Service Bus client
//! (`sb_inbox::servicebus`) against the in-process emulator on an ephemeral port, with 1 and 8
//! concurrent clients (one connection each, competing on one queue).
//!
//! `cargo bench --bench emulator` prints messages/s for both and their ratio.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sb_emulator::{Broker, Config, Emulator};
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};
use sb_inbox::{Delivery, Message, Receiver};

const MESSAGES: usize = 2_000;
const ROUNDS: usize = 3;

async fn emulator() -> Emulator {
    let json = r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns","Queues":[
        {"Name":"bench","Properties":{"LockDuration":"PT1M","MaxDeliveryCount":10}}],"Topics":[]}]}}"#;
    let broker = Broker::new(Config::from_json(json).unwrap()).unwrap();
    Emulator::start(broker, Default::default()).await.unwrap()
}

/// One client: `count` rounds of send, receive, complete.
async fn client_loop(cs: ConnectionString, count: usize, id: usize) {
    let client = ServiceBusClient::from_connection_string(&cs);
    let sender = client.sender("bench");
    let receiver = client.receiver("bench", 0);
    for i in 0..count {
        sender
            .send(Message::new(format!("m-{id}-{i}"), "bench.v1", "{}"))
            .await
            .unwrap();
        let delivery = loop {
            if let Some(d) = receiver.receive().await.unwrap() {
                break d;
            }
        };
        delivery.complete().await.unwrap();
    }
}

/// Messages per second for `clients` concurrent clients sharing `MESSAGES`.
async fn run(emulator: &Emulator, clients: usize) -> f64 {
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    let per_client = MESSAGES / clients;
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|id| tokio::spawn(client_loop(cs.clone(), per_client, id)))
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed().max(Duration::from_micros(1));
    (per_client * clients) as f64 / elapsed.as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let emulator = emulator().await;
        // Warm up connections and code paths.
        run(&emulator, 2).await;
        let mut one: f64 = 0.0;
        let mut eight: f64 = 0.0;
        for _ in 0..ROUNDS {
            one = one.max(run(&emulator, 1).await);
            eight = eight.max(run(&emulator, 8).await);
        }
        let counts = emulator.broker().entity("bench").unwrap().counts();
        assert_eq!((counts.active, counts.locked), (0, 0));
        println!(
            "emulator send → receive (peek-lock) → complete, {MESSAGES} messages, best of {ROUNDS}"
        );
        println!("  1 client  : {one:9.0} messages/s");
        println!("  8 clients : {eight:9.0} messages/s");
        println!("  ratio     : {:9.2}x", eight / one);
        emulator.shutdown().await;
    });
}
