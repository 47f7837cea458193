//! Test support shared by the workspace's test binaries.
//!
//! A test that cannot run because something outside the code is missing (RabbitMQ's AMQP 1.0
//! plugin, the Python SDK, Qpid Proton, the JavaScript SDK, a SQL Server) must never count as a
//! pass without saying so:
//! - under `CI=true` it **fails**, naming what is missing and how to get it, unless that
//!   dependency is listed in `SB_INBOX_TEST_SKIP` (comma-separated keys, e.g. `mssql` on a
//!   machine that cannot run SQL Server): a deliberate, visible decision of the CI set-up;
//! - elsewhere it writes `skipped: <test> needs <what> (<fix>)` to the process's stderr, past the
//!   test harness's output capture, so `cargo test` shows it, and `.ci/test` counts these lines
//!   in its summary.
//!
//! A few dependencies are *opt-in*: only a dedicated job provides them (Microsoft's Service Bus
//! emulator in `.github/workflows/servicebus-emulator.yml`, which needs Docker). Their tests
//! call [`opt_in`] instead of [`require`]: without the dependency they say `skipped` even under
//! `CI=true`, so the normal CI passes without it; the dedicated job sets the dependency and fails
//! if any of its tests still says `skipped`.
//!
//! ```no_run
//! # fn proton_installed() -> bool { true }
//! if !sb_testkit::require(sb_testkit::PROTON, proton_installed()) {
//!     return;
//! }
//! ```

use std::io::Write as _;

mod connect_proxy;

pub use connect_proxy::ConnectProxy;

/// Something a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dependency {
    /// The key `SB_INBOX_TEST_SKIP` names it by.
    pub key: &'static str,
    /// What is missing, as the message says it.
    pub what: &'static str,
    /// How to get it.
    pub fix: &'static str,
}

/// RabbitMQ with its AMQP 1.0 plugin at `AMQP_ADDR`.
pub const RABBITMQ: Dependency = Dependency {
    key: "rabbitmq",
    what: "RabbitMQ with the rabbitmq_amqp1_0 plugin at AMQP_ADDR (default 127.0.0.1:5672)",
    fix: ".ci/setup starts it and enables the plugin",
};

/// `rabbitmqctl`, to declare a quorum queue.
pub const RABBITMQCTL: Dependency = Dependency {
    key: "rabbitmq",
    what: "rabbitmqctl able to declare a quorum queue on the local RabbitMQ",
    fix: ".ci/setup starts RabbitMQ",
};

/// The official Python SDK, `azure-servicebus`, in [`python`]'s environment.
pub const PYTHON_SDK: Dependency = Dependency {
    key: "python-sdk",
    what: "Python package azure-servicebus (in SB_INBOX_PYTHON, default python3)",
    fix: ".ci/setup installs it with pip",
};

/// The `websocket-client` package the official Python SDK needs for AMQP over WebSockets.
pub const PYTHON_WEBSOCKETS: Dependency = Dependency {
    key: "python-sdk",
    what: "Python package websocket-client (in SB_INBOX_PYTHON, default python3)",
    fix: ".ci/setup installs it with pip",
};

/// The official CloudEvents SDK, `cloudevents` (2.x, with its AMQP binding), in [`python`]'s
/// environment.
pub const PYTHON_CLOUDEVENTS: Dependency = Dependency {
    key: "python-sdk",
    what: "Python package cloudevents 2.x (in SB_INBOX_PYTHON, default python3)",
    fix: ".ci/setup installs it with pip",
};

/// Qpid Proton's Python binding, `python-qpid-proton`, in [`python`]'s environment.
pub const PROTON: Dependency = Dependency {
    key: "proton",
    what: "Python package python-qpid-proton (in SB_INBOX_PYTHON, default python3)",
    fix: ".ci/setup installs it with pip",
};

/// What the official Python SDK's own samples need beyond the SDK: `azure-identity`, `aiohttp`,
/// PyPI once (the samples are downloaded), and `unshare` with user namespaces.
pub const PYTHON_SAMPLES: Dependency = Dependency {
    key: "python-samples",
    what: "the Python SDK's samples' needs: azure-identity and aiohttp, PyPI to download them, unshare with unprivileged user namespaces",
    fix: ".ci/setup installs the packages; the first line above says which is missing",
};

/// The official JavaScript SDK under `tests/servicebus/sdk/js/node_modules`.
pub const JS_SDK: Dependency = Dependency {
    key: "js-sdk",
    what: "@azure/service-bus in tests/servicebus/sdk/js/node_modules",
    fix: ".ci/setup runs npm ci there",
};

/// The `openssl` command, to make a test certificate.
pub const OPENSSL: Dependency = Dependency {
    key: "openssl",
    what: "the openssl command",
    fix: ".ci/setup installs the Debian package openssl",
};

/// A SQL Server at `SB_INBOX_MSSQL`.
pub const MSSQL: Dependency = Dependency {
    key: "mssql",
    what: "a SQL Server connection string in SB_INBOX_MSSQL",
    fix: "GitHub Actions' mssql job provides one; this machine kind cannot run SQL Server",
};

/// PostgreSQL's server binaries (`initdb`, `pg_ctl`) and a `postgres` system user, to run a
/// throwaway cluster a test may stop and start.
pub const INITDB: Dependency = Dependency {
    key: "initdb",
    what: "PostgreSQL's initdb and pg_ctl under /usr/lib/postgresql/*/bin, and a postgres user to run them as root",
    fix: ".ci/setup installs the postgresql package",
};

