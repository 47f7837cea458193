//! [`ServerConnection`]: an accepted connection and the [`ConnectionEvent`]s its client
//! causes.

use tokio::sync::mpsc;

use super::link_request::LinkRequest;
use crate::core::Connection;
use crate::core::link::PeerAttach;
use crate::performative::Open;
use crate::sasl::SaslIdentity;

/// Something a client did that the application answers.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// The client attached a link.
    Link(LinkRequest),
}

/// A connection accepted by the server.
#[derive(Debug)]
pub struct ServerConnection {
    conn: Connection,
    peer_links: mpsc::UnboundedReceiver<PeerAttach>,
    identity: SaslIdentity,
}

impl ServerConnection {
    pub(super) fn new(
        conn: Connection,
        peer_links: mpsc::UnboundedReceiver<PeerAttach>,
        identity: SaslIdentity,
    ) -> Self {
        Self {
            conn,
            peer_links,
            identity,
        }
    }

    /// The connection handle (close it, watch it, begin server-initiated sessions).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The client's `open`.
    pub fn remote_open(&self) -> &Open {
        self.conn.remote_open()
    }

    /// What the client presented in SASL.
    pub fn sasl_identity(&self) -> &SaslIdentity {
        &self.identity
    }

    /// Next event; `None` once the connection ended.
    pub async fn next_event(&mut self) -> Option<ConnectionEvent> {
        let peer = self.peer_links.recv().await?;
        Some(ConnectionEvent::Link(LinkRequest::new(peer)))
    }
}
