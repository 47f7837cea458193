//! Reads `crates/cli/src/inventory` and names every `sb_inbox::` path whose first segment is
//! not exported by the library's API: its public modules and root re-exports in `src/lib.rs`,
//! without `#[doc(hidden)]` modules.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The names `src/lib.rs` exports as API: `pub mod x;` unless marked `#[doc(hidden)]`, and
/// every name of a `pub use …;`.
fn api(lib: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut hidden = false;
    let mut statement: Option<String> = None;
    for line in lib.lines().map(str::trim) {
        if let Some(text) = statement.as_mut() {
            text.push_str(line);
        } else if line.starts_with("#[doc(hidden)]") {
            hidden = true;
            continue;
        } else if let Some(name) = line.strip_prefix("pub mod ") {
            if !hidden {
                names.insert(name.trim_end_matches(';').to_owned());
            }
        } else if line.starts_with("pub use ") {
            statement = Some(line.to_owned());
        }
        if !line.starts_with("#[") {
            hidden = false;
        }
        if statement.as_deref().is_some_and(|text| text.ends_with(';')) {
            let text = statement.take().unwrap_or_default();
            let list = text.split_once('{').map_or(text.as_str(), |(_, rest)| rest);
            for item in list.split(',') {
                let item = item.trim().trim_end_matches([';', '}']).trim();
                if let Some(last) = item.rsplit("::").next().filter(|n| !n.is_empty()) {
                    names.insert(last.to_owned());
                }
            }
        }
    }
    names
}

/// The first segment of every `sb_inbox::` path in `code`: `sb_inbox::a::b` gives `a`,
/// `sb_inbox::{a::b, c}` gives `a` and `c`.
fn first_segments(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices(LIBRARY) {
        // `my_sb_inbox::` is another crate.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + LIBRARY.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(group_entries(group).iter().map(|item| segment(item)));
        } else {
            found.push(segment(rest));
        }
    }
    found.retain(|name| !name.is_empty());
    found
}

/// The entries of the use-tree group `group` opens (the text after its `{`), up to its `}`:
/// `a::b, c::{d, e}}` gives `a::b` and ` c::{d, e}`.
fn group_entries(group: &str) -> Vec<String> {
    let mut entries = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    entries.push(item);
    entries
}

/// How the consumer names the library: as a dependent crate does.
const LIBRARY: &str = "sb_inbox::";

/// The identifier `text` starts with (after spaces).
fn segment(text: &str) -> String {
    text.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Each line of `text` naming a `sb_inbox::` path outside `api`, as `label:line: text`; comments
/// are ignored.
fn outside(label: &str, text: &str, api: &BTreeSet<String>) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        for name in first_segments(code) {
            if !api.contains(&name) {
                found.push(format!(
                    "{label}:{}: sb_inbox::{name} in {}",
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|path| path.extension().is_some_and(|e| e == "rs"));
    files.sort();
    files
}

#[test]
fn the_inventory_names_only_the_library_api() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let api = api(&lib);
    for expected in ["runtime", "store", "Tx", "StoreError", "Handler"] {
        assert!(api.contains(expected), "{expected} missing from {api:?}");
    }
    // `worker` (the hosting API) is the library's since issue 32; the rest is the binary's.
    assert!(api.contains("worker"), "worker missing from {api:?}");
    for application in ["ops", "demo", "inventory"] {
        assert!(!api.contains(application), "{application} counted as API");
    }
    let files = sources(&root().join("crates/cli/src/inventory"));
    assert!(!files.is_empty());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        found.extend(outside(&file.display().to_string(), &text, &api));
    }
    assert!(
        found.is_empty(),
        "the inventory consumer uses what the library does not export:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_a_path_outside_the_api() {
    let lib = "pub mod store;\n#[doc(hidden)]\npub mod worker;\npub use ports::{Tx,\n    Store};\n";
    let api = api(lib);
    assert_eq!(
        api.iter().map(String::as_str).collect::<Vec<_>>(),
        ["Store", "Tx", "store"]
    );
    // Built at run time, so this file itself names no such path.
    let text = format!(
        "use sb_inbox::{{Tx, {}::send}};\nlet w = sb_inbox::{}::Worker::new(); // sb_inbox::ops\n",
        "ops", "worker"
    );
    let found = outside("t", &text, &api);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("sb_inbox::ops"), "{found:?}");
    assert!(found[1].contains("sb_inbox::worker"), "{found:?}");
    assert!(outside("t", "use sb_inbox::store::Migration;", &api).is_empty());
    assert!(outside("t", "use my_sb_inbox::ops;", &api).is_empty());
}

/// Every `.rs` file under `dir`, at any depth.
fn sources_within(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Each code line of `text` (comments ignored) naming a path of any crate in `crates`, as
/// `label:line: text`: `sb_inbox::…`, `use sb_inbox;`, `sb_inbox as x` all count.
fn naming(label: &str, text: &str, crates: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let named = crates.iter().any(|krate| {
            code.match_indices(krate).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + krate.len()..].chars().next();
                let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !word(before) && !word(after)
            })
        });
        if named {
            found.push(format!("{label}:{}: {}", n + 1, line.trim()));
        }
    }
    found
}

/// Lines of `dir`'s Rust files naming any of `crates`.
fn naming_within(dir: &Path, crates: &[&str]) -> Vec<String> {
    let files = sources_within(dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("a source file reads");
            naming(&file.display().to_string(), &text, crates)
        })
        .collect()
}

