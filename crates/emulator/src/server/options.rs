//! [`EmulatorOptions`]: how an emulator serves (keys, strictness, faults, listeners), and the
//! service's limits it announces.

use std::time::Duration;

use super::{Fault, FaultSpec};
use crate::{Rights, SharedAccessPolicy};

/// The key name the emulator's connection string uses, as Microsoft's emulator does.
pub const KEY_NAME: &str = "RootManageSharedAccessKey";
/// The key the emulator's connection string uses, as Microsoft's emulator does.
pub const KEY: &str = "SAS_KEY_VALUE";

/// The service's `open`: max-frame-size 65536, channel-max 4999, idle-time-out 120000 ms, as
/// Service Bus answers (an `Open` received from the service, azure-sdk-for-java issue 31966:
/// `maxFrameSize=65536, channelMax=4999, idleTimeOut=120000`).
pub const SERVICE_MAX_FRAME_SIZE: u32 = 65_536;
/// See [`SERVICE_MAX_FRAME_SIZE`].
pub const SERVICE_CHANNEL_MAX: u16 = 4_999;
/// See [`SERVICE_MAX_FRAME_SIZE`]; a connection silent for longer is closed.
pub const SERVICE_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Service Bus force-detaches a link without transfers, flows or dispositions for 10 minutes
/// ("AmqpMessageConsumer.IdleTimerExpired: Idle timeout: 00:10:00").
pub const DEFAULT_LINK_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// How an [`Emulator`](crate::Emulator) serves. Strict by default, like the service: idle links are
/// force-detached after [`DEFAULT_LINK_IDLE_TIMEOUT`], links are detached when their token
/// expires, message locks are dropped with the connection that received them, and `open`
/// carries the service's limits.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_emulator::{EmulatorOptions, Fault};
/// let options = EmulatorOptions::default()
///     .with_link_idle_timeout(Duration::from_secs(3))
///     .with_max_token_lifetime(Duration::from_secs(10))
///     .with_fault(Fault::BusySettle, 0.02)
///     .with_fault_seed(7);
/// assert_eq!(options.link_idle_timeout, Some(Duration::from_secs(3)));
/// ```
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Address to bind, e.g. `127.0.0.1:0` for an ephemeral port.
    pub listen: String,
    /// The shared access key name tokens must be signed with.
    pub key_name: String,
    /// The shared access key.
    pub key: String,
    /// Accept JWTs on `$cbs` without validating them (Entra ID clients in development).
    pub accept_jwt: bool,
    /// Entity links idle this long are force-detached (`None`: never; the service has no such
    /// switch).
    pub link_idle_timeout: Option<Duration>,
    /// Caps how long a put token is honoured, whatever its own expiry.
    pub max_token_lifetime: Option<Duration>,
    /// Faults drawn per operation.
    pub faults: Vec<FaultSpec>,
    /// Seed of the fault draws; `None` picks one (logged) at start.
    pub fault_seed: Option<u64>,
    /// Also serve AMQP over WebSockets (plain `ws`, path `/$servicebus/websocket`,
    /// subprotocol `AMQPWSB10`) on this address.
    pub websocket_listen: Option<String>,
    /// Also serve AMQP over TLS (`amqps`) and over secure WebSockets (`wss`) on one address,
    /// with a generated or given certificate (`--tls-listen`).
    pub tls_listen: Option<super::TlsListen>,
    /// Also serve the HTTP management API in plain HTTP on this address (`--http-listen`;
    /// the TLS listener serves it over HTTPS in any case).
    pub http_listen: Option<String>,
    /// Keys beside the root key ([`EmulatorOptions::key_name`], all rights), each with its
    /// rights (`SharedAccessPolicies` in `Config.json`).
    pub policies: Vec<SharedAccessPolicy>,
    /// One-way network delay: every connection's bytes are read and written this much later,
    /// in order, on every listener (zero: none).
    pub latency: Duration,
    /// `--throttle SECS`: throttle the namespace this long from the first settlement attempt
    /// (see [`crate::Emulator::throttle`]).
    pub throttle: Option<Duration>,
    // Link-level service behaviours (issue 29): attach latency, message locks on connection
    // loss.
    /// Answer each entity attach this late (`--attach-delay MS`); zero: at once.
    pub attach_delay: Duration,
    /// Keep the message locks of a connection that ended until they expire, instead of
    /// dropping them as the service does (`--keep-locks-on-connection-loss`).
    pub keep_locks_on_connection_loss: bool,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            listen: "127.0.0.1:0".into(),
            key_name: KEY_NAME.into(),
            key: KEY.into(),
            accept_jwt: false,
            link_idle_timeout: Some(DEFAULT_LINK_IDLE_TIMEOUT),
            max_token_lifetime: None,
            faults: Vec::new(),
            fault_seed: None,
            websocket_listen: None,
            tls_listen: None,
            http_listen: None,
            policies: Vec::new(),
            latency: Duration::ZERO,
            throttle: None,
            attach_delay: Duration::ZERO,
            keep_locks_on_connection_loss: false,
        }
    }
}

