//! PostgreSQL over TLS with verification, against the local server's certificate (Debian's
//! snakeoil certificate for `localhost`). Skipped when the server has TLS off.

use std::path::Path;

use sb_inbox::{ErrorKind, PgStore, Store};

use crate::support::pg_url;

const CERT: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

/// The local server's URL by host name (the certificate names `localhost`), or `None` to skip.
async fn localhost_url() -> Option<String> {
    let url = pg_url();
    let plain = PgStore::connect(&url, 1).await.ok()?;
    let rows = plain.query("SHOW ssl", &[]).await.ok()?;
    let on: String = rows.first()?.get(0);
    if on != "on" || !Path::new(CERT).exists() || !url.contains("@127.0.0.1") {
        sb_testkit::missing(sb_testkit::POSTGRES_TLS);
        return None;
    }
    Some(url.replace("@127.0.0.1", "@localhost"))
}

async fn uses_tls(store: &PgStore) -> Result<bool, sb_inbox::StoreError> {
    let rows = store
        .query(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(rows[0].get(0))
}

#[tokio::test]
async fn require_with_the_servers_root_certificate_is_encrypted() {
    let Some(url) = localhost_url().await else {
        return;
    };
    let store = PgStore::connect(&format!("{url}?sslmode=verify-full&sslrootcert={CERT}"), 1)
        .await
        .unwrap();
    assert!(uses_tls(&store).await.unwrap());
    // The store works as usual over it.
    let tx = store.begin().await.unwrap();
    sb_inbox::StoreTx::rollback(tx).await.unwrap();

    let plain = PgStore::connect(&url, 1).await.unwrap();
    assert!(
        !uses_tls(&plain).await.unwrap(),
        "no sslmode means plain TCP"
    );
}

#[tokio::test]
async fn an_unverifiable_certificate_is_refused() {
    let Some(url) = localhost_url().await else {
        return;
    };
    // Not in the webpki roots: an encrypted but unauthenticated session is never accepted.
    let error = PgStore::connect(&format!("{url}?sslmode=require"), 1)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("certificate"), "{error}");
}

#[tokio::test]
async fn a_missing_root_certificate_file_is_a_configuration_error() {
    let error = PgStore::connect(
        &format!("{}?sslmode=require&sslrootcert=/no/such.pem", pg_url()),
        1,
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Configuration);
    assert!(error.to_string().contains("/no/such.pem"), "{error}");
}
