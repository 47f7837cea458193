//! The configuration read end to end: files and environment, defaults, bounds, every problem at once.

#![allow(clippy::unwrap_in_result)]

use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::servicebus::Transport;

fn load(toml: &str, env: &[(&str, &str)]) -> Result<WorkerConfig, ConfigErrors> {
    let dir = std::env::temp_dir().join(format!(
        "sb-inbox-config-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("worker.toml");
    std::fs::write(&path, toml).unwrap();
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let result = WorkerConfig::load(Some(&path), &|name| env.get(name).cloned());
    let _ = std::fs::remove_dir_all(&dir);
    result
}

const GOOD: &str = r#"
consumer = "inventory.order-placed.v1"
store = "sqlite://inbox.db"
[servicebus]
connection = "Endpoint=sb://localhost:5699;SharedAccessKeyName=k;SharedAccessKey=SECRET;UseDevelopmentEmulator=true"
entity = "orders"
[runtime]
concurrency = 4
"#;

#[test]
fn file_values_and_defaults() {
    let config = load(GOOD, &[]).unwrap();
    assert_eq!(
        config.runtime.consumer.as_str(),
        "inventory.order-placed.v1"
    );
    assert_eq!(
        (config.runtime.concurrency, config.runtime.prefetch),
        (4, 0)
    );
    assert_eq!(config.runtime.lock_margin, Duration::from_secs(10));
    assert_eq!(config.entity, "orders");
    assert!(matches!(config.broker, BrokerAddress::Connection(_)));
    assert!(!format!("{config:?}").contains("SECRET"));
}

#[test]
fn namespace_means_entra_id_with_the_identity_from_azure_client_id() {
    let toml = GOOD.replace(
        "connection = \"Endpoint=sb://localhost:5699;SharedAccessKeyName=k;SharedAccessKey=SECRET;UseDevelopmentEmulator=true\"",
        "namespace = \"contoso.servicebus.windows.net\"",
    );
    let config = load(&toml, &[("AZURE_CLIENT_ID", "1111-2222")]).unwrap();
    assert_eq!(
        config.broker,
        BrokerAddress::Namespace {
            host: "contoso.servicebus.windows.net".into(),
            client_id: Some("1111-2222".into()),
            transport: Transport::Amqp,
        }
    );
    let config = load(&toml, &[("SB_INBOX_SERVICEBUS_TRANSPORT", "websockets")]).unwrap();
    assert!(matches!(
        config.broker,
        BrokerAddress::Namespace {
            transport: Transport::AmqpWebSockets,
            ..
        }
    ));
    let problems = load(&toml, &[("SB_INBOX_SERVICEBUS_TRANSPORT", "http")])
        .unwrap_err()
        .to_string();
    assert!(
        problems.contains("servicebus.transport (SB_INBOX_SERVICEBUS_TRANSPORT): \"http\" is not amqp or websockets"),
        "{problems}"
    );
    let config = load(&toml, &[]).unwrap();
    assert!(matches!(
        config.broker,
        BrokerAddress::Namespace {
            client_id: None,
            ..
        }
    ));
}

#[test]
fn environment_overrides_the_file() {
    let config = load(
        GOOD,
        &[
            ("SB_INBOX_CONCURRENCY", "16"),
            ("SB_INBOX_ENTITY", "t/Subscriptions/s"),
        ],
    )
    .unwrap();
    assert_eq!(config.runtime.concurrency, 16);
    assert_eq!(config.entity, "t/Subscriptions/s");
}

#[test]
fn batching_is_off_by_default_and_set_by_file_or_environment() {
    let config = load(GOOD, &[]).unwrap();
    assert_eq!(config.runtime.batch_size, 1);
    assert_eq!(config.runtime.batch_linger, Duration::from_millis(5));
    let file = format!("{GOOD}\nbatch_size = 64\nbatch_linger_ms = 20\n");
    let config = load(&file, &[("SB_INBOX_BATCH_SIZE", "16")]).unwrap();
    assert_eq!(config.runtime.batch_size, 16);
    assert_eq!(config.runtime.batch_linger, Duration::from_millis(20));
    let problems = load(GOOD, &[("SB_INBOX_BATCH_SIZE", "0")])
        .unwrap_err()
        .to_string();
    assert!(
        problems.contains("runtime.batch_size (SB_INBOX_BATCH_SIZE)"),
        "{problems}"
    );
}

#[test]
fn the_kill_switch_is_on_by_default_and_set_by_file_or_environment() {
    let config = load(GOOD, &[]).unwrap();
    assert_eq!(
        config.runtime.circuit,
        crate::runtime::CircuitConfig::default()
    );
    assert!(config.runtime.circuit.enabled);
    assert_eq!(config.runtime.max_panics, 3);
    assert_eq!(config.runtime.transient_hold_max, Duration::from_secs(5));
    let file = format!(
        "{GOOD}max_panics = 2\ntransient_hold_max_ms = 0\n[runtime.circuit]\nconsecutive_failures = 9\nwindow_secs = 60\nprobe_min_ms = 200\nprobe_max_secs = 5\n"
    );
    let env = [
        ("SB_INBOX_CIRCUIT_ENABLED", "false"),
        ("SB_INBOX_CIRCUIT_FAILURE_RATE_PERCENT", "80"),
    ];
    let runtime = load(&file, &env).unwrap().runtime;
    assert_eq!(runtime.max_panics, 2);
    assert_eq!(runtime.transient_hold_max, Duration::ZERO);
    let circuit = runtime.circuit;
    assert!(!circuit.enabled);
    assert_eq!(circuit.consecutive, 9);
    assert_eq!(circuit.failure_rate_percent, 80);
    assert_eq!(circuit.window, Duration::from_secs(60));
    assert_eq!(circuit.probe_min, Duration::from_millis(200));
    assert_eq!(circuit.probe_max, Duration::from_secs(5));
    let env = [
        ("SB_INBOX_CIRCUIT_CONSECUTIVE_FAILURES", "0"),
        ("SB_INBOX_CIRCUIT_PROBE_MIN_MS", "90000"),
        ("SB_INBOX_CIRCUIT_PROBE_MAX_SECS", "60"),
    ];
    let problems = load(GOOD, &env).unwrap_err().to_string();
    assert!(
        problems.contains(
            "runtime.circuit.consecutive_failures (SB_INBOX_CIRCUIT_CONSECUTIVE_FAILURES)"
        ),
        "{problems}"
    );
    assert!(
        problems.contains("runtime.circuit.probe_min_ms (SB_INBOX_CIRCUIT_PROBE_MIN_MS)"),
        "{problems}"
    );
    let unknown = format!("{GOOD}[runtime.circuit]\nthreshold = 3\n");
    assert!(
        load(&unknown, &[]).is_err(),
        "an unknown circuit key is refused"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let errors = load(
        "consumer = \"Bad Name\"\n[runtime]\nconcurrency = 0\n",
        &[
            ("SB_INBOX_PREFETCH", "lots"),
            ("SB_INBOX_STORE", "mysql://u:pw@h/d"),
        ],
    )
    .unwrap_err();
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "consumer (SB_INBOX_CONSUMER)",
            "store (SB_INBOX_STORE)",
            "servicebus.connection (SB_INBOX_SERVICEBUS_CONNECTION)",
            "servicebus.entity (SB_INBOX_ENTITY)",
            "runtime.concurrency (SB_INBOX_CONCURRENCY)",
            "runtime.prefetch (SB_INBOX_PREFETCH)",
        ]
    );
    assert!(!errors.to_string().contains("pw@"), "{errors}");
}

#[test]
fn unknown_keys_are_refused() {
    let errors = load("consumer = \"a\"\nconcurency = 3\n", &[]).unwrap_err();
    assert!(errors.to_string().contains("concurency"), "{errors}");
}

#[test]
fn retention_needs_the_horizon_and_must_cover_it() {
    // Without [entity] the horizon comes from the entity read at start-up (issue 33:
    // worker::entity_check), so the file alone is accepted and the horizon left open.
    let retention = format!("{GOOD}[retention]\nretention_secs = 3600\n");
    let config = load(&retention, &[]).unwrap();
    assert!(config.horizon.is_none());
    assert_eq!(
        config.retention.map(|r| r.retention),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(config.declared_entity.message_ttl, None);
    assert_eq!(
        config.declared_entity.dlq_resubmit_window,
        Duration::from_secs(7 * 86_400)
    );
    let short = format!(
        "{GOOD}[retention]\nretention_secs = 3600\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\n"
    );
    // TTL + lock × count + the default 7-day DLQ resubmission window.
    let errors = load(&short, &[]).unwrap_err();
    assert!(errors.to_string().contains("at least 691800"), "{errors}");
    let config = load(&short, &[("SB_INBOX_RETENTION_SECS", "691800")]).unwrap();
    assert_eq!(
        config.retention.unwrap().retention,
        Duration::from_secs(691_800)
    );
    let no_window = [
        ("SB_INBOX_RETENTION_SECS", "87000"),
        ("SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS", "0"),
    ];
    assert!(load(&short, &no_window).is_ok());
}

#[test]
fn session_mode_from_file_or_env_with_its_keys_and_without_retries() {
    assert!(load(GOOD, &[]).unwrap().sessions.is_none());
    let on = format!("{GOOD}max_sessions = 3\n");
    let on = on.replace(
        "entity = \"orders\"",
        "entity = \"orders\"\nsessions = true",
    );
    let sessions = load(&on, &[]).unwrap().sessions.unwrap();
    assert_eq!(sessions.max_sessions, 3);
    assert_eq!(sessions.idle, Duration::from_secs(5));
    let from_env = load(
        GOOD,
        &[
            ("SB_INBOX_SESSIONS", "true"),
            ("SB_INBOX_SESSION_IDLE_SECS", "2"),
        ],
    )
    .unwrap()
    .sessions
    .unwrap();
    assert_eq!(from_env.idle, Duration::from_secs(2));
    assert_eq!(from_env.max_sessions, 8);
    let text = |errors: ConfigErrors| errors.to_string();
    let bad = text(load(GOOD, &[("SB_INBOX_SESSIONS", "maybe")]).unwrap_err());
    assert!(
        bad.contains("servicebus.sessions (SB_INBOX_SESSIONS)"),
        "{bad}"
    );
    let orphan = text(load(GOOD, &[("SB_INBOX_MAX_SESSIONS", "2")]).unwrap_err());
    assert!(
        orphan.contains("has no effect without servicebus.sessions"),
        "{orphan}"
    );
    let with_retries = text(
        load(
            GOOD,
            &[
                ("SB_INBOX_SESSIONS", "1"),
                ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
            ],
        )
        .unwrap_err(),
    );
    assert!(
        with_retries.contains("cannot keep a session's order"),
        "{with_retries}"
    );
}

#[test]
fn session_mode_refuses_batched_transactions() {
    let batched = ConfigErrors::to_string(
        &load(
            GOOD,
            &[("SB_INBOX_SESSIONS", "true"), ("SB_INBOX_BATCH_SIZE", "16")],
        )
        .unwrap_err(),
    );
    assert!(
        batched.contains("runtime.batch_size (SB_INBOX_BATCH_SIZE)")
            && batched.contains("one at a time"),
        "{batched}"
    );
    let single = load(
        GOOD,
        &[("SB_INBOX_SESSIONS", "true"), ("SB_INBOX_BATCH_SIZE", "1")],
    )
    .unwrap();
    assert!(single.sessions.is_some());
}

#[test]
fn delayed_retries_are_off_by_default_and_validated() {
    assert!(load(GOOD, &[]).unwrap().retry.is_none());
    let config = load(
        &format!("{GOOD}[retry]\nmax_retries = 4\nbase_delay_secs = 5\n"),
        &[("SB_INBOX_RETRY_JITTER_PERCENT", "0")],
    )
    .unwrap();
    let policy = config.retry.unwrap();
    assert_eq!(
        (
            policy.max_retries(),
            policy.base_delay(),
            policy.max_delay()
        ),
        (4, Duration::from_secs(5), Duration::from_secs(600))
    );
    assert_eq!(policy.delay(3), Duration::from_secs(20));

    let errors = load(
        GOOD,
        &[
            ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
            ("SB_INBOX_RETRY_BASE_DELAY_SECS", "60"),
            ("SB_INBOX_RETRY_MAX_DELAY_SECS", "30"),
            ("SB_INBOX_RETRY_JITTER_PERCENT", "101"),
        ],
    )
    .unwrap_err();
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "retry.jitter_percent (SB_INBOX_RETRY_JITTER_PERCENT)",
            "retry.max_delay_secs (SB_INBOX_RETRY_MAX_DELAY_SECS)",
        ],
        "{errors}"
    );

    let errors = load(
        GOOD,
        &[
            ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
            ("SB_INBOX_ENTITY", "orders/Subscriptions/inventory"),
        ],
    )
    .unwrap_err();
    assert!(errors.to_string().contains("ForwardTo"), "{errors}");
    let off = load(
        GOOD,
        &[("SB_INBOX_ENTITY", "orders/Subscriptions/inventory")],
    )
    .unwrap();
    assert!(off.retry.is_none());
}

