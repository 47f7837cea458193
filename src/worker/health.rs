//! `/healthz` (the process is alive) and `/readyz` (every readiness condition holds) for
//! container probes.
//!
//! [`Readiness`] is a set of named conditions. Each is either ready or not ready with a reason:
//! a [`Condition`] is set by the task that knows (the store opener, a supervisor that sees stuck
//! slots, …), a probe is asked at each `/readyz` and gets [`PROBE_TIMEOUT`] to answer. `/readyz`
//! answers 200 when none fails, else 503, and lists the failing ones with their reasons:
//! `{"ready":false,"not_ready":{"store":"connecting: connection refused"}}`.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::ports::StoreError;
use crate::runtime::StoreHealth;
#[cfg(feature = "mssql")]
use crate::store::MssqlStore;
#[cfg(feature = "postgres")]
use crate::store::PgStore;
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;

/// How long a readiness probe may take before it counts as not ready. Well inside the
/// Container Apps probe timeout (3 s in infra/), so a hung database makes `/readyz` answer 503
/// rather than time out.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How recent a committed transaction must be to stand for the store's readiness by itself.
pub const STORE_EVIDENCE: Duration = Duration::from_secs(15);

/// How long the store probe's ping may wait (for a pool connection, then the answer): inside
/// [`PROBE_TIMEOUT`], so the probe says why rather than just timing out.
const PING_WAIT: Duration = Duration::from_millis(1_750);

/// The consumers' transactions, as evidence for the `store` probe: each hosted consumer adds
/// its [`StoreHealth`]. Cheap to clone; clones share the list.
#[derive(Clone, Debug, Default)]
pub(crate) struct Commits(Arc<Mutex<Vec<StoreHealth>>>);

impl Commits {
    /// Adds a consumer's store health.
    pub(crate) fn add(&self, health: StoreHealth) {
        lock(&self.0).push(health);
    }

    /// When any consumer's transaction last committed.
    pub(crate) fn last(&self) -> Option<tokio::time::Instant> {
        lock(&self.0)
            .iter()
            .filter_map(StoreHealth::last_commit)
            .max()
    }
}

/// The `store` readiness probe. The store is ready when a consumer's transaction committed
/// within [`STORE_EVIDENCE`] (`last_commit`): it does the work now, however busy its pool.
/// Otherwise a ping must answer within 1.75 s. So a pool saturated by busy handlers
/// never fails `/readyz` while transactions commit, and a pool where nothing committed for
/// [`STORE_EVIDENCE`] and no connection frees up in time (every transaction stuck, the database
/// gone) does.
pub async fn store_ready(
    store: &impl Ping,
    last_commit: Option<tokio::time::Instant>,
) -> Result<(), String> {
    if last_commit.is_some_and(|at| at.elapsed() < STORE_EVIDENCE) {
        return Ok(());
    }
    match tokio::time::timeout(PING_WAIT, store.ping()).await {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "no transaction committed in the last {} s and no store connection answered within \
             {} ms (pool exhausted by stuck transactions, or the database unreachable)",
            STORE_EVIDENCE.as_secs(),
            PING_WAIT.as_millis()
        )),
    }
}

/// Whether a dependency answers.
pub trait Ping: Send + Sync {
    /// Answers `Ok` when the dependency is reachable now.
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>>;
}

#[cfg(feature = "postgres")]
impl Ping for PgStore {
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(async move { self.query("SELECT 1", &[]).await.map(drop) })
    }
}

#[cfg(feature = "sqlite")]
impl Ping for SqliteStore {
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(async move { self.with_connection(|c| c.execute_batch("SELECT 1")).await })
    }
}

#[cfg(feature = "mssql")]
impl Ping for MssqlStore {
    fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(async move { self.query("SELECT 1", &[]).await.map(drop) })
    }
}

/// An asynchronous readiness check: `Err(reason)` when not ready.
type ProbeFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

