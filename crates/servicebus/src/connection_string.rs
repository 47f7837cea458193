//! [`ConnectionString`]: parsing and printing (without secrets) Service Bus connection strings.

use std::fmt;

/// Why a connection string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionStringError {
    /// The n-th `;`-separated part (from 1) has no `=`. The part itself is not shown: it may
    /// hold a key.
    #[error("connection string part {0} is not key=value")]
    Malformed(usize),
    /// `Endpoint` is missing.
    #[error("connection string has no Endpoint")]
    MissingEndpoint,
    /// `Endpoint` is not `sb://host[:port][/]`.
    #[error("Endpoint {0:?} is not sb://HOST[:PORT]/")]
    InvalidEndpoint(String),
    /// Neither a key (name + key) nor a shared access signature.
    #[error(
        "connection string needs SharedAccessKeyName and SharedAccessKey, or SharedAccessSignature"
    )]
    MissingCredential,
    /// A key name without a key, or the other way round.
    #[error("SharedAccessKeyName and SharedAccessKey must be given together")]
    IncompleteKey,
    /// An unknown key (a typo would otherwise be ignored).
    #[error("unknown connection string key {0:?}")]
    UnknownKey(String),
    /// `TransportType` is neither `Amqp` nor `AmqpWebSockets`.
    #[error("TransportType {0:?} is not Amqp or AmqpWebSockets")]
    InvalidTransport(String),
}

/// How the AMQP connection travels: TCP (port 5671 with TLS), or WebSockets
/// (`wss://HOST:443/$servicebus/websocket`, subprotocol `AMQPWSB10`) for networks that block
/// 5671, as every official SDK offers (`TransportType.AmqpOverWebsocket` in Python, `AmqpWebSockets` in .NET
/// connection strings and `ServiceBusTransportType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Transport {
    /// AMQP over TCP.
    #[default]
    Amqp,
    /// AMQP over WebSockets.
    AmqpWebSockets,
}

impl Transport {
    /// The URL of `host` over this transport: `amqps://HOST:5671`,
    /// `wss://HOST:443/$servicebus/websocket`, or without TLS (the emulator) `amqp://` / `ws://`.
    pub fn url(self, host: &str, port: Option<u16>, tls: bool) -> String {
        match (self, tls) {
            (Transport::Amqp, true) => format!("amqps://{host}:{}", port.unwrap_or(5671)),
            (Transport::Amqp, false) => format!("amqp://{host}:{}", port.unwrap_or(5672)),
            (Transport::AmqpWebSockets, true) => {
                format!("wss://{host}:{}/$servicebus/websocket", port.unwrap_or(443))
            }
            (Transport::AmqpWebSockets, false) => {
                format!("ws://{host}:{}/$servicebus/websocket", port.unwrap_or(80))
            }
        }
    }
}

impl std::str::FromStr for Transport {
    type Err = ConnectionStringError;

    /// `Amqp` or `AmqpWebSockets` (case-insensitive; `websockets` too, for config files).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "amqp" => Ok(Transport::Amqp),
            "amqpwebsockets" | "websockets" => Ok(Transport::AmqpWebSockets),
            _ => Err(ConnectionStringError::InvalidTransport(s.to_owned())),
        }
    }
}

/// How a client authenticates on `$cbs`.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A shared access key: tokens are signed per audience.
    Key {
        /// `SharedAccessKeyName`.
        name: String,
        /// `SharedAccessKey` (never printed).
        key: String,
    },
    /// A ready-made `SharedAccessSignature …` token (never printed).
    Signature(String),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Key { name, .. } => write!(f, "Key {{ name: {name:?}, key: *** }}"),
            Credential::Signature(_) => f.write_str("Signature(***)"),
        }
    }
}

/// A Service Bus connection string as the Azure portal and the emulators write it.
///
/// Keys are matched case-insensitively. `Debug` and `Display` never show the key or signature.
///
/// # Examples
/// ```
/// use sb_servicebus::ConnectionString;
/// let cs: ConnectionString = "Endpoint=sb://127.0.0.1:5699;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;".parse()?;
/// assert_eq!((cs.host(), cs.port(), cs.use_tls()), ("127.0.0.1", 5699, false));
/// assert!(!cs.to_string().contains("SAS_KEY_VALUE"));
/// # Ok::<(), sb_servicebus::ConnectionStringError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionString {
    host: String,
    port: Option<u16>,
    credential: Credential,
    entity_path: Option<String>,
    emulator: bool,
    transport: Transport,
}