/// PostgreSQL at `DATABASE_URL` serving TLS with the snakeoil certificate.
pub const POSTGRES_TLS: Dependency = Dependency {
    key: "postgres-tls",
    what: "TLS on the PostgreSQL server at DATABASE_URL (Debian's snakeoil certificate for localhost)",
    fix: "Debian's postgresql package enables it; a postgres container does not",
};

/// An external Service Bus (opt-in: see [`opt_in`]) whose connection string is in
/// `SB_INBOX_EXTERNAL_SERVICEBUS`, holding the queues of `.github/servicebus-emulator/Config.json`.
pub const EXTERNAL_SERVICEBUS: Dependency = Dependency {
    key: "external-servicebus",
    what: "an external Service Bus: a connection string in SB_INBOX_EXTERNAL_SERVICEBUS whose \
           namespace has the queues of .github/servicebus-emulator/Config.json",
    fix: "GitHub Actions' servicebus-emulator workflow runs Microsoft's emulator; it needs Docker",
};

/// The Python interpreter tests run: `SB_INBOX_PYTHON`, default `python3`. `.ci/setup` installs
/// the packages into the same one, so pointing both at a bare virtual environment reproduces a
/// fresh machine.
pub fn python() -> String {
    std::env::var("SB_INBOX_PYTHON")
        .ok()
        .filter(|p| !p.trim().is_empty())
        .unwrap_or_else(|| "python3".to_owned())
}

/// Whether [`python`] can `import module`.
pub fn python_imports(module: &str) -> bool {
    std::process::Command::new(python())
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What a test does about a missing dependency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Fail with this message.
    Fail(String),
    /// Return early after printing this line.
    Skip(String),
}

/// The verdict for `test` missing `dep`, given whether CI is on and the `SB_INBOX_TEST_SKIP`
/// list (pure, so it can be tested without touching the environment).
pub fn verdict(dep: &Dependency, test: &str, ci: bool, allowed: &str) -> Verdict {
    let line = format!("skipped: {test} needs {} ({})", dep.what, dep.fix);
    let deliberate = allowed.split(',').any(|key| key.trim() == dep.key);
    if ci && !deliberate {
        Verdict::Fail(format!(
            "{test} cannot run: {} missing ({}). CI=true fails a test whose dependency is \
             missing; list `{}` in SB_INBOX_TEST_SKIP to skip it on purpose.",
            dep.what, dep.fix, dep.key
        ))
    } else {
        Verdict::Skip(line)
    }
}

/// Whether CI is on: `CI` set to anything but empty, `0` or `false` (GitHub Actions sets
/// `CI=true`).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// `true` when `available`; otherwise fails the test under CI, or says `skipped` on stderr and
/// returns `false` so the test returns early (see the crate docs).
///
/// # Panics
/// When `available` is false under `CI=true` and `dep` is not in `SB_INBOX_TEST_SKIP`.
#[track_caller]
pub fn require(dep: Dependency, available: bool) -> bool {
    if available {
        return true;
    }
    missing(dep);
    false
}

/// `true` when `available`; otherwise says `skipped` on stderr and returns `false`, also under
/// `CI=true`: for an opt-in dependency that only a dedicated job provides (see the crate docs).
pub fn opt_in(dep: Dependency, available: bool) -> bool {
    if available {
        return true;
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    if let Verdict::Skip(line) = verdict(&dep, test, false, "") {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
    false
}

/// Reports that the current test cannot run without `dep`: fails under CI, else says `skipped`
/// on stderr; the caller returns early.
///
/// # Panics
/// Under `CI=true` unless `dep` is in `SB_INBOX_TEST_SKIP`.
#[track_caller]
pub fn missing(dep: Dependency) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let allowed = std::env::var("SB_INBOX_TEST_SKIP").unwrap_or_default();
    match verdict(&dep, test, ci(), &allowed) {
        Verdict::Fail(message) => panic!("{message}"),
        // Straight to the process's stderr: the harness captures `eprintln!`, not this. A
        // closed stderr is no reason to fail.
        Verdict::Skip(line) => {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_ci_a_missing_dependency_is_a_visible_skip() {
        assert_eq!(
            verdict(&PROTON, "t", false, ""),
            Verdict::Skip(
                "skipped: t needs Python package python-qpid-proton (in SB_INBOX_PYTHON, default \
                 python3) (.ci/setup installs it with pip)"
                    .to_owned()
            )
        );
    }

    #[test]
    fn under_ci_a_missing_dependency_fails_naming_it() {
        let Verdict::Fail(message) = verdict(&RABBITMQ, "t", true, "mssql") else {
            panic!("CI must fail");
        };
        assert!(message.contains("rabbitmq_amqp1_0"), "{message}");
        assert!(message.contains("SB_INBOX_TEST_SKIP"), "{message}");
    }

    #[test]
    fn an_opt_in_dependency_never_fails_and_is_used_when_given() {
        // Not available: a skip, whatever CI says (the function reads CI itself).
        assert!(!opt_in(EXTERNAL_SERVICEBUS, false));
        assert!(opt_in(EXTERNAL_SERVICEBUS, true));
    }

    #[test]
    fn under_ci_only_a_listed_dependency_is_skipped() {
        assert!(matches!(
            verdict(&MSSQL, "t", true, "proton, mssql"),
            Verdict::Skip(_)
        ));
        assert!(matches!(
            verdict(&PROTON, "t", true, "mssql"),
            Verdict::Fail(_)
        ));
    }
}