#[derive(Default)]
struct Inner {
    /// Set conditions: `None` when ready, `Some(reason)` when not.
    conditions: Mutex<BTreeMap<String, Option<String>>>,
    probes: Mutex<BTreeMap<String, ProbeFn>>,
    /// Facts `/readyz` reports without being unready (e.g. settings taken from the
    /// configuration because the entity could not be read).
    notes: Mutex<BTreeMap<String, String>>,
}

/// The named conditions `/readyz` reports. Cheap to clone; clones share the conditions.
///
/// # Examples
/// ```
/// use sb_inbox::worker::Readiness;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let readiness = Readiness::new();
/// let store = readiness.condition("store", "not opened yet");
/// assert_eq!(readiness.not_ready().await, vec![("store".to_owned(), "not opened yet".to_owned())]);
/// store.ready();
/// assert!(readiness.not_ready().await.is_empty());
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Readiness {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness").finish_non_exhaustive()
    }
}

/// One named condition of a [`Readiness`], set by whoever knows its state.
#[derive(Clone, Debug)]
pub struct Condition {
    readiness: Readiness,
    name: String,
}

impl Condition {
    /// The condition holds.
    pub fn ready(&self) {
        self.readiness.set(&self.name, None);
    }

    /// The condition does not hold, because of `reason` (shown in `/readyz`; no secrets).
    pub fn not_ready(&self, reason: impl Into<String>) {
        self.readiness.set(&self.name, Some(reason.into()));
    }
}

impl Readiness {
    /// No condition yet: ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or takes over) the condition `name`, not ready with `reason` until
    /// [`Condition::ready`].
    pub fn condition(&self, name: &str, reason: impl Into<String>) -> Condition {
        self.set(name, Some(reason.into()));
        Condition {
            readiness: self.clone(),
            name: name.to_owned(),
        }
    }

    /// Adds (or replaces) the probe `name`, asked at each `/readyz`: not ready when it answers
    /// `Err(reason)` or takes longer than [`PROBE_TIMEOUT`]. Replaces a set condition of that
    /// name.
    pub fn probe<F, Fut>(&self, name: &str, probe: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        lock(&self.inner.conditions).remove(name);
        let probe: ProbeFn = Arc::new(move || Box::pin(probe()));
        lock(&self.inner.probes).insert(name.to_owned(), probe);
    }

    /// Removes the condition or probe `name`.
    pub fn remove(&self, name: &str) {
        lock(&self.inner.conditions).remove(name);
        lock(&self.inner.probes).remove(name);
    }

    fn set(&self, name: &str, reason: Option<String>) {
        lock(&self.inner.probes).remove(name);
        lock(&self.inner.conditions).insert(name.to_owned(), reason);
    }

    /// Adds a note `/readyz` reports under `notes` without being unready.
    pub fn note(&self, name: &str, text: impl Into<String>) {
        lock(&self.inner.notes).insert(name.to_owned(), text.into());
    }