#[test]
fn delayed_retries_lengthen_the_replay_horizon() {
    let retention = format!(
        "{GOOD}[retention]\nretention_secs = 87000\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\ndlq_resubmit_window_secs = 0\n"
    );
    assert!(load(&retention, &[]).is_ok());
    let errors = load(
        &retention,
        &[
            ("SB_INBOX_RETRY_MAX_RETRIES", "5"),
            ("SB_INBOX_RETRY_MAX_DELAY_SECS", "600"),
        ],
    )
    .unwrap_err();
    assert!(errors.to_string().contains("at least 90000"), "{errors}");
}

#[test]
fn relay_and_retention_settings_have_defaults_and_bounds() {
    let config = load(GOOD, &[]).unwrap();
    assert_eq!(config.relay, RelayConfig::default());
    let horizon = "[retention]\nretention_secs = 172800\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\ndlq_resubmit_window_secs = 0\n";
    let config = load(
        &format!("{GOOD}[outbox]\nbatch_size = 50\n{horizon}interval_secs = 60\n"),
        &[
            ("SB_INBOX_OUTBOX_POLL_MS", "250"),
            ("SB_INBOX_OUTBOX_LEASE_SECS", "30"),
            ("SB_INBOX_OUTBOX_ORDERED", "true"),
            ("SB_INBOX_RETENTION_BATCH", "4000"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.relay,
        RelayConfig {
            batch_size: 50,
            poll_interval: Duration::from_millis(250),
            lease: Duration::from_secs(30),
            ordered: true,
            ..RelayConfig::default()
        }
    );
    let task = config.retention.unwrap();
    assert_eq!(
        (task.retention, task.batch_size, task.interval),
        (Duration::from_secs(172_800), 4000, Duration::from_secs(60))
    );
    let defaults = load(&format!("{GOOD}{horizon}"), &[]).unwrap();
    let task = defaults.retention.unwrap();
    assert_eq!(
        (task.batch_size, task.interval),
        (1000, Duration::from_secs(300))
    );

    let errors = load(
        GOOD,
        &[
            ("SB_INBOX_OUTBOX_BATCH", "0"),
            ("SB_INBOX_OUTBOX_LEASE_SECS", "1"),
            ("SB_INBOX_RETENTION_BATCH", "5000"),
            ("SB_INBOX_RETENTION_INTERVAL_SECS", "60"),
        ],
    )
    .unwrap_err();
    let problems: Vec<String> = errors
        .0
        .iter()
        .map(|e| format!("{}: {}", e.field, e.problem))
        .collect();
    assert_eq!(
        problems,
        [
            "outbox.batch_size (SB_INBOX_OUTBOX_BATCH): 0 is outside 1..=1000",
            "outbox.lease_secs (SB_INBOX_OUTBOX_LEASE_SECS): 1 is outside 5..=3600",
            "retention.batch_size (SB_INBOX_RETENTION_BATCH): 5000 is outside 1..=4000",
            "retention.interval_secs (SB_INBOX_RETENTION_INTERVAL_SECS): has no effect without retention.retention_secs (SB_INBOX_RETENTION_SECS): nothing is deleted",
        ]
    );
}

#[test]
fn lock_margin_must_be_shorter_than_the_lock() {
    let errors = load(GOOD, &[("SB_INBOX_LOCK_DURATION_SECS", "5")]).unwrap_err();
    assert!(
        errors
            .to_string()
            .contains("shorter than the lock duration"),
        "{errors}"
    );
}

const LISTED: &str = r#"
store = "sqlite://inbox.db"
[servicebus]
connection = "Endpoint=sb://localhost:5699;SharedAccessKeyName=k;SharedAccessKey=SECRET;UseDevelopmentEmulator=true"
[runtime]
concurrency = 4
prefetch = 2
lock_margin_secs = 5
[[consumers]]
name = "shop.inventory"
entity = "orders"
[[consumers]]
name = "shop.payments"
entity = "payments/Subscriptions/ledger"
concurrency = 1
prefetch = 0
"#;

#[test]
fn consumers_listed_take_runtime_settings_as_defaults() {
    let config = load(LISTED, &[]).unwrap();
    let got: Vec<_> = config
        .consumers
        .iter()
        .map(|c| {
            (
                c.name().as_str(),
                c.entity.as_str(),
                c.runtime.concurrency,
                c.runtime.prefetch,
                c.runtime.lock_margin,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("shop.inventory", "orders", 4, 2, Duration::from_secs(5)),
            (
                "shop.payments",
                "payments/Subscriptions/ledger",
                1,
                0,
                Duration::from_secs(5)
            ),
        ]
    );
    // The first consumer doubles as the single-consumer fields.
    assert_eq!(
        (config.runtime.consumer.as_str(), config.entity.as_str()),
        ("shop.inventory", "orders")
    );
    // Without [[consumers]], the top-level keys make the only one.
    let single = load(GOOD, &[]).unwrap();
    assert_eq!(single.consumers.len(), 1);
    assert_eq!(single.consumers[0].entity, "orders");
}

#[test]
fn consumers_listed_are_checked_entry_by_entry() {
    let fields = |toml: &str, env: &[(&str, &str)]| -> Vec<String> {
        load(toml, env)
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| e.field)
            .collect()
    };
    let bad = format!(
        "{LISTED}[[consumers]]\nname = \"shop.inventory\"\n[[consumers]]\nname = \"Bad Name\"\nentity = \"x\"\nconcurrency = 0\n"
    );
    assert_eq!(
        fields(&bad, &[]),
        [
            "consumers[2].name",
            "consumers[2].entity",
            "consumers[3].name",
            "consumers[3].concurrency"
        ]
    );
    // Top-level consumer or entity beside the list is ambiguous.
    assert_eq!(
        fields(
            LISTED,
            &[("SB_INBOX_CONSUMER", "x"), ("SB_INBOX_ENTITY", "y")]
        ),
        [
            "consumer (SB_INBOX_CONSUMER)",
            "servicebus.entity (SB_INBOX_ENTITY)"
        ]
    );
    // Delayed retries refuse a subscription anywhere in the list.
    assert_eq!(
        fields(LISTED, &[("SB_INBOX_RETRY_MAX_RETRIES", "3")]),
        ["retry.max_retries (SB_INBOX_RETRY_MAX_RETRIES)"]
    );
}

/// What `load` logged at warn level and above, with its result.
fn load_logged(toml: &str, env: &[(&str, &str)]) -> (Result<WorkerConfig, ConfigErrors>, String) {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    // tracing caches each callsite's interest for the whole process, computed by the first
    // thread to reach it from that thread's default while at most one dispatcher exists
    // (tracing-core 0.1.36 `DefaultCallsite::register`, `Rebuilder::JustOne`): a sibling test
    // loading a config with no subscriber would cache `never` for a warning and blind this
    // scoped subscriber. A bare global registry makes two dispatchers, so interest is their union.
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
    let result = tracing::subscriber::with_default(subscriber, || load(toml, env));
    let logged = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    (result, logged)
}

#[test]
fn entity_settings_come_from_entity_or_their_old_place_with_a_warning() {
    let new = format!(
        "{GOOD}[entity]\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\n[retention]\nretention_secs = 87000\ndlq_resubmit_window_secs = 0\n"
    );
    let (config, logged) = load_logged(&new, &[]);
    let config = config.unwrap();
    assert_eq!(logged, "", "the new place is read quietly");
    assert_eq!(config.runtime.lock_duration, Some(Duration::from_secs(60)));
    let horizon = config.horizon.unwrap();
    assert_eq!(
        (horizon.message_ttl, horizon.max_delivery_count),
        (Duration::from_secs(86_400), 10)
    );

    let old = format!(
        "{GOOD}[retention]\nretention_secs = 87000\ndlq_resubmit_window_secs = 0\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\n"
    );
    let (config, logged) = load_logged(&old, &[]);
    let config = config.unwrap();
    assert_eq!(config.horizon, Some(horizon), "{logged}");
    assert_eq!(
        config.retention.unwrap().retention,
        Duration::from_secs(87_000)
    );
    for (old, new) in [
        ("retention.message_ttl_secs", "entity.message_ttl_secs"),
        ("retention.lock_duration_secs", "entity.lock_duration_secs"),
        ("retention.max_delivery_count", "entity.max_delivery_count"),
    ] {
        assert!(
            logged.lines().any(|line| line.contains("WARN")
                && line.contains(&format!("old=\"{old}\" new=\"{new}\""))),
            "{logged}"
        );
    }

    // Both places at once: which one is meant is unclear.
    let both = format!("{old}[entity]\nlock_duration_secs = 30\n");
    let errors = load(&both, &[]).unwrap_err();
    assert_eq!(
        errors.0[0].field, "entity.lock_duration_secs (SB_INBOX_LOCK_DURATION_SECS)",
        "{errors}"
    );
}

#[test]
fn every_key_has_its_own_variable_and_file_key() {
    assert_eq!(ENV_VARS.len(), KEYS.len());
    for (i, key) in KEYS.iter().enumerate() {
        assert_eq!(ENV_VARS[i], key.row());
        assert!(key.env.starts_with("SB_INBOX_"), "{key}");
        let others = &KEYS[i + 1..];
        assert!(
            !others
                .iter()
                .any(|o| o.env == key.env || o.file == key.file),
            "{key} twice"
        );
    }
    for moved in MOVED {
        assert!(KEYS.contains(&moved.new), "{}", moved.old);
        assert!(moved.new.file.starts_with("entity."), "{}", moved.old);
    }
}

/// Issue 29 item 15: the extra CA bundle comes from `servicebus.ca_file`, else `SSL_CERT_FILE`;
/// an unreadable one is a configuration problem naming the key.
#[test]
fn the_ca_bundle_comes_from_the_setting_or_ssl_cert_file_and_must_be_readable() {
    let config = load(GOOD, &[]).unwrap();
    assert_eq!(config.trust, crate::servicebus::TrustRoots::new());
    let missing = "/nonexistent/sb-inbox-ca.pem";
    for env in [
        ("SB_INBOX_SERVICEBUS_CA_FILE", missing),
        ("SSL_CERT_FILE", missing),
    ] {
        let problems = load(GOOD, &[env]).unwrap_err().to_string();
        assert!(
            problems.contains("servicebus.ca_file (SB_INBOX_SERVICEBUS_CA_FILE): cannot read the CA bundle /nonexistent/sb-inbox-ca.pem"),
            "{env:?}: {problems}"
        );
    }
    // The OS store of this machine may be unreadable; either way the setting is taken.
    match load(GOOD, &[("SB_INBOX_SERVICEBUS_NATIVE_ROOTS", "true")]) {
        Ok(config) => assert_eq!(
            config.trust,
            crate::servicebus::TrustRoots::new().with_native_roots()
        ),
        Err(problems) => assert!(
            problems
                .to_string()
                .contains("operating system's trust store"),
            "{problems}"
        ),
    }
}

/// Issue 29 item 15: `HTTPS_PROXY` / `NO_PROXY` reach the worker's client; a malformed proxy is
/// a configuration problem naming the variable.
#[test]
fn the_websocket_proxy_comes_from_https_proxy_and_no_proxy_and_must_parse() {
    use crate::servicebus::{HttpProxy, ProxyConfig};
    assert_eq!(load(GOOD, &[]).unwrap().proxy, ProxyConfig::none());
    let config = load(
        GOOD,
        &[
            ("https_proxy", "http://proxy.corp:3128"),
            ("NO_PROXY", ".internal"),
        ],
    )
    .unwrap();
    let proxy = HttpProxy {
        host: "proxy.corp".into(),
        port: 3128,
        authorization: None,
    };
    assert_eq!(
        config.proxy,
        ProxyConfig::through(proxy).with_no_proxy(".internal")
    );
    let problems = load(GOOD, &[("HTTPS_PROXY", "https://proxy.corp:3128")])
        .unwrap_err()
        .to_string();
    assert!(problems.contains("HTTPS_PROXY"), "{problems}");
    assert!(problems.contains("https:// proxies"), "{problems}");
}

/// Writes `text` as `name` in a directory of its own and loads it with `prefix`.
fn load_named(
    name: &str,
    text: &str,
    prefix: &str,
    env: &[(&str, &str)],
) -> Result<WorkerConfig, ConfigErrors> {
    let dir = std::env::temp_dir().join(format!(
        "sb-inbox-config-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let result =
        WorkerConfig::load_with_prefix(Some(&path), prefix, &|name| env.get(name).cloned());
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// README's "Use it in your service" configuration is valid JSON configuration, and its
/// prefix replaces `SB_INBOX_` for the overrides (a `SB_INBOX_*` variable is then ignored).
#[test]
fn the_readmes_json_configuration_loads_with_its_prefix() {
    let readme = include_str!("../../../README.md");
    let json = readme
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README has a ```json block");
    let config = load_named(
        "orders-worker.json",
        json,
        "ORDERS_",
        &[
            ("ORDERS_CONCURRENCY", "3"),
            ("SB_INBOX_CONCURRENCY", "99"),
            // README: the connection string comes from the environment.
            (
                "ORDERS_SERVICEBUS_CONNECTION",
                "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=s;UseDevelopmentEmulator=true",
            ),
        ],
    )
    .unwrap();
    assert_eq!(
        config.consumers[0].name().as_str(),
        "shop.order-confirmation"
    );
    assert_eq!(config.entity, "orders");
    assert_eq!(config.runtime.concurrency, 3);
    let retention = config.retention.expect("retention configured");
    assert_eq!(retention.retention, Duration::from_secs(2_592_000));
    let horizon = config
        .horizon
        .expect("the entity's settings give the horizon");
    assert!(horizon.check(retention.retention).is_ok());
}

/// A syntax error in a JSON file is reported against the file, like TOML's.
#[test]
fn a_broken_json_file_names_the_file() {
    let problems = load_named("worker.json", "{\"store\": ", "SB_INBOX_", &[])
        .unwrap_err()
        .to_string();
    assert!(problems.contains("worker.json"), "{problems}");
}

/// A MassTransit envelope of the reference order, for checking which reader a config built.
fn masstransit_order() -> crate::ports::Message {
    crate::ports::Message::new(
        "broker-1",
        "",
        r#"{"messageId":"mt-1","messageType":["urn:message:Shop.Contracts:OrderPlaced"],"message":{}}"#,
    )
    .with_content_type("application/vnd.masstransit+json")
}

const MASSTRANSIT: &str = r#"
[envelope]
kind = "masstransit"
[envelope.types]
"urn:message:Shop.Contracts:OrderPlaced" = "orders.order-placed.v1"
"#;

#[test]
fn the_envelope_is_the_subject_by_default_and_set_by_file_or_environment() {
    let config = load(GOOD, &[]).unwrap();
    assert_eq!(config.runtime.envelope.kind(), "subject");

    let config = load(&format!("{GOOD}{MASSTRANSIT}"), &[]).unwrap();
    assert_eq!(config.consumers[0].runtime.envelope.kind(), "masstransit");
    let order = masstransit_order();
    let opened = config.runtime.envelope.open(&order).unwrap();
    assert_eq!(
        opened.contract,
        crate::envelope::Contract::new("orders.order-placed", 1)
    );
    assert_eq!(opened.id.as_deref(), Some("mt-1"));

    let config = load(
        GOOD,
        &[
            ("SB_INBOX_ENVELOPE", "masstransit"),
            (
                "SB_INBOX_ENVELOPE_TYPES",
                "urn:message:Shop.Contracts:OrderPlaced=orders.order-placed.v1; urn:message:X:Y = x.y.v2",
            ),
        ],
    )
    .unwrap();
    let opened = config.runtime.envelope.open(&order).unwrap();
    assert_eq!(
        opened.contract,
        crate::envelope::Contract::new("orders.order-placed", 1)
    );

    let raw = "[envelope]\nkind = \"raw\"\ncontract = \"orders.order-placed.v1\"\nid_from = \"pointer:/orderId\"\n";
    let config = load(&format!("{GOOD}{raw}"), &[]).unwrap();
    let message = crate::ports::Message::new("b", "", r#"{"orderId":"o-9"}"#);
    let opened = config.runtime.envelope.open(&message).unwrap();
    assert_eq!(opened.id.as_deref(), Some("o-9"));
}

#[test]
fn each_consumer_has_its_own_envelope_or_the_top_level_one() {
    let toml = LISTED.replacen(
        "[[consumers]]\nname = \"shop.payments\"",
        "[consumers.envelope]\nkind = \"nservicebus\"\n[consumers.envelope.types]\n\"A\" = \"a.v1\"\n[[consumers]]\nname = \"shop.payments\"",
        1,
    );
    let config = load(
        &format!("{toml}[envelope]\nkind = \"cloudevents\"\n[envelope.types]\n\"b\" = \"b.v1\"\n"),
        &[],
    )
    .unwrap();
    let kinds: Vec<_> = config
        .consumers
        .iter()
        .map(|c| c.runtime.envelope.kind())
        .collect();
    assert_eq!(kinds, ["nservicebus", "cloudevents"]);
    assert_eq!(
        load(LISTED, &[]).unwrap().consumers[1]
            .runtime
            .envelope
            .kind(),
        "subject"
    );
}

#[test]
fn bad_envelope_settings_are_refused_naming_the_key() {
    let fields = |extra: &str, env: &[(&str, &str)]| -> Vec<String> {
        load(&format!("{GOOD}{extra}"), env)
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.problem))
            .collect()
    };
    let one = |extra: &str, env: &[(&str, &str)]| {
        let got = fields(extra, env);
        assert_eq!(got.len(), 1, "{got:?}");
        got[0].clone()
    };
    let unknown = one("", &[("SB_INBOX_ENVELOPE", "rebus")]);
    assert!(
        unknown.starts_with("envelope.kind (SB_INBOX_ENVELOPE): \"rebus\" is not an envelope kind; one of: subject, masstransit"),
        "{unknown}"
    );
    let not_raw = one(
        "[envelope]\nkind = \"masstransit\"\nid_from = \"property:id\"\n[envelope.types]\n\"a\" = \"b.v1\"\n",
        &[],
    );
    assert!(
        not_raw.starts_with(
            "envelope.id_from (SB_INBOX_ENVELOPE_ID_FROM): is for envelope.kind = \"raw\""
        ),
        "{not_raw}"
    );
    let orphan = one("[envelope.types]\n\"a\" = \"b.v1\"\n", &[]);
    assert!(
        orphan.starts_with(
            "envelope.types (SB_INBOX_ENVELOPE_TYPES): has no effect without envelope.kind"
        ),
        "{orphan}"
    );
    let unversioned = one(
        "[envelope]\nkind = \"cloudevents\"\n[envelope.types]\n\"com.x\" = \"orders.order-placed\"\n",
        &[],
    );
    assert!(unversioned.contains("without a version"), "{unversioned}");
    let bad_contract = one(
        "[envelope]\nkind = \"nservicebus\"\n[envelope.types]\n\"A\" = \"has space.v1\"\n",
        &[],
    );
    assert!(bad_contract.starts_with("envelope.types"), "{bad_contract}");
    let no_contract = one("[envelope]\nkind = \"raw\"\n", &[]);
    assert!(
        no_contract
            .starts_with("envelope.contract (SB_INBOX_ENVELOPE_CONTRACT): the raw envelope needs"),
        "{no_contract}"
    );
    let bad_field = one(
        "[envelope]\nkind = \"raw\"\ncontract_from = \"header:x\"\n",
        &[],
    );
    assert!(
        bad_field.starts_with("envelope.contract_from"),
        "{bad_field}"
    );
    let bad_pairs = one(
        "",
        &[
            ("SB_INBOX_ENVELOPE", "masstransit"),
            ("SB_INBOX_ENVELOPE_TYPES", "no-equals"),
        ],
    );
    assert!(
        bad_pairs.starts_with(
            "envelope.types (SB_INBOX_ENVELOPE_TYPES): \"no-equals\" is not TYPE=CONTRACT"
        ),
        "{bad_pairs}"
    );
    let subject_types = one(
        "[envelope]\nkind = \"subject\"\n[envelope.types]\n\"a\" = \"b.v1\"\n",
        &[],
    );
    assert!(
        subject_types.contains("takes no type map"),
        "{subject_types}"
    );
    // An unknown key in the table is the file's own error, naming the key.
    let typo = load(&format!("{GOOD}[envelope]\nknd = \"raw\"\n"), &[])
        .unwrap_err()
        .to_string();
    assert!(typo.contains("knd"), "{typo}");
    // A [[consumers]] entry's problems name the entry.
    let entry = LISTED.replacen(
        "[[consumers]]\nname = \"shop.payments\"",
        "[consumers.envelope]\nkind = \"bogus\"\n[[consumers]]\nname = \"shop.payments\"",
        1,
    );
    let errors = load(&entry, &[]).unwrap_err();
    assert_eq!(errors.0[0].field, "consumers[0].envelope.kind", "{errors}");
}

#[test]
fn unknown_contracts_at_runtime_level_per_consumer_and_from_the_environment() {
    use crate::runtime::UnknownContracts::{Complete, DeadLetter};
    let outcomes = |config: &WorkerConfig| -> Vec<_> {
        config
            .consumers
            .iter()
            .map(|c| c.runtime.unknown_contracts)
            .collect()
    };
    assert_eq!(
        outcomes(&load(LISTED, &[]).unwrap()),
        [DeadLetter, DeadLetter]
    );
    let file = LISTED.replace(
        "prefetch = 0\n",
        "prefetch = 0\nunknown_contracts = \"complete\"\n",
    );
    assert_eq!(outcomes(&load(&file, &[]).unwrap()), [DeadLetter, Complete]);
    let env = [("SB_INBOX_UNKNOWN_CONTRACTS", "complete")];
    assert_eq!(outcomes(&load(GOOD, &env).unwrap()), [Complete]);
    let file = format!("{GOOD}unknown_contracts = \"complete\"\n");
    assert_eq!(
        load(&file, &[]).unwrap().runtime.unknown_contracts,
        Complete
    );

    let file = LISTED.replace(
        "prefetch = 0\n",
        "prefetch = 0\nunknown_contracts = \"drop\"\n",
    );
    let errors = load(&file, &[("SB_INBOX_UNKNOWN_CONTRACTS", "skip")]).unwrap_err();
    let fields: Vec<String> = errors.0.iter().map(|e| e.field.clone()).collect();
    assert!(
        fields.contains(&"consumers[1].unknown_contracts".to_owned()),
        "{fields:?}"
    );
    assert!(
        fields
            .iter()
            .any(|f| f.contains("SB_INBOX_UNKNOWN_CONTRACTS")),
        "{fields:?}"
    );
    assert!(
        errors
            .to_string()
            .contains("\"dead-letter\" or \"complete\""),
        "{errors}"
    );
}

/// Issue 45: under a prefix of the service's own, every problem and hint names the variable
/// that was read (`ORDERS_*`), never `SB_INBOX_*`, which setting would change nothing.
#[test]
fn problems_name_the_variables_read_under_the_callers_prefix() {
    let problems = load_named(
        "orders-worker.json",
        r#"{"consumer": "shop.orders", "servicebus": {"entity": "orders"},
            "entity": {"message_ttl_secs": 1209600, "lock_duration_secs": 60, "max_delivery_count": 10},
            "retention": {"retention_secs": 60}}"#,
        "ORDERS_",
        &[("ORDERS_CONCURRENCY", "zero")],
    )
    .unwrap_err()
    .to_string();
    for named in [
        "store (ORDERS_STORE): required",
        "servicebus.connection (ORDERS_SERVICEBUS_CONNECTION)",
        "runtime.concurrency (ORDERS_CONCURRENCY): \"zero\" is not a whole number",
        "raise ORDERS_RETENTION_SECS",
    ] {
        assert!(problems.contains(named), "{named} not in {problems}");
    }
    assert!(!problems.contains("SB_INBOX_"), "{problems}");
}

/// Issue 45: a misspelt variable under the prefix is found, with the key it most likely meant;
/// the keys' own variables and names outside the prefix are not.
#[test]
fn a_misspelt_variable_is_found_with_the_nearest_key() {
    let unknown = WorkerConfig::unknown_variables(
        "ORDERS_",
        [
            "ORDERS_CONCURENCY",
            "ORDERS_STORE",
            "ORDERS_SERVICEBUS_CONECTION",
            "PATH",
            "SB_INBOX_CONCURENCY",
        ],
    );
    let found: Vec<(&str, &str)> = unknown
        .iter()
        .map(|u| (u.name.as_str(), u.nearest.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("ORDERS_CONCURENCY", "ORDERS_CONCURRENCY"),
            (
                "ORDERS_SERVICEBUS_CONECTION",
                "ORDERS_SERVICEBUS_CONNECTION"
            ),
        ]
    );
}

/// Issue 45: MassTransit without a type map would dead-letter every message; the load refuses
/// it, naming the variable under the service's prefix.
#[test]
fn an_envelope_without_a_type_map_is_refused_naming_the_variable() {
    let problems = load_named(
        "orders-worker.json",
        r#"{"consumer": "shop.orders", "store": "sqlite://inbox.db", "servicebus": {"entity": "orders",
            "connection": "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=s;UseDevelopmentEmulator=true"}}"#,
        "ORDERS_",
        &[("ORDERS_ENVELOPE", "masstransit")],
    )
    .unwrap_err()
    .0;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].field, "envelope.types (ORDERS_ENVELOPE_TYPES)");
    assert!(
        problems[0].problem.contains("needs a type map"),
        "{problems:?}"
    );
}

/// Issue 45: `outbox.destination` was the reference consumer's key, not the library's. A file
/// that still carries it is refused, in TOML and JSON and under any prefix, naming where it
/// went (the `sb-inbox` binary's `SB_INBOX_OUTBOX_DESTINATION`, whatever the caller's prefix),
/// and the variable itself is no longer a key's override.
#[test]
fn the_reference_consumers_outbox_destination_is_refused_naming_where_it_went() {
    let problems = load(&format!("{GOOD}[outbox]\ndestination = \"events\"\n"), &[])
        .unwrap_err()
        .to_string();
    assert!(
        problems.contains("outbox.destination: is no longer read"),
        "{problems}"
    );
    assert!(
        problems.contains("`sb-inbox run` reads SB_INBOX_OUTBOX_DESTINATION"),
        "{problems}"
    );
    let problems = load_named(
        "orders-worker.json",
        r#"{"consumer": "shop.orders", "store": "sqlite::memory:",
            "servicebus": {"connection": "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=s;UseDevelopmentEmulator=true", "entity": "orders"},
            "outbox": {"destination": "events"}}"#,
        "ORDERS_",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        problems.contains("`sb-inbox run` reads SB_INBOX_OUTBOX_DESTINATION"),
        "{problems}"
    );
    assert!(
        !problems.contains("ORDERS_OUTBOX_DESTINATION"),
        "{problems}"
    );
    assert!(KEYS.iter().all(|k| k.file != "outbox.destination"));
    assert_eq!(
        WorkerConfig::unknown_variables("SB_INBOX_", ["SB_INBOX_OUTBOX_DESTINATION"]).len(),
        1
    );
}
