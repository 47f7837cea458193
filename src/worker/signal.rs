//! The process signals that ask a hosted worker to stop: SIGTERM (what Kubernetes, Azure
//! Container Apps and `docker stop` send first) and SIGINT (Ctrl-C).
//!
//! Both turn into one cancellation of the worker's token, so the drain runs: in-flight
//! deliveries finish and settle, prefetched ones are released, the relay finishes its batch.
//! Without it, the orchestrator's SIGKILL after its grace period would leave every in-flight
//! delivery locked until its lock expires, and each would come back as a redelivery.

use tokio_util::sync::CancellationToken;

use super::WorkerError;

/// A token cancelled when the process receives SIGTERM or SIGINT (Ctrl-C; on Windows, Ctrl-C
/// and Ctrl-Break), for a worker or anything else the service drains on shutdown.
///
/// The handlers are installed before this returns, so a signal that arrives after it is never
/// lost to the default action (which would kill the process without the drain). Once a
/// signal has been handled, later ones are ignored: the drain is bounded by the consumers'
/// grace and [`super::BACKGROUND_STOP`], and a second SIGTERM must not cut it short (the
/// orchestrator's SIGKILL still does, after its own grace period).
///
/// Must be called inside a Tokio runtime.
///
/// # Errors
/// [`WorkerError::Signal`] when a handler cannot be installed (no Tokio runtime with signal
/// support, or the OS refused).
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example() -> Result<(), sb_inbox::worker::WorkerError> {
/// let shutdown = sb_inbox::worker::shutdown_signal()?;
/// // …pass `shutdown.clone()` to whatever else drains, then:
/// shutdown.cancelled().await;
/// # Ok(()) }
/// ```
pub fn shutdown_signal() -> Result<CancellationToken, WorkerError> {
    let token = CancellationToken::new();
    let signalled = signals()?;
    let cancel = token.clone();
    // Detached on purpose: it ends with the first signal, or with the runtime.
    tokio::spawn(async move {
        let name = signalled.await;
        tracing::info!(signal = name, "Shutdown requested; draining.");
        cancel.cancel();
    });
    Ok(token)
}

/// Installs the handlers now and returns a future of the first signal's name.
#[cfg(unix)]
fn signals() -> Result<impl Future<Output = &'static str> + Send + 'static, WorkerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind: SignalKind, name: &'static str| {
        signal(kind).map_err(|source| WorkerError::Signal {
            signal: name,
            source,
        })
    };
    let mut term = install(SignalKind::terminate(), "SIGTERM")?;
    let mut int = install(SignalKind::interrupt(), "SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Installs the handlers now and returns a future of the first signal's name.
#[cfg(windows)]
fn signals() -> Result<impl Future<Output = &'static str> + Send + 'static, WorkerError> {
    use tokio::signal::windows::{ctrl_break, ctrl_c};
    let mut c = ctrl_c().map_err(|source| WorkerError::Signal {
        signal: "Ctrl-C",
        source,
    })?;
    let mut brk = ctrl_break().map_err(|source| WorkerError::Signal {
        signal: "Ctrl-Break",
        source,
    })?;
    Ok(async move {
        tokio::select! {
            _ = c.recv() => "Ctrl-C",
            _ = brk.recv() => "Ctrl-Break",
        }
    })
}
