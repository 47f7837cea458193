//! What the test files share.

/// `cargo tree -e normal --prefix none --offline` of this crate with `extra` arguments: its
/// output, after asserting that cargo succeeded.
#[allow(dead_code)] // not every test file looks at the build
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

/// PostgreSQL for the tests: `DATABASE_URL`, or the one `.ci/setup` starts.
#[allow(dead_code)] // not every test file opens a store
pub fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema `name`_PID, migrated (sb-inbox's tables and the service's) as a deployment
/// step would migrate it: the service only checks. Its URL.
#[allow(dead_code)] // not every test file opens a store
pub async fn fresh_schema(name: &str) -> String {
    use sb_inbox::PgStore;
    let admin = PgStore::connect(&pg_url(), 1)
        .await
        .expect("PostgreSQL reachable at DATABASE_URL (.ci/setup starts it)");
    let schema = format!("{name}_{}", std::process::id());
    admin
        .query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"), &[])
        .await
        .expect("drop the schema");
    admin
        .query(&format!("CREATE SCHEMA {schema}"), &[])
        .await
        .expect("create the schema");
    let url = format!("{}?options=-csearch_path%3D{schema}", pg_url());
    let store = PgStore::connect(&url, 1)
        .await
        .expect("connect to the schema");
    store.migrate().await.expect("sb-inbox's migrations");
    store
        .apply_migrations(&[sb_inbox_downstream::MIGRATION])
        .await
        .expect("the service's migration");
    url
}