/// The Service Bus client crate is usable without the inbox (issue 32): none of its code names
/// `sb_inbox`, and its manifest depends on no `sb-inbox` crate, dev-dependencies included.
#[test]
fn the_service_bus_client_names_nothing_of_the_inbox() {
    let client = root().join("crates/servicebus");
    let found = naming_within(&client, &["sb_inbox", "sb_inbox_cli"]);
    assert!(
        found.is_empty(),
        "sb-servicebus names the inbox:\n{}",
        found.join("\n")
    );
    let manifest = std::fs::read_to_string(client.join("Cargo.toml")).unwrap();
    let depends: Vec<&str> = manifest
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            !line.starts_with('#') && line.starts_with("sb-inbox")
        })
        .collect();
    assert!(depends.is_empty(), "sb-servicebus depends on {depends:?}");
}

/// The runtime, the envelopes and the ports never see AMQP or the client: they speak the
/// ports' types, and `src/servicebus` (the adapter) is where the client meets them.
#[test]
fn the_runtime_and_the_ports_name_neither_amqp_nor_the_client() {
    for layer in ["src/runtime", "src/envelope", "src/ports"] {
        let found = naming_within(&root().join(layer), &["sb_amqp", "sb_servicebus"]);
        assert!(
            found.is_empty(),
            "{layer} names AMQP or the client:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn the_crate_check_sees_a_crate_named_in_code_only() {
    // Built at run time, so this file itself names no such path.
    let inbox = format!("sb_{}", "inbox");
    let text = format!(
        "use {inbox}::Message;\nlet x = 1; // {inbox}::Message\nuse my_{inbox}::Message;\nextern crate {inbox} as inbox;\n"
    );
    let found = naming("t", &text, &[inbox.as_str()]);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("t:1:"), "{found:?}");
    assert!(found[1].starts_with("t:4:"), "{found:?}");
}

/// Every `crate::` path in `text` (comments dropped) as (module, item): `crate::runtime::Context`
/// gives `("runtime", "Context")`, `use crate::{ports::Message, runtime::{A, B}}` gives
/// `("ports", "Message")`, `("runtime", "A")`, `("runtime", "B")`; a module named alone
/// (`crate::ports;`) gives an empty item.
fn crate_paths(text: &str) -> Vec<(String, String)> {
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        for entry in entries(rest) {
            let mut parts = entry.splitn(2, "::");
            let module = segment(parts.next().unwrap_or_default());
            let items = parts
                .next()
                .map(entries)
                .unwrap_or_else(|| vec![String::new()]);
            for item in items {
                found.push((module.clone(), segment(&item)));
            }
        }
    }
    found.retain(|(module, _)| !module.is_empty());
    found
}

/// The entries of a use tree at `text`: `{a::b, c}` gives `a::b` and `c`; anything else is
/// one entry, up to the first character that ends a path.
fn entries(text: &str) -> Vec<String> {
    let text = text.trim_start();
    let Some(group) = text.strip_prefix('{') else {
        let end = text
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{'))
            .unwrap_or(text.len());
        let path = &text[..end];
        // `a::{b, c}`: the group belongs to the entry.
        return match path.find("::{") {
            Some(open) => vec![format!(
                "{}{}",
                &path[..open + 2],
                group_of(&text[open + 2..])
            )],
            None => vec![path.to_owned()],
        };
    };
    let mut entries: Vec<String> = group_entries(group)
        .iter()
        .map(|entry| entry.trim().to_owned())
        .collect();
    entries.retain(|entry| !entry.is_empty());
    entries
}

/// The balanced `{…}` group `text` starts with, braces included.
fn group_of(text: &str) -> String {
    let mut depth = 0;
    let mut out = String::new();
    for c in text.chars() {
        out.push(c);
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    out
}

/// The envelopes (the .NET dialects, issue 46) sit beside the runtime, not inside it: they
/// name the ports' message types, and of the runtime only the handler's `Context` (what the
/// outbox writers continue a consumed conversation from) and, in tests, `ConsumerName`. They
/// name no store, worker, Service Bus adapter, relay or telemetry.
#[test]
fn the_envelopes_name_the_ports_and_only_the_runtimes_context() {
    let runtime_items = ["Context", "ConsumerName"];
    let files = sources_within(&root().join("src/envelope"));
    assert!(
        files.len() > 5,
        "the envelopes are not in src/envelope: {files:?}"
    );
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file reads");
        for (module, item) in crate_paths(&text) {
            let allowed = match module.as_str() {
                "envelope" | "ports" => true,
                "runtime" => runtime_items.contains(&item.as_str()),
                // The test kit's `ContextBuilder`, in unit tests.
                "testing" => item == "ContextBuilder",
                _ => false,
            };
            if !allowed {
                found.push(format!("{}: crate::{module}::{item}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the envelopes reach past the ports and the runtime's Context:\n{}",
        found.join("\n")
    );
}

/// The runtime reads every envelope through the `EnvelopeReader` trait a consumer is
/// configured with: it names no dialect, no type map and no outbox writer.
#[test]
fn the_runtime_names_no_envelope_dialect() {
    let dialects = [
        "MassTransit",
        "NServiceBus",
        "CloudEvents",
        "Raw",
        "TypeMap",
        "MassTransitEnvelope",
        "CloudEvent",
    ];
    let found = naming_within(&root().join("src/runtime"), &dialects);
    assert!(
        found.is_empty(),
        "the runtime names an envelope dialect:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_path_check_reads_use_trees() {
    let text = "use crate::{ports::Message, runtime::{A, b::C}};\n\
                use crate::envelope;\n\
                let x = crate::runtime::Context::new(); // crate::store::Nope\n\
                use my_crate::store::Nope;\n";
    let paths = crate_paths(text);
    let shown: Vec<String> = paths.iter().map(|(m, i)| format!("{m}::{i}")).collect();
    assert_eq!(
        shown,
        [
            "ports::Message",
            "runtime::A",
            "runtime::b",
            "envelope::",
            "runtime::Context"
        ]
    );
}
