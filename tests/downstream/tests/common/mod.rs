//! What the test files share.

/// `cargo tree -e normal --prefix none --offline` of this crate with `extra` arguments: its
/// output, after asserting that cargo succeeded.
pub fn cargo_tree(extra: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args(["tree", "-e", "normal", "--prefix", "none", "--offline"])
        .args(extra)
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
