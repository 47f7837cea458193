//! `[servicebus]`: how the worker reaches Service Bus ([`BrokerAddress`]) and the entity the
//! single consumer receives from.

use serde::Deserialize;

use std::time::Duration;

use super::keys::{
    CA_FILE, CONNECTION, ENTITY, NAMESPACE, NATIVE_ROOTS, SERVER_BUSY_WAIT_MS, TRANSPORT,
};
use super::reader::Reader;
use crate::servicebus::{
    ConnectionString, DEFAULT_SERVER_BUSY_WAIT, ProxyConfig, Transport, TrustRoots,
};

/// How the worker reaches Service Bus.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BrokerAddress {
    /// A connection string (SAS key, SAS token, or the emulator).
    Connection(ConnectionString),
    /// A namespace host with Microsoft Entra ID tokens.
    Namespace {
        /// `NAME.servicebus.windows.net`.
        host: String,
        /// A user-assigned managed identity's client id (`AZURE_CLIENT_ID`); `None` for the
        /// system-assigned identity, workload identity or developer tools.
        client_id: Option<String>,
        /// TCP or WebSockets (`servicebus.transport`).
        transport: Transport,
    },
}

/// The `[servicebus]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServiceBusFile {
    connection: Option<String>,
    namespace: Option<String>,
    transport: Option<String>,
    ca_file: Option<String>,
    native_roots: Option<bool>,
    entity: Option<String>,
    server_busy_wait_ms: Option<u64>,
    /// Read with the runtime's session keys (`runtime::sessions`).
    pub(super) sessions: Option<bool>,
}

/// How long the client waits after a busy answer (`servicebus.server_busy_wait_ms`).
pub(super) fn server_busy_wait(r: &mut Reader<'_>, file: &ServiceBusFile) -> Duration {
    r.number(SERVER_BUSY_WAIT_MS, file.server_busy_wait_ms, 0..=600_000)
        .map_or(DEFAULT_SERVER_BUSY_WAIT, Duration::from_millis)
}

/// The broker: a connection string or a namespace (with `AZURE_CLIENT_ID`), one of the two,
/// over a transport this build has.
pub(super) fn address(r: &mut Reader<'_>, file: &ServiceBusFile) -> Option<BrokerAddress> {
    let address = written_address(r, file)?;
    let transport = match &address {
        BrokerAddress::Connection(cs) => cs.transport(),
        BrokerAddress::Namespace { transport, .. } => *transport,
    };
    // Refused now, not at the first connect: the fix is a rebuild, not a retry.
    if transport == Transport::AmqpWebSockets && !cfg!(feature = "websockets") {
        r.fail(
            TRANSPORT,
            "websockets needs sb-inbox's `websockets` cargo feature, which this build lacks",
        );
    }
    Some(address)
}

/// The broker as written, whatever the transport.
fn written_address(r: &mut Reader<'_>, file: &ServiceBusFile) -> Option<BrokerAddress> {
    let connection = r.text(CONNECTION, file.connection.clone());
    let namespace = r.text(NAMESPACE, file.namespace.clone());
    let transport = r.text(TRANSPORT, file.transport.clone()).and_then(|t| {
        t.parse::<Transport>()
            .map_err(|_| r.fail(TRANSPORT, format!("{t:?} is not amqp or websockets")))
            .ok()
    });
    match (connection, namespace) {
        (Some(cs), None) => cs
            .parse::<ConnectionString>()
            .map(|cs| match transport {
                Some(transport) => cs.with_transport(transport),
                None => cs,
            })
            .map(BrokerAddress::Connection)
            .map_err(|e| r.fail(CONNECTION, e.to_string()))
            .ok(),
        (None, Some(ns)) if ns.contains('.') && !ns.contains('/') => {
            Some(BrokerAddress::Namespace {
                host: ns,
                client_id: r.var("AZURE_CLIENT_ID"),
                transport: transport.unwrap_or_default(),
            })
        }
        (None, Some(ns)) => {
            r.fail(
                NAMESPACE,
                format!("{ns:?} is not a host name like NAME.servicebus.windows.net"),
            );
            None
        }
        (Some(_), Some(_)) => {
            r.fail(
                CONNECTION,
                "give a connection string or a namespace, not both",
            );
            None
        }
        (None, None) => {
            r.fail(CONNECTION, "required (or servicebus.namespace)");
            None
        }
    }
}

/// The single consumer's entity: `servicebus.entity`, else the connection string's
/// `EntityPath`; refused beside `[[consumers]]` (`listed`), where each entry names its own.
pub(super) fn entity(
    r: &mut Reader<'_>,
    file: &ServiceBusFile,
    broker: Option<&BrokerAddress>,
    listed: bool,
) -> Option<String> {
    let top = r.text(ENTITY, file.entity.clone());
    if listed && top.is_some() {
        r.fail(
            ENTITY,
            "each [[consumers]] entry names its entity: remove servicebus.entity",
        );
    }
    let entity = top.or_else(|| match broker {
        Some(BrokerAddress::Connection(cs)) if !listed => cs.entity_path().map(str::to_owned),
        _ => None,
    });
    if entity.is_none() && !listed {
        r.fail(
            ENTITY,
            "required (or EntityPath in the connection string, or [[consumers]])",
        );
    }
    entity
}

/// The client's trust roots: Mozilla's, plus `servicebus.ca_file` (else `SSL_CERT_FILE`, the
/// variable OpenSSL and Python's `ssl` read) and the OS store with `servicebus.native_roots`.
/// Read now, so an unreadable bundle is a configuration problem, not a failed connection.
pub(super) fn trust(r: &mut Reader<'_>, file: &ServiceBusFile) -> TrustRoots {
    let mut roots = TrustRoots::new();
    let ca_file = r
        .text(CA_FILE, file.ca_file.clone())
        .or_else(|| r.var("SSL_CERT_FILE"));
    if let Some(path) = ca_file {
        roots = roots.with_ca_file(path);
    }
    if r.flag(NATIVE_ROOTS, file.native_roots) == Some(true) {
        #[cfg(feature = "native-roots")]
        {
            roots = roots.with_native_roots();
        }
        #[cfg(not(feature = "native-roots"))]
        r.fail(
            NATIVE_ROOTS,
            "the OS trust store needs sb-inbox's `native-roots` cargo feature, which this build lacks",
        );
    }
    if let Err(error) = roots.client_config() {
        r.fail(CA_FILE, error.to_string());
    }
    roots
}

/// The HTTP proxy for AMQP over WebSockets: `HTTPS_PROXY` / `https_proxy` and `NO_PROXY` /
/// `no_proxy`, the variables curl and the official SDKs' HTTP stacks read. Read once here, so a
/// malformed proxy is a configuration problem, not a failed connection.
pub(super) fn proxy(r: &mut Reader<'_>) -> ProxyConfig {
    match ProxyConfig::from_env_vars(|name| r.var(name)) {
        Ok(proxy) => proxy,
        Err(error) => {
            r.fail_at("HTTPS_PROXY".to_owned(), error.to_string());
            ProxyConfig::none()
        }
    }
}
