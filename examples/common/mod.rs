//! What the examples share: the embedded Service Bus emulator and a wait for settlements.
#![allow(dead_code)]

use std::time::Duration;

use sb_emulator::{Broker, Config, Emulator, EmulatorOptions, QueueConfig};
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};

/// The emulator in-process on an ephemeral port with `queues`, and a client connected to it.
pub(crate) async fn embedded(
    queues: &[&str],
) -> Result<(Emulator, ServiceBusClient), Box<dyn std::error::Error>> {
    let mut config = Config::new("sbemulatorns");
    for queue in queues {
        config = config.with_queue(QueueConfig::new(*queue));
    }
    let emulator = Emulator::start(Broker::new(config)?, EmulatorOptions::default()).await?;
    let cs: ConnectionString = emulator.connection_string().parse()?;
    let client = ServiceBusClient::from_connection_string(&cs);
    Ok((emulator, client))
}

/// Waits (at most 30 s) until `settled` messages of `queue` were completed or dead-lettered
/// and none is locked; `false` on time-out.
pub(crate) async fn settled(emulator: &Emulator, queue: &str, settled: u64) -> bool {
    let Ok(entity) = emulator.broker().entity(queue) else {
        return false;
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let c = entity.counts();
            if c.locked == 0 && c.completed + c.dead_lettered_total >= settled {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}
