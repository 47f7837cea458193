//! Issue 33: our management client (`servicebus::admin`) against the emulator's management API:
//! over HTTPS on the TLS listener it verifies the certificate with the generated CA (and
//! refuses it with Mozilla's roots alone), reads an entity's settings and counts, creates and
//! updates entities the broker uses at once; a key without Manage is refused 401.

use std::time::Duration;

use sb_emulator::{EmulatorOptions, EntityProperties, TlsIdentity};
use sb_inbox::Message;
use sb_inbox::servicebus::admin::{self, AdminClient, AdminError};
use sb_inbox::servicebus::{ConnectionString, TrustRoots};

use crate::support::emulator::queue;

fn orders_properties() -> EntityProperties {
    EntityProperties {
        lock_duration: Duration::from_secs(45),
        max_delivery_count: 7,
        default_message_time_to_live: Duration::from_secs(3 * 3600),
        requires_session: false,
        ..EntityProperties::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_reads_and_provisions_entities_over_https_trusting_the_generated_ca() {
    let dir = crate::tls::tls_dir("admin");
    let emulator = crate::support::emulator::start(
        vec![queue("orders", orders_properties())],
        EmulatorOptions::default()
            .with_tls_listen("127.0.0.1:0", TlsIdentity::Generate(dir.clone())),
    )
    .await;
    let cs: ConnectionString = emulator.tls_connection_string().unwrap().parse().unwrap();
    // Mozilla's roots alone: the generated CA is unknown.
    let untrusting = AdminClient::from_connection_string(&cs).unwrap();
    let refused = untrusting.entity("orders").await.expect_err("unknown CA");
    assert!(matches!(refused, AdminError::Tls(_)), "{refused:?}");
    assert!(
        format!("{refused:?}").contains("UnknownIssuer"),
        "{refused:?}"
    );
    let ca = emulator.tls_ca_file().unwrap();
    let admin = AdminClient::from_connection_string(&cs)
        .unwrap()
        .with_trust(&TrustRoots::new().with_ca_file(ca))
        .unwrap();

    let orders = admin
        .entity("orders")
        .await
        .unwrap()
        .expect("orders exists");
    assert_eq!(
        orders.properties.lock_duration,
        Some(Duration::from_secs(45))
    );
    assert_eq!(orders.properties.max_delivery_count, Some(7));
    assert_eq!(
        orders.properties.default_message_time_to_live,
        Some(Duration::from_secs(3 * 3600))
    );
    assert!(!orders.properties.requires_session);
    assert_eq!(orders.counts.total, 0);
    assert!(admin.entity("missing").await.unwrap().is_none());

    // Counts follow what the broker holds.
    let client = crate::support::emulator::client(&emulator);
    for n in 0..3 {
        client
            .sender("orders")
            .send(Message::new(format!("m{n}"), "t", "{}"))
            .await
            .unwrap();
    }
    let counted = admin.entity("orders").await.unwrap().unwrap();
    assert_eq!((counted.counts.total, counted.counts.active), (3, 3));

    // Create, then update: the broker uses the new entity and the new lock duration at once.
    let props = admin::EntityProperties {
        lock_duration: Some(Duration::from_secs(20)),
        max_delivery_count: Some(4),
        requires_session: true,
        ..Default::default()
    };
    let created = admin.create("provisioned", &props).await.unwrap();
    assert_eq!(created.properties.max_delivery_count, Some(4));
    assert!(created.properties.requires_session);
    let again = admin
        .create("provisioned", &props)
        .await
        .expect_err("exists");
    assert!(matches!(again, AdminError::Conflict(_)), "{again:?}");
    let updated = admin::EntityProperties {
        lock_duration: Some(Duration::from_secs(30)),
        ..props.clone()
    };
    admin.update("provisioned", &updated).await.unwrap();
    let entity = emulator.broker().entity("provisioned").unwrap();
    assert_eq!(entity.lock_duration(), Some(Duration::from_secs(30)));
    assert!(entity.requires_session());
    let missing = admin
        .update("never-made", &updated)
        .await
        .expect_err("missing");
    assert!(matches!(missing, AdminError::NotFound(_)), "{missing:?}");
    emulator.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_manage_is_refused_401_and_a_dead_endpoint_is_unreachable() {
    let emulator = crate::support::emulator::start(
        vec![queue("orders", orders_properties())],
        EmulatorOptions::default().with_http_listen("127.0.0.1:0"),
    )
    .await;
    let http = format!("http://{}", emulator.http_addr().unwrap());
    let wrong: ConnectionString = format!(
        "Endpoint=sb://127.0.0.1/;SharedAccessKeyName={};SharedAccessKey=not-the-key",
        sb_emulator::KEY_NAME
    )
    .parse()
    .unwrap();
    let refused = AdminClient::from_connection_string(&wrong)
        .unwrap()
        .with_endpoint(&http)
        .unwrap()
        .entity("orders")
        .await
        .expect_err("wrong key");
    assert!(
        matches!(refused, AdminError::Unauthorized { status: 401, .. }),
        "{refused:?}"
    );
    assert!(!refused.is_unreachable());
    // The emulator's own key over plain HTTP reads it.
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    let admin = AdminClient::from_connection_string(&cs)
        .unwrap()
        .with_endpoint(&http)
        .unwrap();
    assert!(admin.entity("orders").await.unwrap().is_some());
    emulator.shutdown().await;
    // Nothing listens there any more.
    let gone = admin.entity("orders").await.expect_err("closed");
    assert!(gone.is_unreachable(), "{gone:?}");
}