    /// The conditions that do not hold now, with their reasons, by name. Probes run at once,
    /// each within [`PROBE_TIMEOUT`].
    pub async fn not_ready(&self) -> Vec<(String, String)> {
        let mut failing: BTreeMap<String, String> = lock(&self.inner.conditions)
            .iter()
            .filter_map(|(name, reason)| Some((name.clone(), reason.clone()?)))
            .collect();
        let probes: Vec<(String, ProbeFn)> = lock(&self.inner.probes)
            .iter()
            .map(|(name, probe)| (name.clone(), probe.clone()))
            .collect();
        let asked = probes.into_iter().map(|(name, probe)| {
            tokio::spawn(async move {
                let answer = match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
                    Ok(answer) => answer,
                    Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
                };
                (name, answer)
            })
        });
        let asked: Vec<_> = asked.collect();
        for task in asked {
            match task.await {
                Ok((_, Ok(()))) => {}
                Ok((name, Err(reason))) => {
                    failing.insert(name, reason);
                }
                Err(error) => {
                    failing.insert("probe".to_owned(), format!("a probe failed: {error}"));
                }
            }
        }
        failing.into_iter().collect()
    }

    /// The `/readyz` answer: 200 with `{"ready":true,...}` when every condition holds, else
    /// 503 naming the failing ones.
    pub async fn readyz(&self) -> HealthResponse {
        let failing = self.not_ready().await;
        let status = if failing.is_empty() { 200 } else { 503 };
        let notes = lock(&self.inner.notes).clone();
        let body = if notes.is_empty() {
            serde_json::json!({
                "ready": failing.is_empty(),
                "not_ready": failing.into_iter().collect::<BTreeMap<_, _>>(),
            })
        } else {
            serde_json::json!({
                "ready": failing.is_empty(),
                "not_ready": failing.into_iter().collect::<BTreeMap<_, _>>(),
                "notes": notes,
            })
        };
        HealthResponse {
            status,
            body: body.to_string(),
        }
    }

    /// The `/livez` (also `/healthz`) answer: 200 while the process runs. Liveness never
    /// depends on the store or the broker, so an outage does not get the replica restarted.
    pub fn livez(&self) -> HealthResponse {
        HealthResponse {
            status: 200,
            body: "{\"status\":\"alive\"}".to_owned(),
        }
    }

    /// The answer for a GET of `path` (`/livez`, `/healthz`, `/readyz`), or `None` for any
    /// other path: mount it on the service's own router (axum, hyper, actix) instead of the
    /// built-in server, with no web framework in this crate.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use sb_inbox::worker::Readiness;
    /// let readiness = Readiness::new();
    /// let store = readiness.condition("store", "opening");
    /// assert_eq!(readiness.respond("/readyz").await.unwrap().status, 503);
    /// store.ready();
    /// let ready = readiness.respond("/readyz").await.unwrap();
    /// assert_eq!((ready.status, ready.body.as_str()), (200, r#"{"not_ready":{},"ready":true}"#));
    /// assert_eq!(readiness.respond("/livez").await.unwrap().status, 200);
    /// assert!(readiness.respond("/metrics").await.is_none());
    /// # }
    /// ```
    pub async fn respond(&self, path: &str) -> Option<HealthResponse> {
        match path {
            "/livez" | "/healthz" => Some(self.livez()),
            "/readyz" => Some(self.readyz().await),
            _ => None,
        }
    }
}

/// A health endpoint's answer: an HTTP status and a JSON body (`content-type:
/// application/json`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthResponse {
    /// 200 or 503.
    pub status: u16,
    /// The JSON body.
    pub body: String,
}

impl HealthResponse {
    /// The status line's reason phrase.
    pub fn reason(&self) -> &'static str {
        match self.status {
            200 => "OK",
            503 => "Service Unavailable",
            _ => "Not Found",
        }
    }
}

/// The maps hold plain data: a panic elsewhere cannot leave them half-written.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves the probes on `listener` (when given) until the returned guard is dropped: they
/// answer until the drain is over, then stop with the worker.
pub(crate) fn serve_while(listener: Option<TcpListener>, readiness: &Readiness) -> DropGuard {
    let stop = CancellationToken::new();
    if let Some(listener) = listener {
        tokio::spawn(serve(listener, readiness.clone(), stop.clone()));
    }
    stop.drop_guard()
}

/// Serves the probes on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "Health endpoints listening.");
    }
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, peer)) = accepted else {
            continue;
        };
        let readiness = readiness.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(stream, peer, &readiness).await {
                tracing::debug!(%peer, %error, "Health probe connection failed.");
            }
        });
    }
}

