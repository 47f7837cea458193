//! The `sb-inbox` binary: `migrate`.

use crate::support::cli::run;

#[test]
fn migrate_applies_each_migration_once() {
    let dir = std::env::temp_dir().join(format!("sb-inbox-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("migrate.db");
    let _ = std::fs::remove_file(&db);
    let url = format!("sqlite://{}", db.display());
    let first = run(&["migrate", "--store", &url]);
    assert!(first.status.success(), "{first:?}");
    let all = sb_inbox::store::sqlite::MIGRATIONS.len();
    assert!(
        String::from_utf8_lossy(&first.stdout).starts_with(&format!("{all} migration(s) applied")),
        "{first:?}"
    );
    let second = run(&["migrate", "--store", &url]);
    assert!(String::from_utf8_lossy(&second.stdout).starts_with("0 migration(s) applied"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn applied(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_owned()
}

async fn pg_tables(url: &str, like: &str) -> i64 {
    let store = sb_inbox::PgStore::connect(url, 1).await.unwrap();
    let rows = store
        .query(
            "SELECT count(*) FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name LIKE $1",
            &[&like],
        )
        .await
        .unwrap();
    rows[0].get(0)
}

/// Issue 16: the core migrations create no `inventory_*` table; `--inventory` adds the reference
/// consumer's, once; a database migrated when the inventory tables were part of the core
/// (versions 1, 2, 3 recorded) needs nothing more. `sb-inbox run` stays not ready
/// without them (tests/servicebus/worker.rs, the worker started before its database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_inventory_tables_only_when_asked() {
    let url = crate::support::fresh_pg_schema("cli_migrate_inventory").await;
    let core = sb_inbox::store::postgres::MIGRATIONS.len().to_string();

    assert_eq!(applied(&run(&["migrate", "--store", &url])), core);
    assert_eq!(pg_tables(&url, "inventory%").await, 0);
    assert_eq!(
        pg_tables(&url, "sb_inbox%").await,
        4,
        "inbox, business key, version, bookkeeping"
    );

    assert_eq!(
        applied(&run(&["migrate", "--inventory", "--store", &url])),
        "1"
    );
    assert_eq!(pg_tables(&url, "inventory%").await, 3);
    // Versions 1, 2 and 3 recorded: what the old combined migrations left behind.
    assert_eq!(
        applied(&run(&["migrate", "--inventory", "--store", &url])),
        "0"
    );
}

#[test]
fn migrate_refuses_unknown_store_without_leaking_the_password() {
    let output = run(&["migrate", "--store", "mysql://root:hunter2@db/x"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unsupported store URL"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}