impl EmulatorOptions {
    /// Force-detaches entity links idle for `timeout` (`Duration::ZERO` turns it off).
    #[must_use]
    pub fn with_link_idle_timeout(mut self, timeout: Duration) -> Self {
        self.link_idle_timeout = (!timeout.is_zero()).then_some(timeout);
        self
    }

    /// Honours no token for longer than `lifetime` after it was put.
    #[must_use]
    pub fn with_max_token_lifetime(mut self, lifetime: Duration) -> Self {
        self.max_token_lifetime = Some(lifetime);
        self
    }

    /// Injects `fault` with `probability` per operation (replacing an earlier setting).
    #[must_use]
    pub fn with_fault(mut self, fault: Fault, probability: f64) -> Self {
        self.faults.retain(|f| f.fault != fault);
        self.faults.push(FaultSpec { fault, probability });
        self
    }

    /// Seeds the fault draws, so a run can be replayed.
    #[must_use]
    pub fn with_fault_seed(mut self, seed: u64) -> Self {
        self.fault_seed = Some(seed);
        self
    }

    /// Throttles the namespace for `duration` from the first settlement attempt: every
    /// settlement, send and `$management` request meanwhile is answered server-busy.
    #[must_use]
    pub fn with_throttle(mut self, duration: Duration) -> Self {
        self.throttle = Some(duration);
        self
    }

    /// Binds `addr` (e.g. `127.0.0.1:0`).
    #[must_use]
    pub fn with_listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// Accepts tokens signed with `policy`'s key, with its rights only.
    #[must_use]
    pub fn with_policy(mut self, policy: SharedAccessPolicy) -> Self {
        self.policies.push(policy);
        self
    }

    /// The key named `name` and its rights: the root key has every right.
    pub(crate) fn key(&self, name: &str) -> Option<(&str, Rights)> {
        if name == self.key_name {
            return Some((&self.key, Rights::ALL));
        }
        self.policies
            .iter()
            .find(|p| p.name == name)
            .map(|p| (p.key.as_str(), p.rights))
    }

    /// Puts the broker `one_way` away: each connection's bytes are read and written that much
    /// later, in order (a round trip costs twice `one_way`). Zero turns it off.
    #[must_use]
    pub fn with_latency(mut self, one_way: Duration) -> Self {
        self.latency = one_way;
        self
    }

    /// Answers each entity attach `delay` late. The service's attaches are not instant: a
    /// link on an entity being moved between broker nodes, or a session accept (.NET waits
    /// up to its 60 s try timeout, `ServiceBusRetryOptions.TryTimeout`), can take seconds; a
    /// client that gives up meanwhile still gets the answer later, and must detach the link
    /// it no longer wants (else a session lock stays held by no one).
    #[must_use]
    pub fn with_attach_delay(mut self, delay: Duration) -> Self {
        self.attach_delay = delay;
        self
    }

    /// Keeps the locks of messages delivered on a connection that ended until they expire.
    /// The service drops them at once ("If the reason is a broken network connection, the lock
    /// is dropped since Service Bus doesn't support recovery of existing AMQP links on a
    /// different connection", Microsoft Learn, "Message transfers, locks, and settlement"), and
    /// so does the emulator by default; this is for tests of what a kept lock allows.
    #[must_use]
    pub fn with_locks_kept_on_connection_loss(mut self) -> Self {
        self.keep_locks_on_connection_loss = true;
        self
    }

    /// Also serves AMQP over WebSockets (plain `ws`) on `addr`.
    #[must_use]
    pub fn with_websocket_listen(mut self, addr: impl Into<String>) -> Self {
        self.websocket_listen = Some(addr.into());
        self
    }

    /// Also serves the HTTP management API in plain HTTP on `addr`
    /// ([`EmulatorOptions::http_listen`]).
    #[must_use]
    pub fn with_http_listen(mut self, addr: impl Into<String>) -> Self {
        self.http_listen = Some(addr.into());
        self
    }

    /// Also serves `amqps`, `wss` and the HTTPS management API on `addr`, with `identity`'s
    /// certificate ([`EmulatorOptions::tls_listen`]).
    #[must_use]
    pub fn with_tls_listen(
        mut self,
        addr: impl Into<String>,
        identity: super::TlsIdentity,
    ) -> Self {
        self.tls_listen = Some(super::TlsListen {
            addr: addr.into(),
            identity,
        });
        self
    }
}