async fn answer(
    mut stream: tokio::net::TcpStream,
    _peer: SocketAddr,
    readiness: &Readiness,
) -> std::io::Result<()> {
    let mut buffer = [0u8; 1024];
    let read = stream.read(&mut buffer).await?;
    let request = String::from_utf8_lossy(&buffer[..read]);
    let path = request.lines().next().and_then(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some("GET"))
            .then(|| parts.next())
            .flatten()
    });
    let answer = match path {
        Some(path) => readiness.respond(path).await,
        None => None,
    };
    let answer = answer.unwrap_or_else(|| HealthResponse {
        status: 404,
        body: "{\"error\":\"not found\"}".to_owned(),
    });
    let (status, reason, body) = (answer.status, answer.reason(), answer.body);
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    async fn served(readiness: Readiness) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(listener, readiness, shutdown.clone()));
        (addr, shutdown)
    }

    #[tokio::test]
    async fn ready_only_when_every_condition_holds_and_readyz_names_the_others() {
        let readiness = Readiness::new();
        let broker_up = Arc::new(AtomicBool::new(true));
        let flag = broker_up.clone();
        readiness.probe("broker", move || {
            let up = flag.load(Ordering::SeqCst);
            async move {
                if up {
                    Ok(())
                } else {
                    Err("disconnected".to_owned())
                }
            }
        });
        let store = readiness.condition("store", "connecting: refused \"x\"");
        let (addr, shutdown) = served(readiness.clone()).await;

        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(
            response
                .ends_with(r#"{"not_ready":{"store":"connecting: refused \"x\""},"ready":false}"#),
            "{response}"
        );
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));

        store.ready();
        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            response.ends_with(r#"{"not_ready":{},"ready":true}"#),
            "{response}"
        );

        broker_up.store(false, Ordering::SeqCst);
        store.not_ready("fail-over");
        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(
            response.ends_with(
                r#"{"not_ready":{"broker":"disconnected","store":"fail-over"},"ready":false}"#
            ),
            "{response}"
        );
        assert!(
            get(addr, "/healthz").await.starts_with("HTTP/1.1 200"),
            "alive even when not ready"
        );
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_hangs_is_not_ready_after_the_timeout() {
        let readiness = Readiness::new();
        readiness.probe("store", std::future::pending::<Result<(), String>>);
        let failing = readiness.not_ready().await;
        assert_eq!(failing.len(), 1);
        assert_eq!(failing[0].0, "store");
        assert!(failing[0].1.contains("no answer within 2s"), "{failing:?}");
    }

    /// A store whose pool has no free connection: the ping waits for one forever.
    struct Saturated;

    impl Ping for Saturated {
        fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
            Box::pin(std::future::pending())
        }
    }

    /// A saturated pool is ready while transactions commit; once none committed for
    /// `STORE_EVIDENCE`, the ping decides and says why.
    #[tokio::test(start_paused = true)]
    async fn a_saturated_pool_is_ready_while_transactions_commit() {
        let health = StoreHealth::new(&crate::runtime::ConsumerName::new("c").unwrap());
        let commits = Commits::default();
        commits.add(health.clone());
        assert_eq!(commits.last(), None);
        let readiness = Readiness::new();
        readiness.probe("store", {
            let commits = commits.clone();
            move || {
                let last = commits.last();
                async move { store_ready(&Saturated, last).await }
            }
        });
        let failing = readiness.not_ready().await;
        assert_eq!(failing.len(), 1, "no commit yet: the ping decides");
        assert!(
            failing[0]
                .1
                .contains("no store connection answered within 1750 ms"),
            "{failing:?}"
        );

        // A handler's transaction commits (what `Runtime` reports on each commit).
        health.committed();
        assert!(readiness.not_ready().await.is_empty());
        tokio::time::advance(STORE_EVIDENCE - Duration::from_secs(1)).await;
        assert!(
            readiness.not_ready().await.is_empty(),
            "still fresh evidence"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let failing = readiness.not_ready().await;
        assert_eq!(failing.len(), 1, "stale evidence: stuck, not busy");

        // A free pool answers the ping without any commit.
        struct Free;
        impl Ping for Free {
            fn ping(&self) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
                Box::pin(async { Ok(()) })
            }
        }
        assert_eq!(store_ready(&Free, None).await, Ok(()));
    }

    #[tokio::test]
    async fn a_probe_replaces_a_condition_of_the_same_name_and_remove_forgets_it() {
        let readiness = Readiness::new();
        let _opening = readiness.condition("store", "opening");
        readiness.probe("store", || async { Ok(()) });
        assert!(readiness.not_ready().await.is_empty());
        let other = readiness.condition("slots", "stuck");
        assert_eq!(readiness.not_ready().await.len(), 1);
        readiness.remove("slots");
        other.ready();
        // A handle whose condition was removed sets it again: the last word counts.
        assert!(readiness.not_ready().await.is_empty());
    }
}
