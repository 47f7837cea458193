//! (2) The emulator's connection handling fed arbitrary bytes after a valid protocol header:
//! an even first byte sends the SASL header (the input then starts in the SASL phase), an odd
//! one the plain AMQP header (the open phase; the emulator allows no-SASL clients). The seeds
//! are whole client byte streams captured from the official SDKs and our client, so mutations
//! land in every phase: SASL, open, begin, attach, transfers, `$cbs` and `$management`.
//!
//! Each input gets a fresh emulator (its own current-thread runtime, broker and ephemeral port),
//! shut down and dropped before the input returns: nothing the emulator allocated outlives the
//! input, so libFuzzer's per-input leak check stays on (with one emulator for the whole process
//! it switched itself off after ~2 900 runs, taking the broker's growing state for leaks).
//!
//! A hang is a finding: an input the emulator neither answers to the end nor closes within
//! [`HANG_AFTER`] panics. That deadline is below libFuzzer's `-timeout=10` (`fuzz/run-all`), so
//! the hang is reported as such, with its input, rather than as a slow unit. A panic on any
//! emulator task aborts the process too (libfuzzer-sys's panic hook).
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[{"Name":"q"},{"Name":"s","Properties":{"RequiresSession":true}}],"Topics":[{"Name":"t","Subscriptions":[{"Name":"sub"}]}]}],"Logging":{"Type":"File"}}}"#;

/// How long one input's connection may stay open after our half-close: past it, the emulator
/// hangs on the input. Below libFuzzer's `-timeout=10`, with room for a loaded machine.
const HANG_AFTER: Duration = Duration::from_secs(8);

/// Sends `header` and `rest`, half-closes, and reads until the emulator closes; `false` when it
/// did not close within [`HANG_AFTER`].
async fn exchange(addr: std::net::SocketAddr, header: &[u8], rest: &[u8]) -> bool {
    let Ok(stream) = TcpStream::connect(addr).await else {
        return true;
    };
    let (mut rd, mut wr) = stream.into_split();
    // Reads run beside the writes: an emulator answering a long input must not stall on us.
    let reading = async move {
        let mut sink = vec![0u8; 16 * 1024];
        while let Ok(n) = rd.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let writing = async move {
        // A refused write means the emulator closed first: that is an answer, not a hang.
        if wr.write_all(header).await.is_ok() && wr.write_all(rest).await.is_ok() {
            let _ = wr.shutdown().await; // same
        }
    };
    tokio::time::timeout(HANG_AFTER, async { tokio::join!(reading, writing) })
        .await
        .is_ok()
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let closed = rt.block_on(async {
        let emulator = sb_emulator::start_from_json(CONFIG, "127.0.0.1:0")
            .await
            .expect("emulator");
        let closed = exchange(emulator.local_addr(), header, rest).await;
        emulator.shutdown().await;
        closed
    });
    drop(rt);
    assert!(
        closed,
        "hang: the emulator neither finished answering nor closed the connection within {HANG_AFTER:?}"
    );
});
