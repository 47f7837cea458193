//! The `sb-inbox` binary: `migrate`.

use std::process::Command;

fn sb_inbox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sb-inbox"))
        .args(args)
        .output()
        .expect("binary runs")
}

#[test]
fn migrate_applies_each_migration_once() {
    let dir = std::env::temp_dir().join(format!("sb-inbox-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("migrate.db");
    let _ = std::fs::remove_file(&db);
    let url = format!("sqlite://{}", db.display());
    let first = sb_inbox(&["migrate", "--store", &url]);
    assert!(first.status.success(), "{first:?}");
    let all = sb_inbox::store::sqlite::MIGRATIONS.len();
    assert!(
        String::from_utf8_lossy(&first.stdout).starts_with(&format!("{all} migration(s) applied")),
        "{first:?}"
    );
    let second = sb_inbox(&["migrate", "--store", &url]);
    assert!(String::from_utf8_lossy(&second.stdout).starts_with("0 migration(s) applied"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn migrate_refuses_unknown_store_without_leaking_the_password() {
    let output = sb_inbox(&["migrate", "--store", "mysql://root:hunter2@db/x"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unsupported store URL"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}
