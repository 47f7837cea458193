//! The driver answers every frame that arrived together in one write (issue 42: a write syscall
//! per frame was much of the worker's CPU), in order, also when one of them is larger than the
//! read buffer.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use sb_amqp::performative::{Flow, Performative};
use sb_amqp::types::definitions::{Handle, ReceiverSettleMode};
use sb_amqp::{
    ConnectionEvent, Frame, FrameBody, LinkAnswer, Outcome, ServerOptions, frame, serve_io,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

use crate::raw_peer::{begin, next, open, sender_attach, transfer, transfer_on};
use crate::support::{data_message, spawn_server};

/// A stream that counts the writes that moved bytes.
struct CountingIo {
    inner: DuplexStream,
    writes: Arc<AtomicUsize>,
}

impl AsyncRead for CountingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A session-level `flow` asking for the peer's (`echo`).
fn echo_flow() -> Frame {
    Frame::amqp(
        0,
        Flow {
            next_incoming_id: Some(0),
            incoming_window: 100,
            next_outgoing_id: 0,
            outgoing_window: 100,
            handle: None,
            delivery_count: None,
            link_credit: None,
            available: None,
            drain: false,
            echo: true,
            properties: None,
        },
    )
}

/// A transfer on a handle no link holds: dropped, but it spends the session's window, so the
/// next echoed `flow` shows it passed (`next-incoming-id` one further).
fn stray_transfer(id: u32, payload: Bytes) -> Frame {
    transfer_on(Handle(7), id, vec![0], true, payload)
}

/// The next performative on a raw stream, skipping heartbeats.
async fn next_raw(io: &mut DuplexStream, buf: &mut BytesMut) -> Performative {
    loop {
        if let Some(f) = Frame::parse(buf, 1 << 20).unwrap() {
            match f.body {
                FrameBody::Amqp(p, _) => return *p,
                FrameBody::Empty => continue,
                FrameBody::Sasl(s) => panic!("unexpected {s:?}"),
            }
        }
        assert!(io.read_buf(buf).await.unwrap() > 0, "stream ended");
    }
}

async fn write_frames(io: &mut DuplexStream, frames: &[Frame]) {
    let mut out = BytesMut::new();
    for f in frames {
        f.encode(&mut out).unwrap();
    }
    io.write_all(&out).await.unwrap();
}

#[tokio::test]
async fn frames_that_arrive_together_are_answered_in_one_write_in_order() {
    const ECHOES: u32 = 12;
    let (mut ours, theirs) = tokio::io::duplex(1 << 20);
    let writes = Arc::new(AtomicUsize::new(0));
    let io = CountingIo {
        inner: theirs,
        writes: writes.clone(),
    };
    let server = tokio::spawn(serve_io(Box::new(io), Arc::new(ServerOptions::default())));
    let mut buf = BytesMut::new();
    ours.write_all(&frame::AMQP_HEADER).await.unwrap();
    write_frames(&mut ours, &[Frame::amqp(0, open("coalesce"))]).await;
    while buf.len() < 8 {
        assert!(ours.read_buf(&mut buf).await.unwrap() > 0);
    }
    assert_eq!(&buf.split_to(8)[..], &frame::AMQP_HEADER[..]);
    assert!(matches!(
        next_raw(&mut ours, &mut buf).await,
        Performative::Open(_)
    ));
    let _server = server.await.unwrap().unwrap();
    write_frames(&mut ours, &[Frame::amqp(0, begin(None, 100))]).await;
    let Performative::Begin(b) = next_raw(&mut ours, &mut buf).await else {
        panic!("no begin")
    };
    assert_eq!(b.remote_channel, Some(0));

    // All in one write: an echoed flow after each transfer, the middle transfer larger than
    // the engine's 8 KiB read buffer.
    let mut burst = Vec::new();
    for i in 0..ECHOES {
        let size = if i == ECHOES / 2 { 40 * 1024 } else { 16 };
        burst.push(stray_transfer(i, Bytes::from(vec![i as u8; size])));
        burst.push(echo_flow());
    }
    let before = writes.load(Ordering::SeqCst);
    write_frames(&mut ours, &burst).await;
    // Every echo answered, each after its transfer: the session's next-incoming-id counts them.
    let mut answers = Vec::new();
    for _ in 0..ECHOES {
        let Performative::Flow(fl) = next_raw(&mut ours, &mut buf).await else {
            panic!("not a flow")
        };
        answers.push(fl.next_incoming_id);
    }
    let expected: Vec<Option<u32>> = (1..=ECHOES).map(Some).collect();
    assert_eq!(answers, expected);
    // One write per read of the reader, not one per frame: the burst arrives in a few reads
    // (the large frame takes more than one), far fewer than the twelve answers.
    let answered_in = writes.load(Ordering::SeqCst) - before;
    assert!(
        answered_in <= 3,
        "{ECHOES} answers took {answered_in} writes"
    );
}

/// Two settlements asked for one after the other by tasks that run in the same turn of the
/// scheduler: the second is asked for after the driver was woken for the first, and both
/// still leave in one write, as one disposition covering both deliveries.
#[tokio::test]
async fn settlements_asked_for_together_leave_as_one_disposition() {
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        async move {
            let Some(ConnectionEvent::Link(req)) = conn.next_event().await else {
                return;
            };
            let r = req
                .accept_receiver(
                    LinkAnswer::default()
                        .credit(10)
                        .rcv_settle_mode(ReceiverSettleMode::First),
                )
                .await
                .unwrap();
            let (first, second) = (r.recv().await.unwrap(), r.recv().await.unwrap());
            let wake = Arc::new(tokio::sync::Notify::new());
            let (waiting_tx, waiting_rx) = tokio::sync::oneshot::channel();
            let later = tokio::spawn({
                let (settler, wake) = (r.settler(), wake.clone());
                async move {
                    let woken = wake.notified();
                    waiting_tx.send(()).unwrap();
                    woken.await;
                    settler
                        .settle(second.delivery_id, Outcome::Accepted)
                        .await
                        .unwrap();
                }
            });
            waiting_rx.await.unwrap();
            let settler = r.settler();
            let mut settling = Box::pin(settler.settle(first.delivery_id, Outcome::Accepted));
            // Polled once: its command is queued and the driver woken; only then is the
            // other task woken, behind the driver.
            std::future::poll_fn(|cx| {
                let _ = settling.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
            wake.notify_one();
            settling.await.unwrap();
            later.await.unwrap();
            // The connection stays open while the peer reads.
            std::future::pending::<()>().await;
        }
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut f = sb_amqp::FramedIo::new(Box::new(tcp), 65536);
    f.write_header(frame::AMQP_HEADER).await.unwrap();
    f.write_frame(&Frame::amqp(0, open("settle-together")))
        .await
        .unwrap();
    f.write_frame(&Frame::amqp(0, begin(None, 100)))
        .await
        .unwrap();
    f.write_frame(&Frame::amqp(0, sender_attach("together", "q1")))
        .await
        .unwrap();
    assert_eq!(f.read_header().await.unwrap().unwrap(), frame::AMQP_HEADER);
    assert!(matches!(next(&mut f).await, Performative::Open(_)));
    assert!(matches!(next(&mut f).await, Performative::Begin(_)));
    assert!(matches!(next(&mut f).await, Performative::Attach(_)));
    assert!(matches!(next(&mut f).await, Performative::Flow(_)));
    f.write_frame(&transfer(0, vec![0], data_message(b"a").payload))
        .await
        .unwrap();
    f.write_frame(&transfer(1, vec![1], data_message(b"b").payload))
        .await
        .unwrap();
    let Performative::Disposition(d) = next(&mut f).await else {
        panic!("not a disposition")
    };
    assert!(d.settled);
    assert_eq!((d.first, d.last.unwrap_or(d.first)), (0, 1), "{d:?}");
}
