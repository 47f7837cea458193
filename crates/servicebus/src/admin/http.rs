//! A small HTTP/1.1 client for the management API: one request per connection
//! (`Connection: close`), over TLS (tokio-rustls on the client's trust roots) or, for the
//! emulator's plain listener, over TCP, directly or through an HTTP proxy's `CONNECT` tunnel.
//! Bodies by `Content-Length`, chunked, or to the end. Every step is bounded: the connect by
//! [`Transport::connect_timeout`], the tunnel, TLS handshake, request and response together by
//! [`Transport::timeout`] (Azure.Core's per-try `RetryOptions.NetworkTimeout`).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::AdminError;

/// The largest response read (a page of 100 entity descriptions is far below it).
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// Where requests go: scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub(super) tls: bool,
    pub(super) host: String,
    pub(super) port: u16,
}

/// A response: status, `Retry-After` and body.
#[derive(Debug)]
pub(super) struct HttpResponse {
    pub(super) status: u16,
    /// `Retry-After` (seconds), or `retry-after-ms` / `x-ms-retry-after-ms`, as Azure.Core's
    /// retry policy reads them.
    pub(super) retry_after: Option<Duration>,
    pub(super) body: String,
}

/// How requests reach the endpoint.
#[derive(Debug, Clone)]
pub(super) struct Transport {
    pub(super) tls: Option<Arc<rustls::ClientConfig>>,
    /// The `CONNECT` proxy, already matched against `NO_PROXY` for the endpoint's host.
    pub(super) proxy: Option<sb_amqp::HttpProxy>,
    pub(super) connect_timeout: Duration,
    pub(super) timeout: Duration,
}

/// Sends one request and reads the whole response, within the transport's bounds.
pub(super) async fn send(
    endpoint: &Endpoint,
    transport: &Transport,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
) -> Result<HttpResponse, AdminError> {
    let name = format!("{}:{}", endpoint.host, endpoint.port);
    let (to, to_name) = match &transport.proxy {
        Some(proxy) => (
            (proxy.host.as_str(), proxy.port),
            format!("{}:{}", proxy.host, proxy.port),
        ),
        None => ((endpoint.host.as_str(), endpoint.port), name.clone()),
    };
    let tcp = match tokio::time::timeout(transport.connect_timeout, TcpStream::connect(to)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(source)) => {
            return Err(AdminError::Connect {
                endpoint: to_name,
                source,
            });
        }
        Err(_) => {
            return Err(AdminError::Timeout {
                endpoint: to_name,
                what: "connect",
                after: transport.connect_timeout,
            });
        }
    };
    let exchanged = tokio::time::timeout(
        transport.timeout,
        exchange_over(tcp, endpoint, transport, method, target, headers, body),
    )
    .await;
    match exchanged {
        Ok(raw) => parse_response(&raw?),
        Err(_) => Err(AdminError::Timeout {
            endpoint: name,
            what: "answer",
            after: transport.timeout,
        }),
    }
}

