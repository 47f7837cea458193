//! [`Connector`]: how a client reaches its namespace when not over TCP (an in-memory or
//! simulated network), and [`WallClock`]: the host clock its lock arithmetic reads.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use sb_amqp::BoxIo;

/// The future a [`Connector`] returns: a connected byte stream, or why not.
pub type ConnectFuture = Pin<Box<dyn Future<Output = io::Result<BoxIo>> + Send>>;

/// Opens the byte stream a client's AMQP connection runs on, in place of TCP (and TLS,
/// WebSockets, proxies): given the namespace host, it returns any stream, such as one end of
/// [`tokio::io::duplex`] whose other end an emulator serves. The AMQP handshake (SASL, `open`)
/// and everything after it run on that stream as they would on a socket.
///
/// # Examples
/// ```
/// use sb_servicebus::{Connector, ServiceBusClient};
/// let connector = Connector::new(|_host: &str| async {
///     let (client, _server) = tokio::io::duplex(64 * 1024);
///     // A real connector hands `_server` to a broker (`sb_emulator::Emulator::serve_stream`).
///     Ok(Box::new(client) as sb_amqp::BoxIo)
/// });
/// let cs = "Endpoint=sb://sim;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true";
/// let client = ServiceBusClient::from_connection_string(&cs.parse()?).with_connector(connector);
/// # drop(client);
/// # Ok::<(), sb_servicebus::ConnectionStringError>(())
/// ```
#[derive(Clone)]
pub struct Connector(Arc<dyn Fn(&str) -> ConnectFuture + Send + Sync>);

impl Connector {
    /// A connector calling `connect` with the namespace host for each new connection.
    pub fn new<F, Fut>(connect: F) -> Self
    where
        F: Fn(&str) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<BoxIo>> + Send + 'static,
    {
        Connector(Arc::new(move |host| Box::pin(connect(host))))
    }

    /// Opens a stream to `host`.
    pub(crate) fn connect(&self, host: &str) -> ConnectFuture {
        (self.0)(host)
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector(..)")
    }
}

/// The host's wall clock as a client reads it: when it compares a lock's end (broker time)
/// with its own time, through what it learned of the broker's clock. The system clock by
/// default; a test or simulation passes one driven by tokio's paused timer, possibly stepped.
///
/// # Examples
/// ```
/// use std::time::{Duration, SystemTime};
/// use sb_servicebus::WallClock;
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
/// let clock = WallClock::new(move || start);
/// assert_eq!(clock.now(), start);
/// ```
#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> SystemTime + Send + Sync>);

impl WallClock {
    /// A clock reading `now`.
    pub fn new(now: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        WallClock(Arc::new(now))
    }

    /// The system clock.
    pub fn system() -> Self {
        WallClock::new(SystemTime::now)
    }

    /// The time now.
    pub fn now(&self) -> SystemTime {
        (self.0)()
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::system()
    }
}

impl fmt::Debug for WallClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WallClock(..)")
    }
}
