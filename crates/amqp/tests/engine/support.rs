//! Shared helpers: an in-process mini broker on 127.0.0.1:0, message builders, a kill-able
//! TCP proxy.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sb_amqp::types::messaging::{Body, Message};
use sb_amqp::{
    Connection, ConnectionEvent, LinkAnswer, Listener, Outcome, Receiver, ReceiverOptions,
    Sendable, Sender, SenderOptions, ServerConnection, ServerOptions, Session,
};
use tokio::sync::Notify;

pub(crate) fn data_message(body: &[u8]) -> Sendable {
    let m = Message::builder()
        .data(sb_amqp::types::messaging::Data(body.to_vec().into()))
        .build();
    Sendable::message(&m).unwrap()
}

pub(crate) fn body_bytes(d: &sb_amqp::Delivery) -> Vec<u8> {
    match d.message().unwrap().body {
        Body::Data(batch) => batch.into_iter().flat_map(|d| d.0.into_vec()).collect(),
        other => panic!("unexpected body {other:?}"),
    }
}

/// Spawns a server whose connections are handled by `handler`.
pub(crate) async fn spawn_server<F, Fut>(opts: ServerOptions, handler: F) -> SocketAddr
where
    F: Fn(ServerConnection) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    serve(Listener::bind("127.0.0.1:0", opts).await.unwrap(), handler)
}

/// As [`spawn_server`], for AMQP over WebSockets on `/$servicebus/websocket`.
pub(crate) async fn spawn_websocket_server<F, Fut>(opts: ServerOptions, handler: F) -> SocketAddr
where
    F: Fn(ServerConnection) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = Listener::bind_websocket("127.0.0.1:0", sb_amqp::WEBSOCKET_PATH, opts)
        .await
        .unwrap();
    serve(listener, handler)
}

fn serve<F, Fut>(listener: Listener, handler: F) -> SocketAddr
where
    F: Fn(ServerConnection) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr().unwrap();
    let handler = Arc::new(handler);
    tokio::spawn(async move {
        while let Ok(inc) = listener.accept().await {
            let h = handler.clone();
            tokio::spawn(async move {
                if let Ok(conn) = inc.handshake().await {
                    h(conn).await;
                }
            });
        }
    });
    addr
}

pub(crate) fn url(addr: SocketAddr) -> String {
    format!("amqp://{addr}")
}

pub(crate) async fn connect(addr: SocketAddr) -> Connection {
    Connection::open(&url(addr)).await.unwrap()
}

/// Attaches a sender named `name` to `address` with the default options.
pub(crate) async fn open_sender(session: &Session, name: &str, address: &str) -> Sender {
    session
        .attach_sender(SenderOptions::new(name, address))
        .await
        .unwrap()
}

/// Attaches a receiver named `name` to `address` with the default options (no credit).
pub(crate) async fn open_receiver(session: &Session, name: &str, address: &str) -> Receiver {
    session
        .attach_receiver(ReceiverOptions::new(name, address))
        .await
        .unwrap()
}

#[derive(Default)]
pub(crate) struct Queues {
    q: Mutex<HashMap<String, VecDeque<Bytes>>>,
    notify: Notify,
}

impl Queues {
    pub(crate) fn push(&self, addr: &str, b: Bytes) {
        self.q
            .lock()
            .unwrap()
            .entry(addr.to_string())
            .or_default()
            .push_back(b);
        self.notify.notify_waiters();
    }

    pub(crate) async fn pop(&self, addr: &str) -> Bytes {
        loop {
            let n = self.notify.notified();
            if let Some(b) = self
                .q
                .lock()
                .unwrap()
                .get_mut(addr)
                .and_then(|q| q.pop_front())
            {
                return b;
            }
            n.await;
        }
    }
}

/// A tiny in-memory broker: messages sent to an address are queued and delivered to
/// receivers of the same address (unsettled; released/rejected are not redelivered).
pub(crate) async fn spawn_broker() -> SocketAddr {
    let queues = Arc::new(Queues::default());
    spawn_server(ServerOptions::default(), move |mut conn| {
        let queues = queues.clone();
        async move {
            while let Some(ev) = conn.next_event().await {
                let ConnectionEvent::Link(req) = ev else {
                    continue;
                };
                let queues = queues.clone();
                if req.is_peer_sender() {
                    let addr = req.target_address().unwrap_or_default().to_string();
                    let r = req
                        .accept_receiver(LinkAnswer::default().credit(100))
                        .await
                        .unwrap();
                    tokio::spawn(async move {
                        while let Ok(d) = r.recv().await {
                            queues.push(&addr, d.payload.clone());
                            if r.accept(&d).await.is_err() {
                                break;
                            }
                        }
                    });
                } else {
                    let addr = req.source_address().unwrap_or_default().to_string();
                    let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
                    tokio::spawn(async move {
                        loop {
                            if s.wait_credit().await.is_err() {
                                break;
                            }
                            let m = queues.pop(&addr).await;
                            match s.send(Sendable::raw(m)).await {
                                Ok(Outcome::Accepted) | Ok(_) => {}
                                Err(_) => break,
                            }
                        }
                    });
                }
            }
        }
    })
    .await
}

/// A TCP proxy that can be killed to simulate abrupt socket loss.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    kill: Arc<Notify>,
}

impl Proxy {
    pub(crate) async fn start(upstream: SocketAddr) -> Proxy {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let kill = Arc::new(Notify::new());
        let k = kill.clone();
        tokio::spawn(async move {
            let (mut down, _) = l.accept().await.unwrap();
            let mut up = tokio::net::TcpStream::connect(upstream).await.unwrap();
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                _ = k.notified() => {}
            }
            // Dropping both sockets ends the client's stream without an AMQP close.
            drop(up);
            drop(down);
        });
        Proxy { addr, kill }
    }

    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }
}

/// Polls `f` once: its output if it is ready at once, else `None` (and `f` stays pending).
pub(crate) async fn futures_poll_once<F: std::future::Future + Unpin>(
    mut f: F,
) -> Option<F::Output> {
    use std::task::Poll;
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}
