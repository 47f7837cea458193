//! AMQP over WebSockets: the byte stream of a connection carried in binary WebSocket messages,
//! as the Service Bus SDKs do it (path `/$servicebus/websocket`, subprotocol `AMQPWSB10`: the
//! `AMQP_WS_SUBPROTOCOL` and `"/$servicebus/websocket"` of azure-servicebus `_pyamqp`;
//! port 443 with TLS). Only the handshake comes from `tokio-tungstenite`; TCP and TLS are ours.

/// The WebSocket subprotocol of AMQP 1.0 (OASIS AMQP WebSocket Binding).
pub const SUBPROTOCOL: &str = "AMQPWSB10";
/// The path Service Bus serves AMQP over WebSockets on.
pub const SERVICE_BUS_PATH: &str = "/$servicebus/websocket";

pub(crate) use handshake::{client, server};

/// The handshake on tokio-tungstenite (feature `websockets`).
#[cfg(feature = "websockets")]
mod handshake {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll, ready};

    use bytes::Bytes;
    use futures_util::{Sink, Stream};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::handshake::client::generate_key;
    use tokio_tungstenite::tungstenite::handshake::server::{
        Callback, ErrorResponse, Request, Response,
    };
    use tokio_tungstenite::tungstenite::http;

    use super::SUBPROTOCOL;
    use crate::core::{BoxIo, Io};
    use crate::error::{Error, Result};

    /// A WebSocket as an AMQP byte stream: each write is one binary message, reads concatenate
    /// binary messages; ping/pong are answered by tungstenite, close is end of stream.
    struct WsIo {
        ws: WebSocketStream<BoxIo>,
        pending: Bytes,
    }

    impl AsyncRead for WsIo {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            loop {
                if !self.pending.is_empty() {
                    let n = self.pending.len().min(buf.remaining());
                    buf.put_slice(&self.pending.split_to(n));
                    return Poll::Ready(Ok(()));
                }
                match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                    Some(Ok(Message::Binary(data))) => self.pending = data,
                    Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                    Some(Ok(Message::Text(_))) => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "text WebSocket message on an AMQP connection",
                        )));
                    }
                    Some(Ok(_)) => {} // ping, pong, raw frame
                    Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                }
            }
        }
    }

    impl AsyncWrite for WsIo {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let ws = Pin::new(&mut self.ws);
            ready!(Sink::<Message>::poll_ready(ws, cx)).map_err(io::Error::other)?;
            Pin::new(&mut self.ws)
                .start_send(Message::binary(Bytes::copy_from_slice(buf)))
                .map_err(io::Error::other)?;
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Sink::<Message>::poll_flush(Pin::new(&mut self.ws), cx).map_err(io::Error::other)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Sink::<Message>::poll_close(Pin::new(&mut self.ws), cx).map_err(io::Error::other)
        }
    }

    fn boxed(ws: WebSocketStream<BoxIo>) -> BoxIo {
        Box::new(WsIo {
            ws,
            pending: Bytes::new(),
        })
    }

    /// Client handshake on a connected (TCP or TLS) stream: `GET path` with subprotocol
    /// `AMQPWSB10`; the server must choose it.
    pub(crate) async fn client(
        io: BoxIo,
        tls: bool,
        host: &str,
        port: u16,
        path: &str,
    ) -> Result<BoxIo> {
        let scheme = if tls { "wss" } else { "ws" };
        let request = http::Request::builder()
            .uri(format!("{scheme}://{host}:{port}{path}"))
            .header("Host", format!("{host}:{port}"))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", generate_key())
            .header("Sec-WebSocket-Protocol", SUBPROTOCOL)
            .body(())
            .map_err(|e| Error::InvalidAddress(e.to_string()))?;
        let (ws, response) = tokio_tungstenite::client_async(request, io)
            .await
            .map_err(|e| Error::Protocol(format!("WebSocket handshake failed: {e}")))?;
        let chosen = response
            .headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok());
        if chosen != Some(SUBPROTOCOL) {
            return Err(Error::Protocol(format!(
                "WebSocket server chose subprotocol {chosen:?}, not {SUBPROTOCOL}"
            )));
        }
        Ok(boxed(ws))
    }

    /// Checks a client's upgrade request: the path and the `AMQPWSB10` subprotocol.
    struct Upgrade {
        path: String,
    }

    impl Callback for Upgrade {
        fn on_request(
            self,
            request: &Request,
            mut response: Response,
        ) -> std::result::Result<Response, ErrorResponse> {
            let refuse = |status: http::StatusCode, why: &str| -> ErrorResponse {
                let mut refusal = ErrorResponse::new(Some(why.to_owned()));
                *refusal.status_mut() = status;
                refusal
            };
            if request.uri().path().trim_end_matches('/') != self.path {
                return Err(refuse(
                    http::StatusCode::NOT_FOUND,
                    "AMQP over WebSockets is served on /$servicebus/websocket",
                ));
            }
            let offered = request
                .headers()
                .get_all("Sec-WebSocket-Protocol")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|p| p.trim() == SUBPROTOCOL);
            if !offered {
                return Err(refuse(
                    http::StatusCode::BAD_REQUEST,
                    "the AMQPWSB10 subprotocol is required",
                ));
            }
            response.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                http::HeaderValue::from_static(SUBPROTOCOL),
            );
            Ok(response)
        }
    }

    /// Server handshake: accepts `GET path` (a trailing `/` allowed) offering `AMQPWSB10`, answers
    /// with it; anything else gets 404 or 400 and an error.
    pub(crate) async fn server(io: BoxIo, path: &str) -> Result<BoxIo> {
        let upgrade = Upgrade {
            path: path.trim_end_matches('/').to_owned(),
        };
        let ws = tokio_tungstenite::accept_hdr_async(io, upgrade)
            .await
            .map_err(|e| Error::Protocol(format!("WebSocket handshake failed: {e}")))?;
        Ok(boxed(ws))
    }

    // `WsIo` must satisfy the engine's stream bound.
    const _: fn() = || {
        fn assert_io<T: Io>() {}
        assert_io::<WsIo>();
    };
}

/// Without the `websockets` feature: every WebSocket is refused, naming the feature.
#[cfg(not(feature = "websockets"))]
mod handshake {
    use crate::core::BoxIo;
    use crate::error::{Error, Result};

    /// Why a `ws`/`wss` connection cannot be made or served in this build.
    pub(crate) const NO_FEATURE: &str = "AMQP over WebSockets needs the `websockets` cargo feature (sb-amqp's, or sb-servicebus's or sb-inbox's)";

    pub(crate) async fn client(
        _io: BoxIo,
        _tls: bool,
        _host: &str,
        _port: u16,
        _path: &str,
    ) -> Result<BoxIo> {
        Err(Error::Protocol(NO_FEATURE.to_owned()))
    }

    pub(crate) async fn server(_io: BoxIo, _path: &str) -> Result<BoxIo> {
        Err(Error::Protocol(NO_FEATURE.to_owned()))
    }
}

#[cfg(not(feature = "websockets"))]
pub(crate) use handshake::NO_FEATURE;
