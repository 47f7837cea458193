//! The fourth deployment review (issue 44, `../shared/reviews/deploy4.md`): one test per finding,
//! named by its number (`b1_…`, `major_m1_…` for the majors, `m1_…` for the minors), each
//! failing on the templates, workflows and docs before the fix. What only Azure can confirm is
//! the checklist in docs/deploy.md ("First real deployment"), checked by `m11_…`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::database::{FakeTools, position};
use crate::deployment::{stand_in_unknowns, with, worker_app};
use crate::eval::{Scope, Value};
use crate::{deployment, read};

fn private() -> (&'static str, Value) {
    ("databaseNetwork", Value::Str("private".into()))
}

/// The docs' section starting at `heading`, up to the next heading of the same or a higher
/// level.
fn section(docs: &str, heading: &str) -> String {
    let start = docs
        .find(heading)
        .unwrap_or_else(|| panic!("docs/deploy.md lacks {heading:?}"));
    let level = heading.chars().take_while(|c| *c == '#').count();
    let rest = &docs[start + heading.len()..];
    let end = rest
        .match_indices("\n#")
        .find(|(i, _)| {
            let hashes = rest[i + 1..].chars().take_while(|c| *c == '#').count();
            hashes <= level && rest[i + 1 + hashes..].starts_with(' ')
        })
        .map_or(rest.len(), |(i, _)| i);
    rest[..end].to_owned()
}

/// Every resource name the deployment creates with `overrides`, across main and its modules.
fn resource_names(overrides: &[(&str, Value)]) -> BTreeSet<String> {
    let deployment = deployment();
    let main = Scope::main_with(&deployment, with(overrides));
    let mut resources = main.resources(Path::new("main.bicep"));
    for path in deployment.bicep.keys().filter(|p| p.starts_with("modules")) {
        let module = main.module(&deployment, path.to_str().unwrap());
        resources.extend(module.resources(path));
    }
    resources
        .iter()
        .filter(|r| r.condition != Value::Bool(false))
        .filter_map(|r| {
            r.body
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

fn words_after<'t>(text: &'t str, flag: &str) -> Vec<&'t str> {
    text.match_indices(flag)
        .filter_map(|(i, _)| text[i + flag.len()..].split_whitespace().next())
        .collect()
}

/// B1: the private path works end to end. The VNet declares a `management` subnet inline (so
/// infra/setup-database.sh's redeployment keeps it instead of failing on a hand-made one), peered
/// or hub VNets can be linked to the zone (or an existing zone used), the docs say the template
/// owns the subnets, and the walk-through from an empty subscription names only resources,
/// outputs, parameters and files that exist, each step with the identity it runs as. The setup
/// script opens no firewall rule on the private path.
#[test]
fn b1_the_private_path_has_a_management_subnet_zone_links_and_a_walkthrough_the_templates_back() {
    let deployment = deployment();
    let hub = "/subscriptions/s/resourceGroups/hub/providers/Microsoft.Network/virtualNetworks/hub";
    let main = Scope::main_with(
        &deployment,
        with(&[
            private(),
            (
                "dnsZoneLinkVnetIds",
                Value::Array(vec![Value::Str(hub.into())]),
            ),
        ]),
    );
    let network = main.module(&deployment, "modules/network.bicep");
    let vnet = network.resource("vnet");
    let vnet_name = vnet.get("name").and_then(Value::as_str).unwrap().to_owned();
    let subnets: Vec<String> = vnet
        .path("properties.subnets")
        .unwrap()
        .items()
        .iter()
        .filter_map(|s| s.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    assert!(
        subnets.iter().any(|s| s == "management"),
        "no management subnet declared inline: {subnets:?}"
    );
    let links: Vec<_> = network
        .resources(Path::new("modules/network.bicep"))
        .into_iter()
        .filter(|r| r.kind == "Microsoft.Network/privateDnsZones/virtualNetworkLinks")
        .filter(|r| r.body.path("properties.virtualNetwork.id") == Some(&Value::Str(hub.into())))
        .collect();
    assert_eq!(links.len(), 1, "the hub VNet is linked to the zone");

    let docs = read("docs/deploy.md");
    assert!(docs.contains("The template owns the VNet's subnets"));

    // The walk-through: names, outputs, parameters and files it uses exist.
    let walk = section(&docs, "### The private path from an empty subscription");
    let names = resource_names(&[private()]);
    for vnet in words_after(&walk, "--vnet-name ") {
        assert_eq!(vnet, vnet_name, "the walk-through names another VNet");
    }
    for line in walk
        .lines()
        .filter(|l| l.contains("az network vnet subnet show"))
    {
        let subnet = words_after(line, " -n ")[0];
        assert!(
            subnets.iter().any(|s| s == subnet),
            "{subnet} not in {subnets:?}"
        );
    }
    let mut named = 0;
    for token in walk.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        if !token.starts_with("sbinbox-dev-") || token.starts_with("sbinbox-dev-mgmt") {
            continue; // the machine the walk-through itself creates
        }
        if token == "sbinbox-dev-sql-" {
            continue; // the server, `<unique>` suffix written out
        }
        named += 1;
        assert!(
            names.contains(token),
            "the walk-through names {token}, which the templates do not create"
        );
    }
    assert!(
        named >= 3,
        "the walk-through names the template's resources"
    );
    let main_file = crate::bicep::parse(&deployment.bicep[Path::new("main.bicep")]).unwrap();
    for param in words_after(&walk, "`param ") {
        assert!(main_file.param(param).is_some(), "no parameter {param}");
    }
    for path in words_after(&walk, " infra/") {
        let path = path.trim_end_matches(['`', ')', ',']);
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("infra")
                .join(path)
                .exists(),
            "infra/{path}"
        );
    }
    // Every numbered step says who runs it.
    let steps: Vec<&str> = walk
        .lines()
        .filter(|l| {
            l.split_once(". ")
                .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
        })
        .collect();
    assert!(steps.len() >= 9, "{steps:#?}");
    for step in &steps {
        assert!(step.contains(". **"), "step without its identity: {step}");
    }
    for needed in [
        "az deployment group create",
        "infra/setup-database.sh",
        "az vm create",
    ] {
        assert!(walk.contains(needed), "the walk-through lacks {needed}");
    }

    // On the private path the setup script opens no firewall rule.
    let tools = FakeTools::with("b1-private", "Succeeded", "private", 0);
    let (code, calls) = tools.run_setup();
    assert_eq!(code, Some(0), "{calls:#?}");
    assert!(
        !calls.iter().any(|c| c.contains("firewall-rule")),
        "{calls:#?}"
    );
}

