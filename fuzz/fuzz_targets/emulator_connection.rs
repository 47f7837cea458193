//! (2) The emulator's connection handling fed arbitrary bytes after a valid protocol header:
//! an even first byte sends the SASL header (the input then starts in the SASL phase), an odd
//! one the plain AMQP header (the open phase; the emulator allows no-SASL clients). The seeds
//! are whole client byte streams captured from the official SDKs and our client, so mutations
//! land in every phase: SASL, open, begin, attach, transfers, `$cbs` and `$management`.
//!
//! One emulator runs for the whole process on an ephemeral loopback port; each input is one
//! TCP connection that sends the bytes, half-closes, and reads until the emulator closes. A
//! panic on any emulator task aborts the process (libfuzzer-sys's panic hook), so it is found.
#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[{"Name":"q"},{"Name":"s","Properties":{"RequiresSession":true}}],"Topics":[{"Name":"t","Subscriptions":[{"Name":"sub"}]}]}],"Logging":{"Type":"File"}}}"#;

fn emulator() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let emulator = sb_emulator::start_from_json(CONFIG, "127.0.0.1:0")
                    .await
                    .expect("emulator");
                tx.send(emulator.local_addr()).expect("send address");
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("emulator address")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&phase, rest)) = data.split_first() else {
        return;
    };
    let header: &[u8] = if phase % 2 == 0 {
        b"AMQP\x03\x01\x00\x00"
    } else {
        b"AMQP\x00\x01\x00\x00"
    };
    let Ok(mut stream) = TcpStream::connect(emulator()) else {
        return;
    };
    // A valid prefix (open, begin, attach) gets answers and an open link waits for more: the
    // half-close ends it. The timeout only guards the fuzzer against a connection the emulator
    // never closes, which would itself be a finding (a hang shows as a slow unit).
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.write_all(header);
    let _ = stream.write_all(rest);
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0u8; 16 * 1024];
    while let Ok(n) = stream.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
});
