//! A test HTTP `CONNECT` proxy: answers `CONNECT host:port` with `200 Connection established`
//! and pipes bytes both ways, counting the tunnels it opened; any other method gets `405`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The largest request head the proxy reads.
const MAX_HEAD: usize = 8 * 1024;

/// A running proxy on `127.0.0.1`; dropping it stops accepting (open tunnels run on).
#[derive(Debug)]
pub struct ConnectProxy {
    addr: SocketAddr,
    tunnels: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl ConnectProxy {
    /// Starts the proxy on an ephemeral port.
    ///
    /// # Errors
    /// When the listener cannot bind.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tunnels = Arc::new(AtomicUsize::new(0));
        let counter = tunnels.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, counter.clone()));
            }
        });
        Ok(Self {
            addr,
            tunnels,
            accept,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, as `HTTPS_PROXY` names it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many tunnels it opened.
    pub fn tunnels(&self) -> usize {
        self.tunnels.load(Ordering::SeqCst)
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(mut client: TcpStream, tunnels: Arc<AtomicUsize>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") && head.len() < MAX_HEAD {
        head.push(client.read_u8().await?);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (words.next(), words.next());
    let target = match (method, target) {
        (Some("CONNECT"), Some(target)) => target,
        _ => {
            client
                .write_all(b"HTTP/1.1 405 Method Not Allowed\r\nAllow: CONNECT\r\nContent-Length: 0\r\n\r\n")
                .await?;
            return client.shutdown().await;
        }
    };
    let mut upstream = match TcpStream::connect(target).await {
        Ok(upstream) => upstream,
        Err(_) => {
            client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                .await?;
            return client.shutdown().await;
        }
    };
    tunnels.fetch_add(1, Ordering::SeqCst);
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}
