//! The built `sb-inbox` binary as a child process: one-shot commands (sync and async) and
//! `sb-inbox run` for the reference consumer, each started from an environment the test decides
//! rather than the developer's shell.

use std::process::{Command, Output};

/// The binary Cargo built for these tests.
pub const BINARY: &str = env!("CARGO_BIN_EXE_sb-inbox");

/// Service Bus settings a developer's shell may carry; a test that wants one sets it itself.
const SERVICE_BUS_ENV: [&str; 3] = [
    "SB_INBOX_SERVICEBUS_CONNECTION",
    "SB_INBOX_SERVICEBUS_NAMESPACE",
    "SB_INBOX_SERVICEBUS_TRANSPORT",
];

/// `sb-inbox ARGS` with `connection` in `SB_INBOX_SERVICEBUS_CONNECTION` (none if `None`), the
/// other Service Bus settings removed, and warnings only in its log.
pub fn command(connection: Option<&str>, args: &[&str]) -> Command {
    let mut command = Command::new(BINARY);
    command.args(args).env("RUST_LOG", "warn");
    for name in SERVICE_BUS_ENV {
        command.env_remove(name);
    }
    if let Some(connection) = connection {
        command.env("SB_INBOX_SERVICEBUS_CONNECTION", connection);
    }
    command
}

/// Runs `sb-inbox ARGS` (no Service Bus connection) to its end, blocking.
pub fn run(args: &[&str]) -> Output {
    command(None, args).output().expect("the binary runs")
}

/// Runs `sb-inbox ARGS` with `connection` to its end without blocking the runtime (the
/// emulator it talks to is served by the same runtime).
pub async fn run_async(connection: Option<&str>, args: &[&str]) -> Output {
    tokio::process::Command::from(command(connection, args))
        .output()
        .await
        .expect("the binary runs")
}

/// `sb-inbox run`: the reference inventory consumer on `orders` over `connection`, storing in
/// `store`, with a 5 s shutdown grace and an `info` log; callers add their own settings.
pub fn worker(store: &str, connection: &str) -> Command {
    let mut command = command(Some(connection), &["run"]);
    command
        .env("SB_INBOX_CONSUMER", sb_inbox_cli::inventory::CONSUMER)
        .env("SB_INBOX_STORE", store)
        .env("SB_INBOX_ENTITY", "orders")
        .env("SB_INBOX_SHUTDOWN_GRACE_SECS", "5")
        .env("RUST_LOG", "info");
    command
}

/// Sends SIGTERM to a worker process and asserts it exits 0 (waiting without blocking the
/// runtime, which may serve the emulator it talks to).
pub async fn sigterm_exits_0(mut child: std::process::Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("the wait task ends")
        .expect("the worker is waited for");
    assert!(exit.success(), "{exit:?}");
}

/// The process's standard output, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The process's standard error, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
