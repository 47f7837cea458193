//! (3) `$cbs` and `$management` requests as the emulator's nodes read them: arbitrary bytes
//! decoded as a request message (application properties such as `operation`, `name`, `type`,
//! and the map body with lock tokens, sequence numbers, messages to schedule, rules), then
//! answered as `$cbs` put-token and as `q/$management` on a broker with messages in it.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sb_emulator::{Broker, Config};

const CONFIG: &str = r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[{"Name":"q"}],"Topics":[{"Name":"t","Subscriptions":[{"Name":"sub"}]}]}],"Logging":{"Type":"File"}}}"#;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    // A fresh broker per input keeps runs reproducible from the input alone.
    let Ok(config) = Config::from_json(CONFIG) else {
        return;
    };
    let Ok(broker) = Broker::new(config) else {
        return;
    };
    runtime().block_on(async {
        for entity in ["q", "t/subscriptions/sub"] {
            let _ = sb_emulator::fuzzing::node_request(&broker, entity, data).await;
        }
    });
});
