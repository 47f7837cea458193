//! Telling AMQP from HTTP on one port: the first bytes a client sends are the AMQP protocol
//! header (`AMQP`) or an HTTP request line; they are read ahead and handed back unread.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::core::BoxIo;
use crate::error::Result;

/// What the client opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// The AMQP (or SASL) protocol header.
    Amqp,
    /// An HTTP request for the WebSocket path (a WebSocket upgrade).
    WebSocket,
    /// Any other HTTP request (the management API shares the TLS port with `amqps` and `wss`
    /// on the service: Microsoft Learn, "Service Bus management REST API").
    Http,
}

/// The longest request line read ahead to find the request's path.
const MAX_REQUEST_LINE: usize = 8 * 1024;

/// Reads the client's first four bytes (all four, or what came before it closed); unless they
/// are the AMQP header, reads on to the end of the HTTP request line to tell a WebSocket
/// upgrade on `websocket_path` from other requests. Returns the stream with what was read put
/// back.
pub(crate) async fn sniff(mut io: BoxIo, websocket_path: &str) -> Result<(Opening, BoxIo)> {
    let mut head = vec![0u8; 4];
    let mut filled = 0;
    while filled < head.len() {
        let n = io.read(&mut head[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    head.truncate(filled);
    let opening = if head == b"AMQP" {
        Opening::Amqp
    } else {
        let mut chunk = [0u8; 512];
        while !head.contains(&b'\n') && head.len() < MAX_REQUEST_LINE {
            let n = io.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n]);
        }
        if request_path(&head).is_some_and(|p| p.eq_ignore_ascii_case(websocket_path)) {
            Opening::WebSocket
        } else {
            Opening::Http
        }
    };
    let rewound = Rewound { head, read: 0, io };
    Ok((opening, Box::new(rewound)))
}

/// The path of an HTTP request line (`GET /path?query HTTP/1.1`), without its query, and
/// without the trailing `/` some clients add.
fn request_path(head: &[u8]) -> Option<&str> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let target = line.split(' ').nth(1)?;
    let path = target.split('?').next()?;
    Some(path.strip_suffix('/').unwrap_or(path))
}

/// A stream whose first bytes were read ahead: they are read again first.
struct Rewound {
    head: Vec<u8>,
    read: usize,
    io: BoxIo,
}

impl AsyncRead for Rewound {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.read < self.head.len() {
            let rest = &self.head[self.read..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            self.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn the_read_ahead_bytes_are_read_again() {
        for (sent, expected) in [
            (&b"AMQP\x00\x01\x00\x00"[..], Opening::Amqp),
            (
                &b"GET /$servicebus/websocket HTTP/1.1\r\n"[..],
                Opening::WebSocket,
            ),
            (
                &b"GET /$servicebus/websocket/ HTTP/1.1\r\n"[..],
                Opening::WebSocket,
            ),
            (
                &b"GET /orders?api-version=2021-05 HTTP/1.1\r\nHost: x\r\n\r\n"[..],
                Opening::Http,
            ),
            (&b"PUT /q HTTP/1.1\r\n"[..], Opening::Http),
        ] {
            let (client, server) = tokio::io::duplex(64);
            let mut client = client;
            client.write_all(sent).await.unwrap();
            drop(client);
            let (opening, mut io) = sniff(Box::new(server), "/$servicebus/websocket")
                .await
                .unwrap();
            assert_eq!(opening, expected);
            let mut all = Vec::new();
            io.read_to_end(&mut all).await.unwrap();
            assert_eq!(all, sent);
        }
    }
}