/// Tunnels (through a proxy), shakes hands (TLS) and exchanges the request on `tcp`.
async fn exchange_over(
    mut tcp: TcpStream,
    endpoint: &Endpoint,
    transport: &Transport,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
) -> Result<Vec<u8>, AdminError> {
    if let Some(proxy) = &transport.proxy {
        tunnel(&mut tcp, proxy, endpoint).await?;
    }
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\nUser-Agent: sb-servicebus\r\n",
        endpoint.host, endpoint.port
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or_default();
    if !body.is_empty() || method == "PUT" {
        head.push_str("Content-Type: application/atom+xml;type=entry;charset=utf-8\r\n");
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    if endpoint.tls {
        let config = transport.tls.clone().ok_or(AdminError::NoTrust)?;
        let name = ServerName::try_from(endpoint.host.clone())
            .map_err(|e| AdminError::Tls(std::io::Error::other(e)))?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(AdminError::Tls)?;
        exchange(stream, &head, body).await
    } else {
        exchange(tcp, &head, body).await
    }
}

/// The largest proxy response head read before giving up on it.
const MAX_PROXY_HEAD: usize = 8 * 1024;

/// Asks `proxy` (connected on `tcp`) for a tunnel to the endpoint, with its credentials.
async fn tunnel(
    tcp: &mut TcpStream,
    proxy: &sb_amqp::HttpProxy,
    endpoint: &Endpoint,
) -> Result<(), AdminError> {
    let authority = if endpoint.host.contains(':') {
        format!("[{}]:{}", endpoint.host, endpoint.port)
    } else {
        format!("{}:{}", endpoint.host, endpoint.port)
    };
    let credentials = proxy
        .authorization
        .as_ref()
        .map(|value| format!("Proxy-Authorization: {value}\r\n"))
        .unwrap_or_default();
    let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{credentials}\r\n");
    tcp.write_all(request.as_bytes())
        .await
        .map_err(AdminError::Io)?;
    // Byte by byte up to the blank line: what follows is the tunnelled server's.
    let mut head = Vec::with_capacity(128);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_PROXY_HEAD {
            return Err(AdminError::Proxy(format!(
                "{}:{}: response head longer than {MAX_PROXY_HEAD} bytes",
                proxy.host, proxy.port
            )));
        }
        head.push(tcp.read_u8().await.map_err(AdminError::Io)?);
    }
    let head = String::from_utf8_lossy(&head);
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line.split_whitespace().nth(1);
    if !status_line.starts_with("HTTP/1.") || status.is_none_or(|s| !s.starts_with('2')) {
        return Err(AdminError::Proxy(format!(
            "{}:{} refused CONNECT {authority}: {status_line}",
            proxy.host, proxy.port
        )));
    }
    Ok(())
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    head: &str,
    body: &str,
) -> Result<Vec<u8>, AdminError> {
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(AdminError::Io)?;
    stream
        .write_all(body.as_bytes())
        .await
        .map_err(AdminError::Io)?;
    stream.flush().await.map_err(AdminError::Io)?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&chunk[..n]);
                if raw.len() > MAX_RESPONSE {
                    return Err(AdminError::Malformed("response too large".into()));
                }
            }
            // A server that closes without TLS close_notify still sent everything before.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => break,
            Err(e) => return Err(AdminError::Io(e)),
        }
    }
    Ok(raw)
}

/// Splits a whole HTTP/1.1 response into status and body.
pub(super) fn parse_response(raw: &[u8]) -> Result<HttpResponse, AdminError> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| AdminError::Malformed("no end of the response head".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| AdminError::Malformed("no status line".into()))?;
    let mut length = None;
    let mut chunked = false;
    let mut retry_after = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("retry-after-ms")
                || name.eq_ignore_ascii_case("x-ms-retry-after-ms")
            {
                retry_after = value
                    .parse()
                    .ok()
                    .map(Duration::from_millis)
                    .or(retry_after);
            } else if name.eq_ignore_ascii_case("retry-after") && retry_after.is_none() {
                // Seconds; an HTTP date is not read (the backoff applies instead).
                retry_after = value.parse().ok().map(Duration::from_secs);
            } else if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding")
                && value.eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else {
        match length {
            Some(n) if n <= rest.len() => rest[..n].to_vec(),
            Some(_) => return Err(AdminError::Malformed("response body cut short".into())),
            None => rest.to_vec(),
        }
    };
    Ok(HttpResponse {
        status,
        retry_after,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, AdminError> {
    let bad = || AdminError::Malformed("bad chunked body".into());
    let mut out = Vec::new();
    loop {
        let end = rest.windows(2).position(|w| w == b"\r\n").ok_or_else(bad)?;
        let size_text = String::from_utf8_lossy(&rest[..end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad())?;
        rest = &rest[end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err(bad());
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_length_chunked_and_to_the_end_bodies() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcdef").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "abc"));
        let r = parse_response(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (201, "abc"));
        let r = parse_response(b"HTTP/1.1 404 Not Found\r\n\r\n<Error/>").unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "<Error/>"));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc").is_err());
        assert!(parse_response(b"garbage").is_err());
        let r = parse_response(b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\n\r\n").unwrap();
        assert_eq!(r.retry_after, Some(Duration::from_secs(7)));
        let r = parse_response(
            b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nx-ms-retry-after-ms: 250\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.retry_after, Some(Duration::from_millis(250)));
    }
}
