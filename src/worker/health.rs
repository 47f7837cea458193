//! `/healthz` (alive) and `/readyz` (broker and store connected, no handler slot stuck) for
//! container probes.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::runtime::StoreHealth;
use crate::{MssqlStore, PgStore, SqliteStore, StoreError};

/// Whether a dependency answers.
pub trait Ping: Send + Sync {
    /// Answers `Ok` when the dependency is reachable now.
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>>;
}

impl Ping for PgStore {
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(async move { self.query("SELECT 1", &[]).await.map(drop) })
    }
}

impl Ping for SqliteStore {
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(async move { self.with_connection(|c| c.execute_batch("SELECT 1")).await })
    }
}

impl Ping for MssqlStore {
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(async move { self.query("SELECT 1", &[]).await.map(drop) })
    }
}

/// What `/readyz` checks.
#[derive(Clone)]
pub(crate) struct Readiness {
    pub(crate) broker: Arc<dyn Fn() -> bool + Send + Sync>,
    pub(crate) store: Arc<dyn Ping>,
    /// Deployment errors the runtime's transactions met: the store answers a ping, but not with
    /// the schema or rights the code needs.
    pub(crate) store_health: StoreHealth,
    /// Handler slots stuck past the maximum processing time ([`crate::runtime::SlotWatch`]):
    /// the worker holds capacity it cannot use, so another replica should take the traffic.
    pub(crate) stuck_slots: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// Serves the probes on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "Health endpoints listening.");
    }
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, peer)) = accepted else {
            continue;
        };
        let readiness = readiness.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(stream, peer, &readiness).await {
                tracing::debug!(%peer, %error, "Health probe connection failed.");
            }
        });
    }
}

async fn answer(
    mut stream: tokio::net::TcpStream,
    _peer: SocketAddr,
    readiness: &Readiness,
) -> std::io::Result<()> {
    let mut buffer = [0u8; 1024];
    let read = stream.read(&mut buffer).await?;
    let request = String::from_utf8_lossy(&buffer[..read]);
    let path = request.lines().next().and_then(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some("GET"))
            .then(|| parts.next())
            .flatten()
    });
    let (status, body) = match path {
        Some("/healthz") => ("200 OK", "{\"status\":\"alive\"}".to_owned()),
        Some("/readyz") => {
            let broker = (readiness.broker)();
            let problem = readiness.store_health.problem();
            let store = problem.is_none() && readiness.store.ping().await.is_ok();
            let stuck = (readiness.stuck_slots)();
            let status = if broker && store && stuck == 0 {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let mut body =
                format!("{{\"broker\":{broker},\"store\":{store},\"stuck_slots\":{stuck}");
            if let Some(problem) = problem {
                body.push_str(",\"store_problem\":");
                body.push_str(&serde_json::Value::from(problem).to_string());
            }
            body.push('}');
            (status, body)
        }
        _ => ("404 Not Found", "{\"error\":\"not found\"}".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::ErrorKind;

    struct FakeStore(Arc<AtomicBool>);

    impl Ping for FakeStore {
        fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
            let up = self.0.load(Ordering::SeqCst);
            Box::pin(async move {
                if up {
                    Ok(())
                } else {
                    Err(StoreError::new(ErrorKind::Connection, None, None, "down"))
                }
            })
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn ready_only_when_broker_and_store_answer_and_no_slot_is_stuck() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (broker, store) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(true)),
        );
        let broker_flag = broker.clone();
        let store_health = StoreHealth::new(&crate::ConsumerName::new("c").unwrap());
        let stuck = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stuck_count = stuck.clone();
        let readiness = Readiness {
            broker: Arc::new(move || broker_flag.load(Ordering::SeqCst)),
            store: Arc::new(FakeStore(store.clone())),
            store_health: store_health.clone(),
            stuck_slots: Arc::new(move || stuck_count.load(Ordering::SeqCst)),
        };
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(listener, readiness, shutdown.clone()));

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        for (b, s, expected) in [
            (true, true, "200"),
            (false, true, "503"),
            (true, false, "503"),
            (false, false, "503"),
        ] {
            broker.store(b, Ordering::SeqCst);
            store.store(s, Ordering::SeqCst);
            let response = get(addr, "/readyz").await;
            assert!(
                response.starts_with(&format!("HTTP/1.1 {expected}")),
                "{b} {s}: {response}"
            );
            assert!(
                response.ends_with(&format!(
                    "{{\"broker\":{b},\"store\":{s},\"stuck_slots\":0}}"
                )),
                "{response}"
            );
        }
        // The store answers, but the runtime's transactions meet a missing table.
        broker.store(true, Ordering::SeqCst);
        store.store(true, Ordering::SeqCst);
        store_health.deployment_error(&StoreError::new(
            ErrorKind::Deployment,
            Some("42P01".into()),
            None,
            "relation \"inventory_stock\" does not exist",
        ));
        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(
            response.ends_with(
                "{\"broker\":true,\"store\":false,\"stuck_slots\":0,\"store_problem\":\"deployment (code 42P01)\"}"
            ),
            "{response}"
        );
        store_health.committed();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        stuck.store(1, Ordering::SeqCst);
        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(response.ends_with("\"stuck_slots\":1}"), "{response}");
        stuck.store(0, Ordering::SeqCst);
        broker.store(false, Ordering::SeqCst);
        assert!(
            get(addr, "/healthz").await.starts_with("HTTP/1.1 200"),
            "alive even when not ready"
        );
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        shutdown.cancel();
    }
}
