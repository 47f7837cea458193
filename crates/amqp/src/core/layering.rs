//! The import direction of the roles: `core` uses neither role, and the client and server
//! roles do not use each other. Inside `core`, imports go down the ownership: a connection
//! begins sessions, sessions attach links; a link names neither its session nor its connection
//! and a session does not name its connection module (issue 46). Read from the sources, so a new `use` that breaks it fails
//! here rather than in review.

use std::path::{Path, PathBuf};

fn sources(under: &Path) -> Vec<PathBuf> {
    if under.is_file() {
        return vec![under.to_path_buf()];
    }
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(under) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The lines of `text` that name one of the `forbidden` roles (`crate::client`,
/// `super::server`, …), as `label:line: text`; comments are ignored.
fn naming(label: &str, text: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        for role in forbidden {
            let paths = [
                format!("crate::{role}"),
                format!("crate::core::{role}"),
                format!("super::{role}"),
                format!("super::super::{role}"),
            ];
            if paths.iter().any(|p| names(code, p)) {
                found.push(format!("{label}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

/// Whether `code` contains the path `path` as a whole name (`super::session` is not
/// `super::session_state`).
fn names(code: &str, path: &str) -> bool {
    code.match_indices(path).any(|(at, _)| {
        !code[at + path.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Every line under `module` (a directory or a file of `src/`) naming one of `forbidden`.
fn offending(module: &str, forbidden: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = sources(&src.join(module));
    files.extend(sources(&src.join(format!("{module}.rs"))));
    assert!(!files.is_empty(), "no sources for {module}");
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        found.extend(naming(&file.display().to_string(), &text, forbidden));
    }
    found
}

#[test]
fn the_core_uses_neither_role() {
    let found = offending("core", &["client", "server"]);
    assert!(
        found.is_empty(),
        "core imports a role:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_server_role_does_not_use_the_client_role() {
    let found = offending("server", &["client"]);
    assert!(
        found.is_empty(),
        "server imports client:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_client_role_does_not_use_the_server_role() {
    let found = offending("client", &["server"]);
    assert!(
        found.is_empty(),
        "client imports server:\n{}",
        found.join("\n")
    );
}

#[test]
fn imports_go_down_the_ownership() {
    let mut found = offending("core/link", &["session", "connection"]);
    found.extend(offending("core/session", &["connection"]));
    assert!(
        found.is_empty(),
        "a link or session imports its owner:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_a_forbidden_import() {
    // Built at run time, so this file itself names no role.
    let text = format!(
        "use std::sync::Arc;\nuse crate::{}::Listener; // x\n",
        "server"
    );
    assert_eq!(naming("t", &text, &["server"]).len(), 1);
    let commented = format!("// see crate::{}::Listener\n", "server");
    assert!(naming("t", &commented, &["server"]).is_empty());
    let nested = format!("use crate::core::{}::ConnInner;\n", "connection");
    assert_eq!(naming("t", &nested, &["connection"]).len(), 1);
    let longer = format!("use super::{}_state::X;\n", "session");
    assert!(naming("t", &longer, &["session"]).is_empty());
}
