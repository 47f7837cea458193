//! The servicebus-emulator workflow (issue 13), which runs only in GitHub Actions, agrees with
//! what it starts and runs: the compose file it uses sets Microsoft's emulator up as its docs
//! describe, mounting the Config.json the workflow names, on a SQL Server that still runs
//! (issue 31), every image pinned; the connection string is the documented one; and the tests it
//! filters on exist and read the variable it sets. The release workflow (issue 31) builds its
//! attestations on a builder that supports them and logs in to Azure with an OIDC subject one
//! federated credential matches for every tag.

use crate::read;

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
        "${CONFIG_PATH",
        ":/ServiceBus_Emulator/ConfigFiles/Config.json",
        "SQL_SERVER:",
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

/// The services of a compose file by name, each with its lines.
fn services(compose: &str) -> Vec<(String, Vec<String>)> {
    let mut services: Vec<(String, Vec<String>)> = Vec::new();
    let mut inside = false;
    for line in compose.lines() {
        if !line.starts_with(' ') {
            inside = line.trim_end() == "services:";
            continue;
        }
        if !inside {
            continue;
        }
        match line.strip_prefix("  ").and_then(|l| l.strip_suffix(':')) {
            Some(name) if !name.starts_with(' ') => services.push((name.to_owned(), Vec::new())),
            _ => {
                if let Some((_, lines)) = services.last_mut() {
                    lines.push(line.trim().to_owned());
                }
            }
        }
    }
    services
}

fn value<'l>(lines: &'l [String], key: &str) -> Option<&'l str> {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{key}: ")))
        .map(|v| v.trim_matches('"'))
}

/// Azure SQL Edge was retired in September 2025 and crashes on current runner kernels: the
/// emulator's SQL_SERVER names a service running Microsoft's SQL Server image, and every image
/// is pinned by version so an upstream release cannot change the job.
#[test]
fn the_emulator_runs_on_sql_server_with_pinned_images() {
    let compose = read(".github/servicebus-emulator/docker-compose.yml");
    let services = services(&compose);
    assert!(services.len() >= 2, "{services:?}");
    for (name, lines) in &services {
        let image = value(lines, "image").unwrap_or_else(|| panic!("{name}: no image"));
        assert!(
            !image.contains("azure-sql-edge"),
            "{name}: Azure SQL Edge is retired ({image})"
        );
        let tag = image.rsplit_once(':').map(|(_, tag)| tag).unwrap_or("");
        assert!(
            tag != "latest" && tag.starts_with(|c: char| c.is_ascii_digit()),
            "{name}: {image} is not pinned by version"
        );
    }
    let emulator = services
        .iter()
        .find(|(_, lines)| {
            value(lines, "image").is_some_and(|i| {
                i.starts_with("mcr.microsoft.com/azure-messaging/servicebus-emulator:")
            })
        })
        .expect("the emulator service");
    let sql_server = value(&emulator.1, "SQL_SERVER").expect("SQL_SERVER");
    let (name, database) = services
        .iter()
        .find(|(name, lines)| {
            name == sql_server || lines.iter().any(|l| l == &format!("- {sql_server}"))
        })
        .unwrap_or_else(|| panic!("SQL_SERVER {sql_server} names no service or alias"));
    let image = value(database, "image").unwrap();
    assert!(
        image.starts_with("mcr.microsoft.com/mssql/server:"),
        "{name}: the emulator's SQL_SERVER runs {image}, not Microsoft's SQL Server image"
    );
    // It waits for SQL Server to answer, which takes longer than SQL Edge did.
    assert!(
        emulator.1.iter().any(|l| l == "condition: service_healthy")
            && database
                .iter()
                .any(|l| l.starts_with("test:") && l.contains("sqlcmd")),
        "the emulator waits for a healthy SQL Server"
    );
}

