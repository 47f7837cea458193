//! What a service that names only its store gets (issue 45, the adoption review's minor 10):
//! no WebSockets, no OS trust store, and a configuration asking for either is refused when it
//! loads, naming the cargo feature, not at the first connect, where it would look like a
//! network fault.

mod common;

use std::collections::HashMap;

use sb_inbox::worker::WorkerConfig;

/// The service's variables (prefix `ORDERS_`) plus `extra`.
fn load(extra: &[(&str, &str)]) -> Result<WorkerConfig, String> {
    let mut env: HashMap<String, String> = [
        ("ORDERS_CONSUMER", "shop.orders"),
        ("ORDERS_STORE", "postgres://postgres@127.0.0.1:5432/test"),
        (
            "ORDERS_SERVICEBUS_CONNECTION",
            "Endpoint=sb://shop.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v",
        ),
        ("ORDERS_ENTITY", "orders"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .collect();
    env.extend(
        extra
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
    );
    WorkerConfig::load_with_prefix(None, "ORDERS_", &|name| env.get(name).cloned())
        .map_err(|errors| errors.to_string())
}

#[test]
fn websockets_and_the_os_trust_store_are_refused_at_load_naming_their_features() {
    assert!(load(&[]).is_ok(), "{:?}", load(&[]).err());

    let problems = load(&[("ORDERS_SERVICEBUS_TRANSPORT", "websockets")]).unwrap_err();
    assert!(
        problems.contains("ORDERS_SERVICEBUS_TRANSPORT")
            && problems.contains("`websockets` cargo feature"),
        "{problems}"
    );
    // The connection string's own transport is refused the same way.
    let in_the_string = load(&[(
        "ORDERS_SERVICEBUS_CONNECTION",
        "Endpoint=sb://shop.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v;TransportType=AmqpWebSockets",
    )])
    .unwrap_err();
    assert!(
        in_the_string.contains("`websockets` cargo feature"),
        "{in_the_string}"
    );

    let problems = load(&[("ORDERS_SERVICEBUS_NATIVE_ROOTS", "true")]).unwrap_err();
    assert!(
        problems.contains("ORDERS_SERVICEBUS_NATIVE_ROOTS")
            && problems.contains("`native-roots` cargo feature"),
        "{problems}"
    );
    assert!(load(&[("ORDERS_SERVICEBUS_NATIVE_ROOTS", "false")]).is_ok());
}

/// Neither feature's crates are in the service's build. (rand 0.9 is: the OpenTelemetry SDK of
/// `logs` draws its ids with it; the library itself uses tokio-postgres's rand 0.10, which
/// `.ci/one-store` checks for a `postgres`-only dependent.)
#[test]
fn the_service_compiles_neither_websockets_nor_the_os_trust_store() {
    let tree = common::cargo_tree(&[]);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    for unwanted in ["tokio-tungstenite", "tungstenite", "rustls-native-certs"] {
        assert!(
            !crates.contains(&unwanted),
            "{unwanted} is in the service's normal dependencies:\n{tree}"
        );
    }
}
