//! Network distance: every byte a connection reads or writes is held for a fixed one-way delay,
//! in order, so clients, tests and benches see the broker at a realistic distance (in-region
//! Azure is 1–3 ms round trip plus the namespace's service time; cross-region 40–80 ms).
//!
//! The delay sits under the AMQP framing (above TLS and the WebSocket framing), so it applies
//! to every listener alike. A zero delay returns the stream untouched: with the option off
//! nothing changes.

use std::time::Duration;

use bytes::Bytes;
use sb_amqp::BoxIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How much one direction buffers before it stops reading: the analogue of a TCP window, so a
/// fast writer is slowed down instead of filling memory.
const CHUNKS_IN_FLIGHT: usize = 1024;
/// The most bytes read in one go (one chunk of the delay line).
const CHUNK: usize = 64 * 1024;

/// `io`, with everything read from it and written to it delayed by `delay` each way.
pub(crate) fn delayed(io: BoxIo, delay: Duration) -> BoxIo {
    if delay.is_zero() {
        return io;
    }
    let (near, far) = tokio::io::duplex(CHUNK);
    let (socket_read, socket_write) = tokio::io::split(io);
    let (far_read, far_write) = tokio::io::split(far);
    // Either direction ending ends both: a peer gone one way will not read the other.
    let ended = CancellationToken::new();
    tokio::spawn(delay_line(socket_read, far_write, delay, ended.clone()));
    tokio::spawn(delay_line(far_read, socket_write, delay, ended));
    Box::new(near)
}

/// Copies `from` to `to`, each chunk `delay` after it was read, in order.
async fn delay_line(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    delay: Duration,
    ended: CancellationToken,
) {
    let (line, mut due) = mpsc::channel::<(Instant, Bytes)>(CHUNKS_IN_FLIGHT);
    let read = async move {
        let mut buffer = vec![0; CHUNK];
        loop {
            let n = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = Bytes::copy_from_slice(&buffer[..n]);
            if line.send((Instant::now() + delay, chunk)).await.is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() || to.flush().await.is_err() {
                return;
            }
        }
        // The reader saw the end: pass it on once the bytes before it were delivered.
        let _ = to.shutdown().await;
    };
    tokio::select! {
        () = ended.cancelled() => {}
        ((), ()) = async { tokio::join!(read, write) } => {}
    }
    ended.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bytes_arrive_after_the_delay_in_order_both_ways() {
        let (client, server) = tokio::io::duplex(1024);
        let mut delayed = delayed(Box::new(server), Duration::from_millis(40));
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let start = Instant::now();
        client_write.write_all(b"ab").await.unwrap();
        client_write.write_all(b"cd").await.unwrap();
        let mut got = [0; 4];
        delayed.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd");
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "{:?}",
            start.elapsed()
        );
        let sent = Instant::now();
        delayed.write_all(b"ok").await.unwrap();
        let mut back = [0; 2];
        client_read.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ok");
        assert!(
            sent.elapsed() >= Duration::from_millis(40),
            "{:?}",
            sent.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_stream_passes_through_after_the_bytes() {
        let (client, server) = tokio::io::duplex(1024);
        let mut delayed = delayed(Box::new(server), Duration::from_millis(5));
        let (_client_read, mut client_write) = tokio::io::split(client);
        client_write.write_all(b"last").await.unwrap();
        client_write.shutdown().await.unwrap();
        let mut all = Vec::new();
        delayed.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"last");
    }
}