/// M1: the first connection of setup-database.sh is retried (a firewall rule takes minutes, a
/// paused database resumes), every sqlcmd call too, and the migrate job retries an execution.
#[test]
fn major_m1_the_setup_retries_and_the_migrate_job_retries() {
    let tools = FakeTools::with("m1-retry", "Succeeded", "azureServices", 2);
    let (code, calls) = tools.run_setup();
    assert_eq!(
        code,
        Some(0),
        "two failed connections are retried: {calls:#?}"
    );
    let sqlcmd: Vec<&String> = calls.iter().filter(|c| c.starts_with("sqlcmd")).collect();
    assert!(
        sqlcmd.iter().take(3).all(|c| c.contains("SELECT 1")),
        "the first connection is polled until it succeeds: {sqlcmd:#?}"
    );
    let users = position(&calls, &["sqlcmd", "Role=worker"]);
    let start = position(&calls, &["containerapp job start"]);
    assert!(users < start);

    let deployment = deployment();
    let main = Scope::main(&deployment);
    let job = main
        .module(&deployment, "modules/containerapp.bicep")
        .resource("migrateJob");
    let retries = job
        .path("properties.configuration.replicaRetryLimit")
        .and_then(Value::as_int)
        .unwrap();
    assert!(retries >= 2, "replicaRetryLimit {retries}");
    // sb-inbox migrate retries unavailable errors (unit tests: crates/cli/src/retry.rs).
    let cli = read("crates/cli/src/main.rs");
    assert!(
        cli.contains("retry::until_available("),
        "sb-inbox migrate connects once"
    );
}

/// M2: the docs list the roles the deployer needs, every role id the templates assign, and the
/// least-privilege option (RBAC Administrator constrained by a condition).
#[test]
fn major_m2_the_docs_list_the_deployer_roles_with_the_least_privilege_option() {
    let docs = read("docs/deploy.md");
    let who = section(&docs, "### Who deploys");
    for needed in [
        "Contributor alone fails",
        "Role Based Access Control Administrator",
        "--condition",
        "roleAssignments/write",
    ] {
        assert!(who.contains(needed), "\"Who deploys\" lacks {needed}");
    }
    let deployment = deployment();
    let mut ids = BTreeSet::new();
    for source in deployment.bicep.values() {
        for line in source
            .lines()
            .filter(|l| l.trim_start().starts_with("var role"))
        {
            if let Some(id) = line.split('\'').nth(1) {
                ids.insert(id.to_owned());
            }
        }
    }
    assert!(ids.len() >= 5, "{ids:?}");
    for id in ids {
        assert!(
            who.contains(&id),
            "role {id} assigned by the templates, not in \"Who deploys\""
        );
    }
}

