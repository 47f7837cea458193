//! A stand-in for an external shipping API that deduplicates by `Idempotency-Key`, as Stripe's
//! and most payment and shipping APIs do: the first request with a key creates a shipment, a
//! repeat answers the same shipment and creates nothing. It records every call, so a test can
//! count calls against effects, and can stall a call after its effect (the caller never learns
//! the answer), which is how a crash after the call looks from the API's side.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// One request the API received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    /// The `Idempotency-Key` header, if any.
    pub(crate) key: Option<String>,
    /// The shipment answered (`None` for a refused call).
    pub(crate) shipment_id: Option<String>,
    /// True when the key was seen before and no shipment was created.
    pub(crate) replayed: bool,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    shipments: HashMap<String, String>,
    stall_next: bool,
}

/// The API, serving on a loopback port until dropped.
#[derive(Debug)]
pub(crate) struct FakeShippingApi {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    // Read by `stalled`, which only the tests call (tests/servicebus/external_key.rs).
    #[allow(dead_code)]
    stalled: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeShippingApi {
    /// Starts serving on `127.0.0.1:0`.
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub(crate) async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let stalled = Arc::new(Notify::new());
        let task = tokio::spawn({
            let (state, stalled) = (state.clone(), stalled.clone());
            async move {
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(serve(socket, state.clone(), stalled.clone()));
                }
            }
        });
        Ok(FakeShippingApi {
            addr,
            state,
            stalled,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every call so far, in arrival order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        lock(&self.state).calls.clone()
    }

    /// Shipments created: the API's effects.
    pub(crate) fn shipments(&self) -> usize {
        lock(&self.state).shipments.len()
    }

    /// The next call takes effect and is then never answered.
    #[allow(dead_code)] // tests/servicebus/external_key.rs
    pub(crate) fn stall_next(&self) {
        lock(&self.state).stall_next = true;
    }

    /// Waits until a stalled call has taken effect.
    #[allow(dead_code)] // tests/servicebus/external_key.rs
    pub(crate) async fn stalled(&self) {
        self.stalled.notified().await;
    }
}

impl Drop for FakeShippingApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A poisoned lock only means a connection task panicked; the records are still whole.
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads one request (head and `Content-Length` body), applies it and answers.
async fn serve(mut socket: TcpStream, state: Arc<Mutex<State>>, stalled: Arc<Notify>) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let key = header("idempotency-key");
    let (status, body, stall) = {
        let mut state = lock(&state);
        let stall = std::mem::take(&mut state.stall_next);
        match &key {
            None => {
                state.calls.push(Call {
                    key: None,
                    shipment_id: None,
                    replayed: false,
                });
                (
                    "400 Bad Request",
                    r#"{"error":"Idempotency-Key required"}"#.to_owned(),
                    false,
                )
            }
            Some(key) => {
                let replayed = state.shipments.contains_key(key);
                let shipment_id = state
                    .shipments
                    .entry(key.clone())
                    .or_insert_with(|| format!("shp-{}", uuid::Uuid::new_v4()))
                    .clone();
                state.calls.push(Call {
                    key: Some(key.clone()),
                    shipment_id: Some(shipment_id.clone()),
                    replayed,
                });
                let status = if replayed { "200 OK" } else { "201 Created" };
                (
                    status,
                    format!(r#"{{"shipmentId":"{shipment_id}"}}"#),
                    stall,
                )
            }
        }
    };
    if stall {
        stalled.notify_one();
        // Hold the connection without answering until the caller goes away.
        let mut sink = [0u8; 64];
        while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
        return;
    }
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // A caller that went away has nothing to learn.
    let _ = socket.write_all(answer.as_bytes()).await;
    let _ = socket.shutdown().await;
}