impl ConnectionString {
    /// The namespace host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port: the one given, else 5671 (TLS) or 5672 (emulator, plain AMQP); over
    /// WebSockets 443 (TLS) or 80.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(match (self.transport, self.emulator) {
            (Transport::Amqp, true) => 5672,
            (Transport::Amqp, false) => 5671,
            (_, true) => 80,
            (_, false) => 443,
        })
    }

    /// The port the `Endpoint` names, if it names one (the emulator's TLS listener serves the
    /// management API on it; the service serves it on 443).
    pub fn explicit_port(&self) -> Option<u16> {
        self.port
    }

    /// `TransportType` (default `Amqp`).
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The same namespace over `transport` (a worker's `servicebus.transport` setting).
    #[must_use]
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// False only with `UseDevelopmentEmulator=true`.
    pub fn use_tls(&self) -> bool {
        !self.emulator
    }

    /// The credential.
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// `EntityPath`, when the string is scoped to one entity.
    pub fn entity_path(&self) -> Option<&str> {
        self.entity_path.as_deref()
    }

    /// The AMQP URL of the namespace (no credentials): `amqps://`, or
    /// `wss://…/$servicebus/websocket` over WebSockets; `amqp://` / `ws://` for the emulator.
    pub fn amqp_url(&self) -> String {
        self.transport
            .url(&self.host, Some(self.port()), self.use_tls())
    }

    /// The token audience for an entity: `sb://HOST/ENTITY`.
    pub fn audience(&self, entity: &str) -> String {
        format!("sb://{}/{}", self.host, entity.trim_start_matches('/'))
    }
}

impl std::str::FromStr for ConnectionString {
    type Err = ConnectionStringError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut endpoint = None;
        let (mut key_name, mut key, mut signature, mut entity_path) = (None, None, None, None);
        let mut emulator = false;
        let mut transport = Transport::Amqp;
        for (index, part) in text.split(';').map(str::trim).enumerate() {
            if part.is_empty() {
                continue;
            }
            let (name, value) = part
                .split_once('=')
                .ok_or(ConnectionStringError::Malformed(index + 1))?;
            let value = value.trim().to_owned();
            match name.trim().to_ascii_lowercase().as_str() {
                "endpoint" => endpoint = Some(value),
                "sharedaccesskeyname" => key_name = Some(value),
                "sharedaccesskey" => key = Some(value),
                "sharedaccesssignature" => signature = Some(value),
                "entitypath" => entity_path = Some(value),
                "usedevelopmentemulator" => emulator = value.eq_ignore_ascii_case("true"),
                "transporttype" => transport = value.parse()?,
                other => return Err(ConnectionStringError::UnknownKey(other.to_owned())),
            }
        }
        let endpoint = endpoint.ok_or(ConnectionStringError::MissingEndpoint)?;
        let rest = endpoint
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("sb"))
            .map(|(_, rest)| rest.trim_end_matches('/'))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .ok_or_else(|| ConnectionStringError::InvalidEndpoint(endpoint.clone()))?;
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => {
                let port = port
                    .parse()
                    .map_err(|_| ConnectionStringError::InvalidEndpoint(endpoint.clone()))?;
                (host.to_owned(), Some(port))
            }
            None => (rest.to_owned(), None),
        };
        let credential = match (key_name, key, signature) {
            (_, _, Some(signature)) => Credential::Signature(signature),
            (Some(name), Some(key), None) => Credential::Key { name, key },
            (None, None, None) => return Err(ConnectionStringError::MissingCredential),
            _ => return Err(ConnectionStringError::IncompleteKey),
        };
        Ok(ConnectionString {
            host,
            port,
            credential,
            entity_path,
            emulator,
            transport,
        })
    }
}