/// M3: an ABAC-mode registry (roleAssignmentMode AbacRepositoryPermissions) does not honour
/// AcrPull: the pull grant reads the mode and assigns Container Registry Repository Reader
/// there; the release identity's role is documented for both modes.
#[test]
fn major_m3_abac_registries_get_the_repository_roles() {
    let deployment = deployment();
    let acr =
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerRegistry/registries/reg";
    let main = Scope::main_with(
        &deployment,
        with(&[("acrResourceId", Value::Str(acr.into()))]),
    );
    let registry = main.module(&deployment, "modules/registry.bicep");
    let grants = registry
        .resources(Path::new("modules/registry.bicep"))
        .into_iter()
        .filter(|r| r.kind == "Microsoft.Authorization/roleAssignments")
        .collect::<Vec<_>>();
    assert_eq!(grants.len(), 2, "one grant per pulling identity");
    let role = format!("{:?}", grants[0].body.path("properties.roleDefinitionId"));
    assert!(
        role.contains("roleRepositoryReader")
            && role.contains("roleAcrPull")
            && role.contains("abac"),
        "the pull role follows the registry's mode: {role}"
    );
    let source = &deployment.bicep[Path::new("modules/registry.bicep")];
    assert!(source.contains("roleAssignmentMode"));
    assert!(source.contains("'AbacRepositoryPermissions'"));
    // Container Registry Repository Reader (built-in role id).
    assert!(source.contains("b93aa761-3e63-49ed-ac28-beffa264f7ac"));
    for file in ["docs/deploy.md", ".github/workflows/release.yml"] {
        assert!(
            read(file).contains("Container Registry Repository Writer"),
            "{file}: the release identity's role on an ABAC registry"
        );
    }
}

