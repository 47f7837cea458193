//! The listeners one emulator serves on: AMQP, and optionally plain WebSockets, TLS (`amqps`,
//! `wss` and HTTPS management on one port) and plain HTTP management. All are bound before
//! anything is served, so a start that cannot bind one serves none.

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::PathBuf;

use sb_amqp::{Listener, ServerOptions};
use tokio::net::TcpListener;

use super::{EmulatorOptions, TlsListen, tls};
use crate::Error;

/// Every listener of one emulator, bound and not yet accepting.
pub(super) struct Listeners {
    pub(super) amqp: Listener,
    pub(super) websocket: Option<Listener>,
    /// The TLS listener and the CA file written for a generated certificate.
    pub(super) tls: Option<(Listener, Option<PathBuf>)>,
    pub(super) http: Option<TcpListener>,
}

/// Where the listeners listen, as [`super::Emulator`] reports it.
pub(super) struct Addresses {
    pub(super) amqp: SocketAddr,
    pub(super) websocket: Option<SocketAddr>,
    /// The TLS address and the CA file written for a generated certificate.
    pub(super) tls: Option<(SocketAddr, Option<PathBuf>)>,
    pub(super) http: Option<SocketAddr>,
}

impl Addresses {
    /// No listener: an emulator served only through byte streams.
    pub(super) fn none() -> Addresses {
        Addresses {
            amqp: SocketAddr::from(([0, 0, 0, 0], 0)),
            websocket: None,
            tls: None,
            http: None,
        }
    }
}

impl Listeners {
    /// Binds the listeners `options` asks for.
    ///
    /// # Errors
    /// [`Error::Server`] when an address cannot be bound or the TLS identity cannot be read.
    pub(super) async fn bind(
        options: &EmulatorOptions,
        server: &ServerOptions,
    ) -> Result<Listeners, Error> {
        let amqp = Listener::bind(options.listen.as_str(), server.clone())
            .await
            .map_err(|e| cannot_listen(&options.listen, e))?;
        let websocket = match &options.websocket_listen {
            Some(addr) => Some(bind_websocket(addr, server).await?),
            None => None,
        };
        let tls = match &options.tls_listen {
            Some(tls) => Some(bind_tls(tls, server).await?),
            None => None,
        };
        let http = match &options.http_listen {
            Some(addr) => Some(
                TcpListener::bind(addr.as_str())
                    .await
                    .map_err(|e| cannot_listen(addr, e))?,
            ),
            None => None,
        };
        Ok(Listeners {
            amqp,
            websocket,
            tls,
            http,
        })
    }

    /// The bound addresses (port 0 resolved).
    ///
    /// # Errors
    /// [`Error::Server`] when the system cannot tell a listener's address.
    pub(super) fn addresses(&self) -> Result<Addresses, Error> {
        let local = |l: &Listener| l.local_addr().map_err(|e| Error::Server(e.to_string()));
        Ok(Addresses {
            amqp: local(&self.amqp)?,
            websocket: self.websocket.as_ref().map(local).transpose()?,
            tls: match &self.tls {
                Some((listener, ca)) => Some((local(listener)?, ca.clone())),
                None => None,
            },
            http: self
                .http
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()
                .map_err(|e| Error::Server(e.to_string()))?,
        })
    }
}

fn cannot_listen(addr: &str, error: impl Display) -> Error {
    Error::Server(format!("cannot listen on {addr}: {error}"))
}

async fn bind_websocket(addr: &str, server: &ServerOptions) -> Result<Listener, Error> {
    Listener::bind_websocket(addr, sb_amqp::WEBSOCKET_PATH, server.clone())
        .await
        .map_err(|e| cannot_listen(addr, e))
}

/// One TLS port for `amqps` and `wss` (and HTTPS management): each connection's first bytes
/// after TLS say which.
async fn bind_tls(
    tls: &TlsListen,
    server: &ServerOptions,
) -> Result<(Listener, Option<PathBuf>), Error> {
    let (config, ca) = tls::server_config(&tls.identity)?;
    let options = ServerOptions {
        tls: Some(config),
        ..server.clone()
    };
    let listener =
        Listener::bind_amqp_and_websocket(tls.addr.as_str(), sb_amqp::WEBSOCKET_PATH, options)
            .await
            .map_err(|e| cannot_listen(&tls.addr, e))?;
    Ok((listener, ca))
}