impl fmt::Display for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint=sb://{}:{}/;", self.host, self.port())?;
        match &self.credential {
            Credential::Key { name, .. } => {
                write!(f, "SharedAccessKeyName={name};SharedAccessKey=***;")?
            }
            Credential::Signature(_) => f.write_str("SharedAccessSignature=***;")?,
        }
        if let Some(entity) = &self.entity_path {
            write!(f, "EntityPath={entity};")?;
        }
        if self.emulator {
            f.write_str("UseDevelopmentEmulator=true;")?;
        }
        if self.transport == Transport::AmqpWebSockets {
            f.write_str("TransportType=AmqpWebSockets;")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_portal_form() {
        let cs: ConnectionString = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=abc=;EntityPath=orders"
            .parse()
            .unwrap();
        assert_eq!(
            (cs.host(), cs.port(), cs.use_tls()),
            ("ns.servicebus.windows.net", 5671, true)
        );
        assert_eq!(cs.entity_path(), Some("orders"));
        assert_eq!(
            cs.credential(),
            &Credential::Key {
                name: "listen".into(),
                key: "abc=".into()
            }
        );
        assert_eq!(cs.amqp_url(), "amqps://ns.servicebus.windows.net:5671");
        assert_eq!(
            cs.audience("orders"),
            "sb://ns.servicebus.windows.net/orders"
        );
    }

    #[test]
    fn emulator_form_keeps_port_and_drops_tls() {
        let cs: ConnectionString =
            "endpoint=sb://localhost;sharedaccesskeyname=k;sharedaccesskey=v;usedevelopmentemulator=TRUE".parse().unwrap();
        assert_eq!((cs.port(), cs.use_tls()), (5672, false));
        assert_eq!(cs.amqp_url(), "amqp://localhost:5672");
    }

    /// The connection string Microsoft's Service Bus emulator documents, verbatim (the emulator's
    /// "Interact with the emulator" section on learn.microsoft.com, and the installer's README):
    /// no port, plain AMQP on 5672, no TLS, the trailing `;` accepted.
    #[test]
    fn microsofts_emulator_connection_string_is_plain_amqp_on_5672() {
        let cs: ConnectionString = "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
            .parse()
            .unwrap();
        assert_eq!(
            (cs.host(), cs.port(), cs.use_tls(), cs.transport()),
            ("localhost", 5672, false, Transport::Amqp)
        );
        assert_eq!(cs.amqp_url(), "amqp://localhost:5672");
        assert_eq!(cs.audience("ext.worker"), "sb://localhost/ext.worker");
        assert_eq!(
            cs.credential(),
            &Credential::Key {
                name: "RootManageSharedAccessKey".into(),
                key: "SAS_KEY_VALUE".into()
            }
        );
        // A remapped port, as the installer's README describes (`EMULATOR_AMQP_PORT=5674`).
        let remapped: ConnectionString = "Endpoint=sb://localhost:5674;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
            .parse()
            .unwrap();
        assert_eq!(remapped.amqp_url(), "amqp://localhost:5674");
        // Only `true` turns TLS off.
        let tls: ConnectionString = "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=false"
            .parse()
            .unwrap();
        assert_eq!((tls.port(), tls.use_tls()), (5671, true));
    }

    #[test]
    fn websocket_transport() {
        let cs: ConnectionString = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v;TransportType=AmqpWebSockets"
            .parse()
            .unwrap();
        assert_eq!(
            (cs.port(), cs.transport()),
            (443, Transport::AmqpWebSockets)
        );
        assert_eq!(
            cs.amqp_url(),
            "wss://ns.servicebus.windows.net:443/$servicebus/websocket"
        );
        assert!(cs.to_string().ends_with("TransportType=AmqpWebSockets;"));
        let emulator: ConnectionString = "Endpoint=sb://127.0.0.1:8080;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;TransportType=AmqpWebSockets;"
            .parse()
            .unwrap();
        assert_eq!(
            emulator.amqp_url(),
            "ws://127.0.0.1:8080/$servicebus/websocket"
        );
        let tcp = emulator.with_transport(Transport::Amqp);
        assert_eq!(tcp.amqp_url(), "amqp://127.0.0.1:8080");
        assert_eq!(
            "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=v;TransportType=Http"
                .parse::<ConnectionString>()
                .unwrap_err(),
            ConnectionStringError::InvalidTransport("Http".into())
        );
    }

    #[test]
    fn signature_form() {
        let cs: ConnectionString =
            "Endpoint=sb://ns/;SharedAccessSignature=SharedAccessSignature sr=x&sig=y&se=1&skn=k"
                .parse()
                .unwrap();
        assert!(
            matches!(cs.credential(), Credential::Signature(s) if s.starts_with("SharedAccessSignature sr="))
        );
        assert!(!format!("{cs:?}").contains("sig=y"));
    }

    #[test]
    fn errors_are_specific_and_secret_free() {
        let cases = [
            (
                "SharedAccessKeyName=k;SharedAccessKey=v",
                ConnectionStringError::MissingEndpoint,
            ),
            (
                "Endpoint=http://ns/;SharedAccessKeyName=k;SharedAccessKey=v",
                ConnectionStringError::InvalidEndpoint("http://ns/".into()),
            ),
            (
                "Endpoint=sb://ns:notaport/;SharedAccessKeyName=k;SharedAccessKey=v",
                ConnectionStringError::InvalidEndpoint("sb://ns:notaport/".into()),
            ),
            (
                "Endpoint=sb://ns/",
                ConnectionStringError::MissingCredential,
            ),
            (
                "Endpoint=sb://ns/;SharedAccessKey=secret",
                ConnectionStringError::IncompleteKey,
            ),
            (
                "Endpoint=sb://ns/;SharedAccesKeyName=k;SharedAccessKey=v",
                ConnectionStringError::UnknownKey("sharedacceskeyname".into()),
            ),
            (
                "Endpoint=sb://ns/;secret",
                ConnectionStringError::Malformed(2),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(
                text.parse::<ConnectionString>().unwrap_err(),
                expected,
                "{text}"
            );
        }
        let cs: ConnectionString =
            "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRET"
                .parse()
                .unwrap();
        assert!(!cs.to_string().contains("TOPSECRET"));
        assert!(!format!("{cs:?}").contains("TOPSECRET"));
    }
}
