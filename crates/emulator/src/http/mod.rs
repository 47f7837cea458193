//! The HTTP management API (Service Bus's "management REST API": Atom entries under
//! `https://<namespace>/<entity>?api-version=2021-05`), served on the TLS listener beside
//! `amqps` and `wss`, and in plain HTTP on `--http-listen` for tests.
//!
//! # Layout
//! - this file: the HTTP/1.1 connection loop (keep-alive, `Content-Length` or chunked bodies)
//!   and [`Host`], what the loop asks of the server that runs it.
//! - `route`: which resource a path names ([`route::Route`]).
//! - `auth`: the `Authorization` header (SAS or Entra token), Manage required.
//! - `api`: the operations: get, list, create, update, delete of queues, topics,
//!   subscriptions and rules, with the service's status codes.
//! - `atom`: rendering and reading the Atom/XML bodies.
//! - `xml`: a small XML tree for request bodies.

mod api;
mod atom;
mod auth;
mod route;
mod xml;

use std::sync::Arc;

use sb_amqp::BoxIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::{Broker, Rights};

/// The largest request head and body accepted (the service caps entity descriptions far
/// below this).
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 1024 * 1024;

/// One parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// The request target: path and query.
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    /// The first header named `name` (case-insensitive).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An answer: status, content type and body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) body: String,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        _ => "Error",
    }
}

/// What the management API asks of the server that serves it: the keys that may call it and
/// the faults an operator injected. The server implements it; this module names no server
/// module, since the server's listeners sit above the protocols they serve (issue 46).
pub(crate) trait Host: Send + Sync {
    /// The key named `name` and its rights (the root key has every right).
    fn key(&self, name: &str) -> Option<(&str, Rights)>;
    /// Whether Entra ID tokens (`Bearer <jwt>`) are accepted without validation
    /// (`--accept-jwt`).
    fn accepts_jwt(&self) -> bool;
    /// How to answer the next request instead of handling it, when a fault was injected
    /// ([`crate::Emulator::fail_management_requests`]).
    fn injected_fault(&self) -> Option<Injected>;
}

/// The keys of the options and no injected fault: what the unit tests serve with.
#[cfg(test)]
impl Host for crate::server::EmulatorOptions {
    fn key(&self, name: &str) -> Option<(&str, Rights)> {
        crate::server::EmulatorOptions::key(self, name)
    }

    fn accepts_jwt(&self) -> bool {
        self.accept_jwt
    }

    fn injected_fault(&self) -> Option<Injected> {
        None
    }
}

/// An injected answer that replaces handling a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Injected {
    /// Answer this status, unhandled.
    Status(u16),
    /// Never answer: hold the connection until the client closes it.
    Stall,
}

/// Why a connection stopped.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("bad request: {0}")]
    Bad(String),
}

/// Serves management requests on one connection until the client closes it.
pub(crate) async fn serve(io: BoxIo, broker: Broker, host: Arc<dyn Host>) {
    let (read, mut write) = tokio::io::split(io);
    let mut reader = BufReader::new(read);
    loop {
        let request = match read_request(&mut reader).await {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(ReadError::Bad(detail)) => {
                let response = Response {
                    status: 400,
                    content_type: api::XML,
                    body: atom::error(400, &detail),
                };
                // The connection ends next either way; a client that went away cannot be told.
                let _ = write_response(&mut write, &response, true).await;
                return;
            }
            Err(ReadError::Io(error)) => {
                tracing::debug!(%error, "Management connection ended.");
                return;
            }
        };
        let close = request
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        let response = match host.injected_fault() {
            None => api::handle(&request, &broker, host.as_ref()),
            Some(Injected::Status(status)) => Response {
                status,
                content_type: api::XML,
                body: atom::error(
                    status,
                    "Injected by the emulator (fail_management_requests).",
                ),
            },
            Some(Injected::Stall) => {
                // Stalled: nothing is answered; the client's close (EOF) ends it.
                tracing::debug!(target = %request.target, "Management request stalled (injected).");
                let mut rest = Vec::new();
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut rest).await;
                return;
            }
        };
        tracing::debug!(method = %request.method, target = %request.target, status = response.status, "Management request.");
        if write_response(&mut write, &response, close).await.is_err() || close {
            return;
        }
    }
}

async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
) -> Result<Option<Request>, ReadError> {
    let mut head = Vec::new();
    loop {
        let n = reader.read_until(b'\n', &mut head).await?;
        if n == 0 {
            if head.is_empty() {
                return Ok(None);
            }
            return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            break;
        }
        if head.len() > MAX_HEAD {
            return Err(ReadError::Bad("request head too large".into()));
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(ReadError::Bad("incomplete head".into())),
        Err(e) => return Err(ReadError::Bad(e.to_string())),
    }
    let method = parsed.method.unwrap_or_default().to_owned();
    let target = parsed.path.unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        read_chunked(reader).await?
    } else {
        let length: usize = match find("content-length") {
            Some(v) => v
                .parse()
                .map_err(|_| ReadError::Bad("bad Content-Length".into()))?,
            None => 0,
        };
        if length > MAX_BODY {
            return Err(ReadError::Bad("request body too large".into()));
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).await?;
        body
    };
    Ok(Some(Request {
        method,
        target,
        headers,
        body,
    }))
}

async fn read_chunked<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| ReadError::Bad("bad chunk size".into()))?;
        if body.len() + size > MAX_BODY {
            return Err(ReadError::Bad("request body too large".into()));
        }
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                let mut trailer = String::new();
                let n = reader.read_line(&mut trailer).await?;
                if n == 0 || trailer.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).await?;
        let mut crlf = String::new();
        reader.read_line(&mut crlf).await?;
    }
}

async fn write_response<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    response: &Response,
    close: bool,
) -> std::io::Result<()> {
    let body = if response.body.is_empty() {
        String::new()
    } else {
        format!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?>{}",
            response.body
        )
    };
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nServer: sb-emulator\r\n{}\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    );
    write.write_all(head.as_bytes()).await?;
    write.write_all(body.as_bytes()).await?;
    write.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_length_and_chunked_bodies() {
        let raw = b"PUT /q?api-version=2021-05 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /q HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let mut reader = BufReader::new(&raw[..]);
        let first = read_request(&mut reader).await.unwrap().unwrap();
        assert_eq!(
            (
                first.method.as_str(),
                first.target.as_str(),
                &first.body[..]
            ),
            ("PUT", "/q?api-version=2021-05", &b"hello"[..])
        );
        let second = read_request(&mut reader).await.unwrap().unwrap();
        assert_eq!(second.body, b"abcde");
        assert!(read_request(&mut reader).await.unwrap().is_none());
    }
}