/// M4: with the defaults the worker's metrics reach Application Insights (the collector app),
/// the worker-metric alerts are created, the workbook has platform-metric panels that need no
/// OpenTelemetry, and its Consumer filter always offers `*`.
#[test]
fn major_m4_monitoring_sees_something_with_the_defaults() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let apps = main.module(&deployment, "modules/containerapp.bicep");
    let collector = apps.resource_declared("collectorApp");
    assert_eq!(
        collector.condition,
        Value::Bool(true),
        "the collector app is deployed by default"
    );
    let config = format!("{:?}", collector.body);
    for needed in ["azuremonitor", "metrics:", "otlp", "4317"] {
        assert!(config.contains(needed), "collector config lacks {needed}");
    }
    let env = crate::deployment::worker_env(&BTreeMap::new());
    let collector_name = collector.body.get("name").and_then(Value::as_str).unwrap();
    assert!(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            .is_some_and(|e| e.contains(collector_name)),
        "{env:?}"
    );
    assert!(
        !env.contains_key("OTEL_METRICS_EXPORTER"),
        "metrics exported"
    );
    let alerts = main.module(&deployment, "modules/alerts.bicep");
    for rule in ["lockLost", "slowProcessing", "oldMessages"] {
        assert_eq!(
            alerts.resource_declared(rule).condition,
            Value::Bool(true),
            "{rule}"
        );
    }

    let workbook: serde_json::Value =
        serde_json::from_str(&read("infra/dashboards/sb-inbox.workbook.json")).unwrap();
    let text = workbook.to_string();
    for metric in [
        "namespaces--ActiveMessages",
        "namespaces--DeadletteredMessages",
        "containerapps--Replicas",
        "containerapps--RestartCount",
    ] {
        assert!(text.contains(metric), "no platform panel for {metric}");
    }
    let monitoring = &deployment.bicep[Path::new("modules/monitoring.bicep")];
    for placeholder in [
        "__SERVICEBUS_NAMESPACE_ID__",
        "__CONTAINER_APP_ID__",
        "__APP_INSIGHTS_ID__",
    ] {
        assert!(
            text.contains(placeholder) && monitoring.contains(placeholder),
            "{placeholder}"
        );
    }
    assert!(
        workbook["fallbackResourceIds"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "fallbackResourceIds"
    );
    let consumer = workbook["items"][0]["content"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "Consumer")
        .unwrap()["query"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(consumer.contains("print consumer = \"*\""), "{consumer}");
}

/// m1: users by client id, `WITH SID = …, TYPE = E`: no Graph lookup (FROM EXTERNAL PROVIDER,
/// with or without OBJECT_ID, needs one); the migrate identity's client id is an output.
#[test]
fn m1_users_are_created_by_sid_without_a_graph_lookup() {
    let sql = read("sql/mssql/create_managed_identity_user.sql");
    let code: String = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(code.contains("TYPE = E"), "{code}");
    assert!(!code.contains("FROM EXTERNAL PROVIDER"), "{code}");
    let deployment = deployment();
    let main = crate::bicep::parse(&deployment.bicep[Path::new("main.bicep")]).unwrap();
    let script = read("infra/setup-database.sh");
    let mut used: Vec<String> = words_after(&script, "$(output ")
        .into_iter()
        .filter(|w| !w.starts_with('"'))
        .map(|w| w.trim_end_matches(['"', ')']).to_owned())
        .collect();
    for suffix in words_after(&script, "output \"${role}") {
        let suffix = suffix.split('"').next().unwrap();
        used.push(format!("worker{suffix}"));
        used.push(format!("migrate{suffix}"));
    }
    assert!(
        used.iter().any(|o| o == "migrateIdentityClientId"),
        "{used:?}"
    );
    for output in &used {
        assert!(
            main.outputs.contains(output),
            "setup-database.sh reads missing output {output}"
        );
    }
    let docs = read("docs/deploy.md");
    assert!(!docs.contains(
        "the lookup needs Microsoft Graph rights a pipeline identity\nlacks; the object id"
    ));
}

/// m2: the release tags images with the git tag (v1.2.3); the docs and parameter descriptions
/// deploy that tag, never the bare version.
#[test]
fn m2_the_docs_deploy_the_tag_the_release_pushes() {
    let release = read(".github/workflows/release.yml");
    assert!(release.contains("VERSION: ${{ github.ref_name }}"));
    for file in [
        "docs/deploy.md",
        "infra/main.bicep",
        "infra/modules/containerapp.bicep",
    ] {
        let text = read(file);
        for (i, _) in text.match_indices("sb-inbox:") {
            let next = text[i + "sb-inbox:".len()..].chars().next().unwrap_or(' ');
            assert!(
                !next.is_ascii_digit(),
                "{file}: an image tag without its v: {}",
                &text[i..i + 16]
            );
        }
    }
}

/// m3: the pull server is the registry's own loginServer (a domain name label changes the host),
/// here and in the release workflow.
#[test]
fn m3_the_login_server_is_the_registrys_own() {
    let deployment = deployment();
    let acr =
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerRegistry/registries/reg";
    let main = Scope::main_with(
        &deployment,
        with(&[("acrResourceId", Value::Str(acr.into()))]),
    );
    let pull = main
        .module(&deployment, "modules/containerapp.bicep")
        .param("registryServer")
        .clone();
    assert!(
        matches!(&pull, Value::Unknown(e) if e.contains("registryAccess") && e.contains("loginServer")),
        "{pull:?}"
    );
    assert!(read(".github/workflows/release.yml").contains("--query loginServer"));
}

/// m4: registryServer is described as another Azure Container Registry (identity pull works
/// only there).
#[test]
fn m4_registry_server_is_described_as_an_azure_container_registry() {
    let main = read("infra/main.bicep");
    let line = main
        .lines()
        .take_while(|l| !l.starts_with("param registryServer"))
        .last()
        .unwrap();
    assert!(line.contains("another Azure Container Registry"), "{line}");
    assert!(line.contains("GHCR"), "{line}");
}

/// m5: the migrate job gets the same telemetry variables as the worker (metrics off where the
/// agent has no metrics destination).
#[test]
fn m5_the_migrate_job_gets_the_telemetry_variables() {
    let deployment = deployment();
    let main = Scope::main_with(
        &deployment,
        with(&[("metricsCollector", Value::Bool(false))]),
    );
    let job = main
        .module(&deployment, "modules/containerapp.bicep")
        .resource("migrateJob");
    let env = format!(
        "{:?}",
        job.path("properties.template.containers").unwrap().items()[0].get("env")
    );
    assert!(
        env.contains("OTEL_METRICS_EXPORTER") && env.contains("none"),
        "{env}"
    );
}

/// m6: the KEDA scaler is told the cloud (it defaults to the public cloud).
#[test]
fn m6_the_keda_scaler_is_told_the_cloud() {
    let app = worker_app(&BTreeMap::new());
    let rule = &app.path("properties.template.scale.rules").unwrap().items()[0];
    assert_eq!(
        rule.path("custom.metadata.cloud"),
        Some(&Value::Str("AzurePublicCloud".into())),
        "{rule:?}"
    );
}

/// The worker's own verdict on the environment the deployment gives it, the consumer name put
/// back where the deployment failed.
fn worker_refuses(overrides: &BTreeMap<String, Value>) -> bool {
    let deployment = deployment();
    // The entity path as servicebus.bicep outputs it (a subscription path for a topic).
    let entity = Scope::main_with(&deployment, overrides.clone())
        .module(&deployment, "modules/servicebus.bicep")
        .output("entityPath");
    let app = worker_app(overrides);
    let container = &app.path("properties.template.containers").unwrap().items()[0];
    let env: BTreeMap<String, String> = container
        .get("env")
        .unwrap()
        .items()
        .iter()
        .map(|e| {
            let name = e.get("name").and_then(Value::as_str).unwrap().to_owned();
            let value = match e.get("value").unwrap() {
                Value::Str(s) => s.clone(),
                Value::Failed(_) => "inventory.order-placed.v1".to_owned(),
                Value::Unknown(_) if name == "SB_INBOX_ENTITY" => {
                    entity.as_str().unwrap().to_owned()
                }
                Value::Unknown(x) if name == "SB_INBOX_SERVICEBUS_NAMESPACE" => {
                    format!("sbinbox-{}.servicebus.windows.net", x.len())
                }
                _ => crate::eval::GUID.to_owned(),
            };
            (name, stand_in_unknowns(value))
        })
        .collect();
    sb_inbox::worker::WorkerConfig::load(None, &|name: &str| env.get(name).cloned()).is_err()
}

/// m7: every parameter combination the worker refuses at start stops the deployment with
/// fail(), and nothing the worker accepts does.
#[test]
fn m7_the_deployment_refuses_what_the_worker_refuses() {
    let int = |n: i64| Value::Int(n);
    let cases: Vec<(&str, Vec<(&str, Value)>)> = vec![
        ("defaults", vec![]),
        ("sessions", vec![("sessions", Value::Bool(true))]),
        ("topic", vec![("entityKind", Value::Str("topic".into()))]),
        ("queue retries", vec![("retryMaxRetries", int(3))]),
        ("batching", vec![("batchSize", int(4))]),
        (
            "sessions + retries",
            vec![("sessions", Value::Bool(true)), ("retryMaxRetries", int(3))],
        ),
        (
            "sessions + batching",
            vec![("sessions", Value::Bool(true)), ("batchSize", int(4))],
        ),
        (
            "topic + retries",
            vec![
                ("entityKind", Value::Str("topic".into())),
                ("retryMaxRetries", int(2)),
            ],
        ),
        (
            "max delay < base",
            vec![
                ("retryMaxRetries", int(1)),
                ("retryBaseDelaySecs", int(100)),
                ("retryMaxDelaySecs", int(50)),
            ],
        ),
        (
            "margin >= lock",
            vec![("lockDurationSecs", int(30)), ("lockMarginSecs", int(30))],
        ),
        ("retention < horizon", vec![("retentionSecs", int(86_400))]),
    ];
    for (name, overrides) in cases {
        let overrides = with(&overrides);
        let app = worker_app(&overrides);
        let failed = format!("{app:?}").contains("Failed(");
        let refused = worker_refuses(&overrides);
        assert_eq!(
            failed, refused,
            "{name}: deployment fails {failed}, worker refuses {refused}"
        );
    }
    // The worker refuses an https OTLP endpoint when it starts its exporter
    // (src/telemetry/export.rs): the deployment refuses it too.
    let https = worker_app(&with(&[(
        "otlpEndpoint",
        Value::Str("https://collector:4317".into()),
    )]));
    assert!(format!("{https:?}").contains("Failed("), "{https:?}");
}

/// m8: the alertNames output lists only the rules this deployment creates.
#[test]
fn m8_alert_names_list_only_created_rules() {
    let deployment = deployment();
    let count = |overrides: &[(&str, Value)]| {
        Scope::main_with(&deployment, with(overrides))
            .module(&deployment, "modules/alerts.bicep")
            .output("alertNames")
            .items()
            .len()
    };
    assert_eq!(count(&[("metricsCollector", Value::Bool(false))]), 1);
    assert_eq!(count(&[]), 4);
}

/// m9: the registry access deployment lands in the registry's resource group: its name is
/// unique per environment, or two environments sharing a registry collide.
#[test]
fn m9_the_registry_deployment_name_is_unique_per_environment() {
    let main = read("infra/main.bicep");
    let module = &main[main.find("module registryAccess").unwrap()..];
    let name = module
        .lines()
        .find(|l| l.trim_start().starts_with("name:"))
        .unwrap();
    assert!(name.contains("${uniqueSuffix}"), "{name}");
}

/// m10: the lost-lock rule's window outlasts the metrics' ingestion delay.
#[test]
fn m10_the_lost_lock_window_outlasts_ingestion_delay() {
    let deployment = deployment();
    let alerts = Scope::main(&deployment).module(&deployment, "modules/alerts.bicep");
    let rule = alerts.resource("lockLost");
    let minutes = |key: &str| {
        let text = rule.path(key).and_then(Value::as_str).unwrap().to_owned();
        text.trim_start_matches("PT")
            .trim_end_matches('M')
            .parse::<u32>()
            .unwrap()
    };
    assert!(minutes("properties.windowSize") >= 10);
    assert!(minutes("properties.windowSize") > minutes("properties.evaluationFrequency"));
}

/// m11 (unverifiable offline) and the review's other unverifiable points: a checklist for the
/// first real run, in the docs and in the evidence ledger's "Verified where" (docs/evidence.md,
/// moved out of README.md in issue 46).
#[test]
fn m11_the_first_real_run_has_a_checklist() {
    let docs = read("docs/deploy.md");
    let list = section(&docs, "### First real deployment");
    for item in ["v0.49.2", "time column", "RestartCount"] {
        assert!(
            list.contains(&format!(
                "- [ ] **{}",
                match item {
                    "v0.49.2" => "The Bicep version tag",
                    "time column" => "Log-alert queries without a time column",
                    _ => "RestartCount semantics",
                }
            )),
            "checklist lacks {item}"
        );
        assert!(list.contains(item));
    }
    let evidence = read("docs/evidence.md");
    assert!(evidence.contains("a checklist for the first real run"));
}

/// m12: the agent's OTLP destination can be plain HTTP (a collector in the environment) and
/// carry headers.
#[test]
fn m12_the_agent_otlp_destination_takes_insecure_and_headers() {
    let deployment = deployment();
    let header = Value::Object(BTreeMap::from([
        ("key".to_owned(), Value::Str("x-api-key".into())),
        ("value".to_owned(), Value::Str("k".into())),
    ]));
    let main = Scope::main_with(
        &deployment,
        with(&[
            ("metricsCollector", Value::Bool(false)),
            (
                "agentMetricsOtlpEndpoint",
                Value::Str("http://collector:4317".into()),
            ),
            ("agentMetricsOtlpInsecure", Value::Bool(true)),
            (
                "agentMetricsOtlpHeaders",
                Value::Array(vec![header.clone()]),
            ),
        ]),
    );
    let environment = main
        .module(&deployment, "modules/containerapp.bicep")
        .resource("environment");
    let otlp = &environment
        .path("properties.openTelemetryConfiguration.destinationsConfiguration.otlpConfigurations")
        .unwrap()
        .items()[0];
    assert_eq!(otlp.get("insecure"), Some(&Value::Bool(true)));
    assert_eq!(otlp.get("headers"), Some(&Value::Array(vec![header])));
}

/// m13: Microsoft.Network (and Microsoft.Compute for the management machine) are registered.
#[test]
fn m13_the_network_provider_is_registered() {
    let docs = read("docs/deploy.md");
    let providers = section(&docs, "## 0. Once per subscription");
    assert!(providers.contains("Microsoft.Network"));
    assert!(providers.contains("Microsoft.Compute"));
}

/// m14: the outbox topic has a subscription by default (a topic without one discards sends),
/// and the smoke test reads the event back.
#[test]
fn m14_the_outbox_topic_keeps_its_events() {
    let deployment = deployment();
    let servicebus = Scope::main(&deployment).module(&deployment, "modules/servicebus.bicep");
    let subscriptions: Vec<_> = servicebus
        .resources(Path::new("modules/servicebus.bicep"))
        .into_iter()
        .filter(|r| r.symbol == "outboxTopicSubscriptions" && r.condition == Value::Bool(true))
        .collect();
    assert!(
        !subscriptions.is_empty(),
        "the outbox topic has no subscription"
    );
    let smoke = section(&read("docs/deploy.md"), "## Smoke test");
    assert!(
        smoke.contains("outboxSubscriptions") && smoke.contains("activeMessageCount"),
        "{smoke}"
    );
}

/// m15: the NAT-gateway middle option is documented.
#[test]
fn m15_the_nat_gateway_option_is_documented() {
    assert!(read("docs/deploy.md").contains("NAT gateway"));
}

/// m16: an existing (central) privatelink zone can be used instead of a per-group one.
#[test]
fn m16_an_existing_private_dns_zone_can_be_used() {
    let deployment = deployment();
    let zone = "/subscriptions/s/resourceGroups/hub/providers/Microsoft.Network/privateDnsZones/privatelink.database.windows.net";
    let main = Scope::main_with(
        &deployment,
        with(&[private(), ("existingSqlDnsZoneId", Value::Str(zone.into()))]),
    );
    let network = main.module(&deployment, "modules/network.bicep");
    assert_eq!(
        network.resource_declared("sqlZone").condition,
        Value::Bool(false)
    );
    let group = network.resource("sqlEndpointDns");
    let configs = group
        .path("properties.privateDnsZoneConfigs")
        .unwrap()
        .items();
    assert_eq!(
        configs[0].path("properties.privateDnsZoneId"),
        Some(&Value::Str(zone.into()))
    );
}

/// m17: the image is built only from a commit whose ci passed, and the tag check fails closed.
#[test]
fn m17_the_release_is_gated_and_its_tag_check_fails_closed() {
    let release = read(".github/workflows/release.yml");
    let image = &release[release.find("\n  image:").expect("job image")..];
    let needs = image
        .lines()
        .find(|l| l.trim_start().starts_with("needs:"))
        .unwrap_or("");
    let gate = needs.trim_start().trim_start_matches("needs:").trim();
    assert!(!gate.is_empty(), "the image job needs a gate");
    let gate_job = &release[release.find(&format!("\n  {gate}:")).expect("gate job")..];
    assert!(gate_job.contains("workflows/ci.yml/runs"), "{gate_job}");
    assert!(gate_job.contains("head_sha=${GITHUB_SHA}") && gate_job.contains("status=success"));
    let check = &release[release.find("Refuse to overwrite a released tag").unwrap()..];
    let check = &check[..check.find("- name:").unwrap_or(check.len())];
    assert!(
        !check.contains(">/dev/null 2>&1; then"),
        "any error counts as absent: {check}"
    );
    assert!(
        check.contains("manifest unknown") && check.contains("cannot tell"),
        "{check}"
    );
}

/// m18: the serverless database never pauses while a replica runs, and Defender is billed per
/// server: both said.
#[test]
fn m18_the_costs_are_stated() {
    let docs = read("docs/deploy.md");
    assert!(docs.contains("from ever auto-pausing"));
    assert!(docs.contains("billed per server"));
}

/// m19: Dependabot keeps the emulator compose images current.
#[test]
fn m19_dependabot_covers_the_emulator_compose_file() {
    let dependabot = read(".github/dependabot.yml");
    let entry = &dependabot[dependabot
        .find("package-ecosystem: docker-compose")
        .expect("docker-compose")..];
    let directory = entry
        .lines()
        .find(|l| l.trim_start().starts_with("directory:"))
        .unwrap();
    assert!(
        directory.contains("/.github/servicebus-emulator"),
        "{directory}"
    );
}

/// Issue 43: `verifyAfterDeploy` (default false) adds the Container Apps job `<prefix>-verify`,
/// which runs `sb-inbox verify` with the worker's identity on the queues `verify` and
/// `verify-sessions` it adds (the worker may send and receive there, nothing more), exits 0 only
/// when nothing failed (`--allow-skipped`: token_refresh needs a SAS key), and whose result the
/// smoke test in docs/deploy.md reads from the job's execution.
#[test]
fn verify_after_deploy_adds_a_job_on_the_workers_identity_and_the_smoke_test_reads_it() {
    let off = resource_names(&[]);
    assert!(
        !off.iter()
            .any(|n| n == "verify" || n == "verify-sessions" || n.ends_with("-verify")),
        "created without verifyAfterDeploy: {off:?}"
    );
    let on_values = [("verifyAfterDeploy", Value::Bool(true))];
    let on = resource_names(&on_values);
    for name in ["verify", "verify-sessions"] {
        assert!(on.contains(name), "{name} missing: {on:?}");
    }
    let job_name = on
        .iter()
        .find(|n| n.ends_with("-verify"))
        .unwrap_or_else(|| panic!("no <prefix>-verify job: {on:?}"))
        .clone();

    let deployment = deployment();
    let main = Scope::main_with(&deployment, with(&on_values));
    let app = main.module(&deployment, "modules/containerapp.bicep");
    let job = app.resource("verifyJob");
    let container = &job.path("properties.template.containers").unwrap().items()[0];
    let args: Vec<&str> = container
        .get("args")
        .unwrap()
        .items()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args,
        [
            "verify",
            "--queue",
            "verify",
            "--session-queue",
            "verify-sessions",
            "--store",
            "sqlite:///tmp/verify.db",
            "--idle-secs",
            "660",
            "--allow-skipped"
        ]
    );
    // Values from other modules' outputs evaluate to stand-ins: compared as values, the job's
    // and the worker's come from the same output.
    let env = |value: &Value, name: &str| -> Option<Value> {
        value
            .get("env")?
            .items()
            .iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name))?
            .get("value")
            .cloned()
    };
    let worker = worker_app(&with(&on_values));
    let worker_container = &worker
        .path("properties.template.containers")
        .unwrap()
        .items()[0];
    for name in ["AZURE_CLIENT_ID", "SB_INBOX_SERVICEBUS_NAMESPACE"] {
        assert_eq!(
            env(container, name),
            env(worker_container, name),
            "{name}: the job runs as the worker, on its namespace"
        );
        assert!(env(container, name).is_some(), "{name} unset");
    }
    assert_eq!(
        job.path("properties.configuration.triggerType")
            .and_then(Value::as_str),
        Some("Manual")
    );

    // The session queue requires sessions; the worker holds data roles on both, no Manage.
    let bus = main.module(&deployment, "modules/servicebus.bicep");
    assert_eq!(
        bus.resource("verifySessionQueue")
            .path("properties.requiresSession"),
        Some(&Value::Bool(true))
    );
    let bicep = read("infra/modules/servicebus.bicep");
    let roles = section_of(
        &bicep,
        "resource verifyRoles",
        "resource namespaceDiagnostics",
    );
    assert!(
        roles.contains("[roleDataReceiver, roleDataSender]"),
        "{roles}"
    );
    assert!(!roles.contains("roleDataOwner"), "{roles}");

    // main passes the switch to both modules and names the job; the CLI has the flag.
    let main_bicep = read("infra/main.bicep");
    assert_eq!(
        main_bicep
            .matches("verifyAfterDeploy: verifyAfterDeploy")
            .count(),
        2
    );
    assert!(main_bicep.contains("output verifyJobName string = app.outputs.verifyJobName"));
    assert!(read("crates/cli/src/main.rs").contains("allow_skipped: bool,"));

    // The smoke test starts the job by the output's name and reads the execution's status.
    let smoke = section(&read("docs/deploy.md"), "## Smoke test");
    for needed in [
        "param verifyAfterDeploy = true",
        "properties.outputs.verifyJobName.value",
        "az containerapp job start -g RG -n \"$VERIFY\"",
        "az containerapp job execution show -g RG -n \"$VERIFY\"",
        "Succeeded",
    ] {
        assert!(
            smoke.contains(needed),
            "smoke test lacks {needed:?}:\n{smoke}"
        );
    }
    assert!(
        job_name.starts_with(deployment_prefix().as_str()),
        "{job_name}"
    );
}

/// The text of `source` from `from` up to `to`.
fn section_of<'s>(source: &'s str, from: &str, to: &str) -> &'s str {
    let start = source.find(from).unwrap_or_else(|| panic!("no {from:?}"));
    let end = source[start..].find(to).map_or(source.len(), |i| start + i);
    &source[start..end]
}

/// The worker app's name without its `-worker` suffix: the deployment's lowered prefix.
fn deployment_prefix() -> String {
    let worker = worker_app(&with(&[]));
    worker
        .get("name")
        .and_then(Value::as_str)
        .and_then(|n| n.strip_suffix("-worker"))
        .unwrap()
        .to_owned()
}
