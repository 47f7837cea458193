//! The servicebus-emulator workflow (issue 13), which runs only in GitHub Actions, agrees with
//! what it starts and runs: the compose file it uses sets Microsoft's emulator up as its docs
//! describe, mounting the Config.json the workflow names; the connection string is the
//! documented one; and the tests it filters on exist and read the variable it sets.

use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_servicebus_emulator_job_starts_what_its_tests_need() {
    let workflow = read(".github/workflows/servicebus-emulator.yml");
    let compose = read(".github/servicebus-emulator/docker-compose.yml");
    let tests = read("tests/servicebus/external.rs");
    for needed in [
        "COMPOSE_FILE: .github/servicebus-emulator/docker-compose.yml",
        "CONFIG_PATH: ${{ github.workspace }}/.github/servicebus-emulator/Config.json",
        "ACCEPT_EULA: \"Y\"",
        "MSSQL_SA_PASSWORD:",
        "SB_INBOX_EXTERNAL_SERVICEBUS: \"Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;\"",
        "http://localhost:5300/health",
        "cargo test --test servicebus external::",
        "skipped: external::",
    ] {
        assert!(workflow.contains(needed), "workflow lacks {needed:?}");
    }
    for needed in [
        "image: mcr.microsoft.com/azure-messaging/servicebus-emulator:",
        "image: mcr.microsoft.com/azure-sql-edge:",
        "${CONFIG_PATH",
        ":/ServiceBus_Emulator/ConfigFiles/Config.json",
        "SQL_SERVER: sqledge",
        "MSSQL_SA_PASSWORD:",
        "ACCEPT_EULA:",
        "\"5672:5672\"",
        "\"5300:5300\"",
    ] {
        assert!(compose.contains(needed), "compose file lacks {needed:?}");
    }
    assert!(
        tests.contains("const ENV: &str = \"SB_INBOX_EXTERNAL_SERVICEBUS\";")
            && tests.contains("const CONFIG: &str = \".github/servicebus-emulator/Config.json\";"),
        "the external tests read the variable and config the workflow sets"
    );
    // Every queue the external tests use is in the Config.json the emulator loads.
    let config: serde_json::Value =
        serde_json::from_str(&read(".github/servicebus-emulator/Config.json")).unwrap();
    let queues: Vec<&str> = config["UserConfig"]["Namespaces"][0]["Queues"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|q| q["Name"].as_str())
        .collect();
    let used: Vec<&str> = tests
        .lines()
        .filter_map(|line| line.trim().strip_prefix("const QUEUE: &str = \""))
        .filter_map(|rest| rest.strip_suffix("\";"))
        .collect();
    assert!(used.len() >= 6, "{used:?}");
    for queue in used {
        assert!(queues.contains(&queue), "{queue} missing from Config.json");
    }
    // Microsoft's limits (Config-schema.json): lock 5 s to 5 min, 1 to 10 deliveries, at most
    // 50 entities, the namespace named sbemulatorns.
    assert_eq!(
        config["UserConfig"]["Namespaces"][0]["Name"],
        "sbemulatorns"
    );
    assert!(queues.len() <= 50);
    for queue in config["UserConfig"]["Namespaces"][0]["Queues"]
        .as_array()
        .unwrap()
    {
        let count = queue["Properties"]["MaxDeliveryCount"].as_i64().unwrap();
        assert!((1..=10).contains(&count), "{queue}");
    }
}