/// `--provenance`/`--sbom` fail on the runner's default `docker` driver ("Attestation is not
/// supported for the docker driver"): a docker-container builder is created and used first.
#[test]
fn the_release_attests_on_a_docker_container_builder() {
    let release = read(".github/workflows/release.yml");
    let create = release
        .lines()
        .position(|l| l.contains("docker buildx create"))
        .expect("release.yml creates a buildx builder");
    let create_line = release.lines().nth(create).unwrap();
    assert!(
        create_line.contains("--driver docker-container") && create_line.contains("--use"),
        "{create_line}"
    );
    let build = release
        .lines()
        .position(|l| l.contains("--provenance=true") || l.contains("--sbom=true"))
        .expect("release.yml builds with attestations");
    assert!(
        create < build,
        "the builder must exist before the attested build"
    );
}

/// A tag push's OIDC subject is repo:O/R:ref:refs/tags/vX.Y.Z, different for every tag, and a
/// federated credential matches one subject exactly: the job that logs in to Azure runs in the
/// `release` environment (subject repo:O/R:environment:release) and the docs give that credential.
#[test]
fn the_release_logs_in_to_azure_from_the_release_environment() {
    let release = read(".github/workflows/release.yml");
    let jobs = &release[release.find("\njobs:").expect("jobs")..];
    let mut job_start = 0;
    let mut checked = false;
    let lines: Vec<&str> = jobs.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let is_job = line.starts_with("  ") && !line.starts_with("   ") && line.ends_with(':');
        if is_job {
            job_start = i;
        }
        if line.contains("az login") {
            let end = lines[i..]
                .iter()
                .position(|l| l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(':'))
                .map_or(lines.len(), |p| i + p);
            let job = &lines[job_start..end];
            assert!(
                job.iter().any(|l| l.trim() == "environment: release"
                    && l.starts_with("    ")
                    && !l.starts_with("     ")),
                "the job logging in to Azure must run in the release environment"
            );
            assert!(job.iter().any(|l| l.contains("id-token: write")));
            checked = true;
        }
    }
    assert!(checked, "release.yml logs in to Azure");
    let docs = read("docs/deploy.md");
    for needed in [
        "az identity federated-credential create",
        "--subject repo:OWNER/REPO:environment:release",
        "--issuer https://token.actions.githubusercontent.com",
        "--audiences api://AzureADTokenExchange",
    ] {
        assert!(docs.contains(needed), "docs/deploy.md lacks {needed:?}");
    }
}

/// Builds that can change under an unchanged commit: every base image is pinned by digest, and
/// the Bicep CLI whose linter rules bicepconfig.json raises to errors is pinned by version.
#[test]
fn base_images_and_the_bicep_cli_are_pinned() {
    let dockerfile = read("Dockerfile");
    let from: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert!(from.len() >= 2, "{from:?}");
    for line in from {
        assert!(line.contains("@sha256:"), "not pinned by digest: {line}");
    }
    let infra = read(".github/workflows/infra.yml");
    let install: Vec<&str> = infra
        .lines()
        .filter(|l| l.trim_start().starts_with("az bicep install"))
        .collect();
    assert!(!install.is_empty());
    for line in install {
        assert!(
            line.contains("--version v"),
            "az bicep install without a pinned version: {line}"
        );
    }
}

/// Issue 43: the servicebus-emulator workflow runs `sb-inbox verify` against Microsoft's
/// emulator on queues its Config.json declares (verify's session scenario on one that requires
/// sessions, the lock-loss scenario on a short lock), accepting exit 3 (skips) but not 1; and
/// against a real namespace only when the secret exists, with a visible notice otherwise.
#[test]
fn the_workflows_run_verify_against_microsofts_emulator_and_a_namespace_when_given() {
    let workflow = read(".github/workflows/servicebus-emulator.yml");
    for needed in [
        "SB_INBOX_SERVICEBUS_CONNECTION=\"$SB_INBOX_EXTERNAL_SERVICEBUS\" target/debug/sb-inbox verify",
        "--queue verify.q --session-queue verify.sessions",
        "[ \"$code\" = 0 ] || [ \"$code\" = 3 ]",
        "--html verify-emulator.html",
        "verify-namespace:",
        "SB_INBOX_SERVICEBUS_CONNECTION: ${{ secrets.SB_INBOX_VERIFY_CONNECTION }}",
        "if: env.SB_INBOX_SERVICEBUS_CONNECTION == ''",
        "::notice title=verify-namespace skipped::",
        "--idle-secs 660 --token-refresh",
    ] {
        assert!(workflow.contains(needed), "workflow lacks {needed:?}");
    }
    // Every step of the namespace job but the notice is guarded by the secret: without it
    // nothing runs (and nothing fails), with it the verify step runs.
    let job = workflow
        .split("  verify-namespace:")
        .nth(1)
        .and_then(|rest| rest.split("\n  external-servicebus:").next())
        .unwrap();
    let steps = job.matches("\n      - ").count();
    let guarded = job
        .matches("if: env.SB_INBOX_SERVICEBUS_CONNECTION != ''")
        .count();
    assert_eq!(steps, guarded + 1, "{job}");

    let config: serde_json::Value =
        serde_json::from_str(&read(".github/servicebus-emulator/Config.json")).unwrap();
    let queue = |name: &str| {
        config["UserConfig"]["Namespaces"][0]["Queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["Name"] == name)
            .unwrap_or_else(|| panic!("{name} not in Config.json"))["Properties"]
            .clone()
    };
    let plain = queue("verify.q");
    assert_eq!(plain["RequiresSession"], false);
    assert_eq!(plain["RequiresDuplicateDetection"], false);
    // verify's lock-loss scenario waits for the redelivery of a lock its child lets expire.
    assert_eq!(plain["LockDuration"], "PT5S");
    assert_eq!(queue("verify.sessions")["RequiresSession"], true);

    // The SQL Server job runs verify with an mssql:// store on its SQL Server's credentials,
    // through .ci/verify (which takes VERIFY_STORES instead of its default stores), after the
    // store tests; then checks that nothing named sbv_ is left.
    let ci = read(".github/workflows/ci.yml");
    let mssql = ci
        .split("\n  mssql:\n")
        .nth(1)
        .map(|job| job.split("\n  # ").next().unwrap_or(job))
        .expect("the mssql job");
    let password = "SbInbox_ci_Passw0rd";
    assert!(
        mssql.contains(&format!("MSSQL_SA_PASSWORD: {password}")),
        "{mssql}"
    );
    let store = format!(
        "VERIFY_STORES: mssql://sa:{password}@127.0.0.1:1433/test?encrypt=true&trustServerCertificate=true"
    );
    let tests_at = mssql
        .find("cargo test --test store --test runtime")
        .unwrap();
    let verify_at = mssql
        .find(&store)
        .unwrap_or_else(|| panic!("{store} not in {mssql}"));
    let run_at = verify_at
        + mssql[verify_at..]
            .find("run: .ci/verify")
            .expect(".ci/verify runs");
    let check_at = mssql.find("verify left no scratch schema or user").unwrap();
    assert!(tests_at < verify_at && run_at < check_at, "{mssql}");
    for check in [
        "name LIKE 'sbv[_]%'",
        "sys.schemas",
        "sys.database_principals",
        "[ \"$left\" = 0 ]",
    ] {
        assert!(mssql[check_at..].contains(check), "{check}");
    }
    let script = read(".ci/verify");
    assert!(
        script.contains("${VERIFY_STORES:-$DATABASE_URL sqlite://$scratch/verify.db}"),
        "{script}"
    );
    // verify takes the mssql store (the URL parses as one) and builds it by default.
    let store_url: sb_inbox::store::StoreUrl =
        store.trim_start_matches("VERIFY_STORES: ").parse().unwrap();
    assert!(matches!(store_url, sb_inbox::store::StoreUrl::Mssql(_)));
    let verify = read("crates/cli/src/verify/mod.rs");
    assert!(verify.contains("StoreUrl::Mssql(text) => run.on_mssql(text)"));
    let cli = read("crates/cli/Cargo.toml");
    assert!(
        cli.contains("default = [\"postgres\", \"sqlite\", \"mssql\""),
        "{cli}"
    );
}
