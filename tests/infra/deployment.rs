//! What `az deployment group create -f infra/main.bicep -p infra/main.parameters.json` would
//! create, evaluated offline (see `eval`): names Azure accepts, each identity's client id where
//! it logs in, an immutable image, AcrPull before the app, the scaler identity kept from the
//! containers, a termination grace that covers the shutdown, probes within the platform's
//! limits, and defaults that hold at maxReplicas against the database's worker limit.

use std::collections::BTreeMap;
use std::path::Path;

use crate::deployment;
use crate::eval::{GUID, Resource, Scope, UNIQUE_STRING, Value};

/// Azure's naming rules for the resource types the templates create.
/// <https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules>
struct Rule {
    min: usize,
    max: usize,
    /// Allowed characters.
    chars: fn(char) -> bool,
    /// Allowed first and last character.
    ends: fn(char) -> bool,
    /// A DNS name unique across Azure: must carry the resource group's uniqueString suffix.
    global: bool,
}

fn lower_alnum_hyphen(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}
fn alnum_hyphen(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}
fn lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}
fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}
fn entity(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')
}
fn any_visible(c: char) -> bool {
    !c.is_control() && !"*#&+:<>?@%{}\\/".contains(c)
}
fn not_space(c: char) -> bool {
    c != ' ' && c != '.'
}
fn network(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}
fn alnum_underscore(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}
fn dns(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.')
}

fn rule(kind: &str) -> Option<Rule> {
    let r = |min, max, chars: fn(char) -> bool, ends: fn(char) -> bool, global| Rule {
        min,
        max,
        chars,
        ends,
        global,
    };
    Some(match kind {
        "Microsoft.ServiceBus/namespaces" => r(6, 50, alnum_hyphen, alnum, true),
        "Microsoft.ServiceBus/namespaces/queues" | "Microsoft.ServiceBus/namespaces/topics" => {
            r(1, 260, entity, alnum, false)
        }
        "Microsoft.ServiceBus/namespaces/topics/subscriptions" => r(1, 50, entity, alnum, false),
        "Microsoft.Sql/servers" => r(1, 63, lower_alnum_hyphen, lower_alnum, true),
        "Microsoft.Sql/servers/databases" => r(1, 128, any_visible, not_space, false),
        "Microsoft.Sql/servers/firewallRules" => r(1, 128, any_visible, not_space, false),
        "Microsoft.Sql/servers/auditingSettings"
        | "Microsoft.Sql/servers/securityAlertPolicies"
        | "Microsoft.Sql/servers/sqlVulnerabilityAssessments" => r(7, 7, alnum, alnum, false),
        "Microsoft.App/managedEnvironments" => r(2, 60, lower_alnum_hyphen, lower_alnum, false),
        "Microsoft.App/containerApps" | "Microsoft.App/jobs" => {
            r(2, 32, lower_alnum_hyphen, lower_alnum, false)
        }
        "Microsoft.ManagedIdentity/userAssignedIdentities" => r(
            3,
            128,
            |c| c.is_ascii_alphanumeric() || c == '-' || c == '_',
            |c| c.is_ascii_alphanumeric() || c == '_' || c == '-',
            false,
        ),
        "Microsoft.OperationalInsights/workspaces" => r(4, 63, alnum_hyphen, alnum, false),
        "Microsoft.Network/virtualNetworks" | "Microsoft.Network/privateEndpoints" => {
            r(2, 64, network, alnum_underscore, false)
        }
        "Microsoft.Network/privateDnsZones/virtualNetworkLinks"
        | "Microsoft.Network/privateEndpoints/privateDnsZoneGroups" => {
            r(1, 80, network, alnum_underscore, false)
        }
        "Microsoft.Network/privateDnsZones" => r(1, 253, dns, lower_alnum, false),
        "Microsoft.Insights/components"
        | "Microsoft.Insights/metricAlerts"
        | "Microsoft.Insights/scheduledQueryRules"
        | "Microsoft.Insights/diagnosticSettings" => r(1, 260, any_visible, not_space, false),
        // Names that must be GUIDs.
        "Microsoft.Insights/workbooks" | "Microsoft.Authorization/roleAssignments" => {
            r(36, 36, |c| c.is_ascii_hexdigit() || c == '-', alnum, false)
        }
        _ => return None,
    })
}

/// Every problem with the names of the resources `main` (and the modules it calls) creates.
fn name_problems(main: &Scope<'_>, deployment: &crate::check::Deployment) -> Vec<String> {
    let mut resources: Vec<Resource> = main.resources(Path::new("main.bicep"));
    for path in deployment.bicep.keys().filter(|p| p.starts_with("modules")) {
        let module = main.module(deployment, path.to_str().unwrap());
        resources.extend(module.resources(path));
    }
    let mut problems = Vec::new();
    for resource in resources.iter().filter(|r| !r.existing) {
        let at = format!(
            "{}: {} ({})",
            resource.file.display(),
            resource.symbol,
            resource.kind
        );
        let Some(name) = resource.body.get("name").and_then(Value::as_str) else {
            problems.push(format!(
                "{at}: name not computable offline: {:?}",
                resource.body.get("name")
            ));
            continue;
        };
        let Some(rule) = rule(&resource.kind) else {
            problems.push(format!("{at}: no naming rule for this type in tests/infra"));
            continue;
        };
        let length = name.chars().count();
        if length < rule.min || length > rule.max {
            problems.push(format!(
                "{at}: `{name}` has {length} characters, not {}-{}",
                rule.min, rule.max
            ));
        }
        if let Some(bad) = name.chars().find(|c| !(rule.chars)(*c)) {
            problems.push(format!("{at}: `{name}` may not contain {bad:?}"));
        }
        let (first, last) = (name.chars().next(), name.chars().last());
        if !first.is_some_and(rule.ends) || !last.is_some_and(rule.ends) {
            problems.push(format!(
                "{at}: `{name}` must start and end with an allowed character"
            ));
        }
        if resource.kind == "Microsoft.ServiceBus/namespaces"
            && (name.ends_with("-sb")
                || name.ends_with("-mgmt")
                || !name.starts_with(|c: char| c.is_ascii_alphabetic()))
        {
            problems.push(format!(
                "{at}: `{name}` must start with a letter and not end in -sb or -mgmt"
            ));
        }
        if rule.global && !name.contains(UNIQUE_STRING) {
            problems.push(format!(
                "{at}: `{name}` is a global DNS name without a uniqueString suffix"
            ));
        }
        if rule.min == 36 && name != GUID {
            problems.push(format!("{at}: `{name}` must be a guid()"));
        }
    }
    problems
}

/// The naming problems of the deployment with `overrides` of the parameters.
pub(crate) fn names_with(overrides: &[(&str, Value)]) -> Vec<String> {
    let deployment = deployment();
    let main = Scope::main_with(&deployment, with(overrides));
    name_problems(&main, &deployment)
}

/// The worker app resource as the deployment creates it, with `overrides` of the parameters.
pub(crate) fn worker_app(overrides: &BTreeMap<String, Value>) -> Value {
    let deployment = deployment();
    let main = Scope::main_with(&deployment, overrides.clone());
    main.module(&deployment, "modules/containerapp.bicep")
        .resource("app")
}

pub(crate) fn with(values: &[(&str, Value)]) -> BTreeMap<String, Value> {
    values
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

#[test]
fn every_resource_name_follows_azure_naming_rules() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let problems = name_problems(&main, &deployment);
    assert!(problems.is_empty(), "names:\n{}", problems.join("\n"));
    // The longest prefix main.bicep allows, and other entity kinds.
    let longest =
        "a".repeat(usize::try_from(main.decorator("namePrefix", "maxLength").unwrap()).unwrap());
    for overrides in [
        with(&[("namePrefix", Value::Str(longest.clone()))]),
        with(&[
            ("namePrefix", Value::Str("abc".into())),
            ("entityKind", Value::Str("topic".into())),
            ("outboxEntityKind", Value::Str("queue".into())),
        ]),
    ] {
        let main = Scope::main_with(&deployment, overrides.clone());
        let problems = name_problems(&main, &deployment);
        assert!(
            problems.is_empty(),
            "names with {overrides:?}:\n{}",
            problems.join("\n")
        );
    }
}

#[test]
fn the_name_check_catches_what_azure_rejects() {
    let mut deployment = deployment();
    let servicebus = Path::new("modules/servicebus.bicep").to_path_buf();
    let source = deployment.bicep[&servicebus]
        .replace("'${namePrefix}-bus-${uniqueSuffix}'", "'${namePrefix}-sb'");
    deployment.bicep.insert(servicebus, source);
    let problems = name_problems(&Scope::main(&deployment), &deployment).join("\n");
    assert!(problems.contains("not end in -sb"), "{problems}");
    assert!(
        problems.contains("without a uniqueString suffix"),
        "{problems}"
    );
}

/// The store string's `User Id`, the container's `AZURE_CLIENT_ID` and the identity attached
/// are one identity, for the app and for the migrate job, and the two differ.
#[test]
fn each_container_logs_in_to_sql_with_its_own_identity() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let app_module = main.module(&deployment, "modules/containerapp.bicep");
    let mut client_ids = Vec::new();
    for (symbol, identity) in [("app", "workerClientId"), ("migrateJob", "migrateClientId")] {
        let resource = app_module.resource(symbol);
        let containers = resource
            .path("properties.template.containers")
            .unwrap()
            .items();
        for container in containers {
            let env: BTreeMap<&str, &Value> = container
                .get("env")
                .unwrap()
                .items()
                .iter()
                .map(|e| {
                    (
                        e.get("name").unwrap().as_str().unwrap(),
                        e.get("value").unwrap(),
                    )
                })
                .collect();
            let store = env["SB_INBOX_STORE"].as_str().unwrap();
            let client_id = match env["AZURE_CLIENT_ID"] {
                Value::Unknown(expression) => expression.clone(),
                other => panic!("{symbol}: AZURE_CLIENT_ID {other:?}"),
            };
            assert!(
                client_id.ends_with(&format!("outputs.{identity}")),
                "{symbol}: {client_id}"
            );
            assert!(
                store.contains("Authentication=Active Directory Default"),
                "{store}"
            );
            assert!(
                store.contains(&format!("User Id=⟨{client_id}⟩")),
                "{symbol}: the store string must name its identity's client id ({client_id}): {store}"
            );
            client_ids.push(client_id);
        }
    }
    assert_eq!(client_ids.len(), 2);
    assert_ne!(client_ids[0], client_ids[1]);
}

#[test]
fn the_image_is_immutable() {
    let deployment = deployment();
    let bicepparam = std::fs::read_to_string(crate::infra_dir().join("main.bicepparam")).unwrap();
    let from_bicepparam = bicepparam
        .lines()
        .find_map(|l| l.trim().strip_prefix("param image = "))
        .map(|v| v.trim().trim_matches('\'').to_owned())
        .expect("main.bicepparam sets image");
    let main = Scope::main(&deployment);
    for image in [
        main.param("image").as_str().unwrap().to_owned(),
        from_bicepparam,
    ] {
        assert!(
            immutable(&image),
            "{image}: use a release tag or an @sha256 digest, never :latest"
        );
    }
    assert!(!immutable("ghcr.io/sb-inbox/sb-inbox:latest"));
    assert!(!immutable("ghcr.io/sb-inbox/sb-inbox"));
    assert!(immutable("myregistry.azurecr.io:5000/sb-inbox@sha256:0123"));
}

fn immutable(image: &str) -> bool {
    if image.contains("@sha256:") {
        return true;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split_once(':')
        .is_some_and(|(_, tag)| !tag.is_empty() && tag != "latest")
}

/// The app module waits for the module that grants AcrPull to the identities that pull.
#[test]
fn acr_pull_is_granted_before_the_app_and_job() {
    let deployment = deployment();
    let main = Scope::main_with(
        &deployment,
        with(&[(
            "acrResourceId",
            Value::Str("/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerRegistry/registries/reg".into()),
        )]),
    );
    let registry = main.module(&deployment, "modules/registry.bicep");
    let grants = registry.resource("imagePull");
    assert!(
        format!("{:?}", grants.path("properties.roleDefinitionId")).contains("roleAcrPull"),
        "{grants:?}"
    );
    let source = &deployment.bicep[Path::new("modules/registry.bicep")];
    assert!(
        source.contains("7f951dda-4ed3-4680-a7ca-43fe172d538d"),
        "AcrPull role id"
    );
    let principals: Vec<String> = registry
        .param("principalIds")
        .items()
        .iter()
        .map(|v| format!("{v:?}"))
        .collect();
    assert!(
        principals.iter().any(|p| p.contains("workerPrincipalId")),
        "{principals:?}"
    );
    assert!(
        principals.iter().any(|p| p.contains("migratePrincipalId")),
        "{principals:?}"
    );
    let depends = main.module_depends_on("app");
    let registry_symbol = "registryAccess";
    assert!(
        depends.iter().any(|d| d == registry_symbol),
        "module app must depend on {registry_symbol}: {depends:?}"
    );
}

#[test]
fn the_scaler_identity_is_kept_from_the_containers() {
    let app = worker_app(&BTreeMap::new());
    let scaler = app.path("properties.template.scale.rules").unwrap().items()[0]
        .path("custom.identity")
        .cloned()
        .unwrap();
    let settings = app
        .path("properties.configuration.identitySettings")
        .map(Value::items)
        .unwrap_or_default();
    assert!(
        settings.iter().any(|s| s.get("identity") == Some(&scaler)
            && s.get("lifecycle").and_then(Value::as_str) == Some("None")),
        "identitySettings must give the scaler identity {scaler:?} lifecycle None: {settings:?}"
    );
}

/// SIGTERM to SIGKILL covers the drain, the relay/retention stop and the telemetry flush, for
/// the parameters file and for the largest drain main.bicep allows, within Container Apps' 600 s.
#[test]
fn the_termination_grace_covers_drain_background_stop_and_flush() {
    let deployment = deployment();
    let background = i64::try_from(sb_inbox::worker::BACKGROUND_STOP.as_secs()).unwrap();
    let base = Scope::main(&deployment);
    let max_drain = base.decorator("shutdownGraceSecs", "maxValue").unwrap();
    let max_flush = base.decorator("telemetryFlushSecs", "maxValue").unwrap();
    for overrides in [
        BTreeMap::new(),
        with(&[
            ("shutdownGraceSecs", Value::Int(max_drain)),
            ("telemetryFlushSecs", Value::Int(max_flush)),
        ]),
        with(&[
            ("shutdownGraceSecs", Value::Int(1)),
            ("telemetryFlushSecs", Value::Int(0)),
        ]),
    ] {
        let main = Scope::main_with(&deployment, overrides.clone());
        let drain = main.param("shutdownGraceSecs").as_int().unwrap();
        let flush = main.param("telemetryFlushSecs").as_int().unwrap();
        let app = worker_app(&overrides);
        let grace = app
            .path("properties.template.terminationGracePeriodSeconds")
            .and_then(Value::as_int)
            .unwrap_or_else(|| panic!("grace not computable: {app:?}"));
        assert!(
            grace >= drain + background + flush,
            "{overrides:?}: grace {grace} < drain {drain} + background stop {background} + flush {flush}"
        );
        assert!(
            grace <= 600,
            "{overrides:?}: Container Apps allows at most 600 s, got {grace}"
        );
    }
    // The flush default covers two OTLP exports (traces, metrics) at the default 10 s timeout.
    assert!(base.param("telemetryFlushSecs").as_int().unwrap() >= 20);
}

#[test]
fn probes_answer_within_their_timeouts_and_the_platform_limits() {
    let app = worker_app(&BTreeMap::new());
    let probes = app.path("properties.template.containers").unwrap().items()[0]
        .get("probes")
        .unwrap()
        .items()
        .to_vec();
    assert_eq!(probes.len(), 3);
    let ready_timeout = i64::try_from(sb_inbox::worker::PROBE_TIMEOUT.as_secs()).unwrap();
    for probe in &probes {
        let kind = probe.get("type").and_then(Value::as_str).unwrap();
        let int = |key: &str| probe.get(key).and_then(Value::as_int);
        let timeout = int("timeoutSeconds").unwrap_or_else(|| panic!("{kind}: no timeoutSeconds"));
        assert!(
            (3..=5).contains(&timeout),
            "{kind}: timeoutSeconds {timeout}"
        );
        // /readyz bounds its checks so it answers before the probe gives up.
        assert!(
            timeout > ready_timeout,
            "{kind}: {timeout} <= PROBE_TIMEOUT {ready_timeout}"
        );
        // ContainerAppProbe limits (Microsoft.App REST specification).
        assert!(
            (1..=10).contains(&int("failureThreshold").unwrap_or(3)),
            "{kind}: failureThreshold"
        );
        assert!(
            (1..=240).contains(&int("periodSeconds").unwrap_or(10)),
            "{kind}: periodSeconds"
        );
        assert!(
            (0..=60).contains(&int("initialDelaySeconds").unwrap_or(0)),
            "{kind}: initialDelaySeconds"
        );
    }
}

/// Concurrent SQL requests (workers) per service objective.
/// <https://learn.microsoft.com/azure/azure-sql/database/resource-limits-vcore-single-databases>
fn sql_max_workers(sku: &Value) -> Option<i64> {
    let name = sku.get("name")?.as_str()?;
    let capacity = sku.get("capacity")?.as_int()?;
    match (name, capacity) {
        ("GP_S_Gen5", 1) => Some(75),
        ("GP_S_Gen5", 2) => Some(150),
        ("GP_S_Gen5", 4) => Some(300),
        ("GP_Gen5", 2) => Some(200),
        ("GP_Gen5", 4) => Some(400),
        _ => None,
    }
}

/// At maxReplicas every pool full (concurrency + relay + retention) plus the migrate job stays
/// below the database's worker limit with room for operators; prefetch never exceeds what the
/// replica can start at once, so prefetched locks do not expire waiting.
#[test]
fn defaults_hold_at_max_replicas() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let int = |name: &str| main.param(name).as_int().unwrap();
    let (replicas, concurrency, prefetch) =
        (int("maxReplicas"), int("concurrency"), int("prefetch"));
    let sku = main.param("sqlDatabaseSku");
    let limit = sql_max_workers(sku).unwrap_or_else(|| panic!("add the worker limit of {sku:?}"));
    // The pool size the worker uses: concurrency + 2 (crates/cli/src/run.rs).
    let connections = replicas * (concurrency + 2) + 1;
    let operators = 10;
    assert!(
        connections + operators <= limit,
        "{replicas} replicas x ({concurrency} + 2) + migrate = {connections}, + {operators} for operators > {limit} workers"
    );
    assert!(
        prefetch <= concurrency,
        "prefetch {prefetch} > concurrency {concurrency}"
    );
}

/// Logs and metrics reach the workspace, which takes Entra tokens only. (Which firewall rule
/// admits the worker: `database::the_worker_reaches_the_database_with_the_defaults`.)
#[test]
fn diagnostics_reach_an_entra_only_workspace() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let workspace = main
        .module(&deployment, "modules/monitoring.bicep")
        .resource("workspace");
    assert_eq!(
        workspace.path("properties.features.disableLocalAuth"),
        Some(&Value::Bool(true))
    );
    for (module, symbol) in [
        ("modules/servicebus.bicep", "namespaceDiagnostics"),
        ("modules/sql.bicep", "databaseDiagnostics"),
    ] {
        let settings = main.module(&deployment, module).resource(symbol);
        let logs = format!("{:?}", settings.path("properties.logs"));
        let metrics = format!("{:?}", settings.path("properties.metrics"));
        assert!(
            logs.contains("allLogs") && metrics.contains("AllMetrics"),
            "{module}: {logs} {metrics}"
        );
    }
}

/// The worker's environment as the deployment sets it, values known only at deployment (the
/// namespace, client ids) replaced by stand-ins of the right shape.
pub(crate) fn worker_env(overrides: &BTreeMap<String, Value>) -> BTreeMap<String, String> {
    let app = worker_app(overrides);
    let container = &app.path("properties.template.containers").unwrap().items()[0];
    container
        .get("env")
        .unwrap()
        .items()
        .iter()
        .map(|e| {
            let name = e.get("name").and_then(Value::as_str).unwrap().to_owned();
            let value = match e.get("value").unwrap() {
                Value::Str(s) => s.clone(),
                Value::Unknown(expression) if name == "SB_INBOX_SERVICEBUS_NAMESPACE" => {
                    format!("sbinbox-{}.servicebus.windows.net", expression.len())
                }
                Value::Unknown(_) => GUID.to_owned(),
                other => panic!("{name}: {other:?}"),
            };
            (name, stand_in_unknowns(value))
        })
        .collect()
}

/// Interpolated unknowns (the store's host, database and User Id) as ASCII stand-ins.
pub(crate) fn stand_in_unknowns(mut value: String) -> String {
    while let (Some(open), Some(close)) = (value.find('⟨'), value.find('⟩')) {
        let expression = &value[open..close];
        let stand_in = if expression.contains("Fqdn") {
            "sbinbox-sql.database.windows.net"
        } else if expression.contains("databaseName") {
            "sbinbox"
        } else {
            GUID
        };
        value.replace_range(open..close + '⟩'.len_utf8(), stand_in);
    }
    value
}

/// The worker's own validation of the environment the deployment gives it.
fn worker_config(
    overrides: &BTreeMap<String, Value>,
) -> Result<sb_inbox::worker::WorkerConfig, sb_inbox::worker::ConfigErrors> {
    let env = worker_env(overrides);
    sb_inbox::worker::WorkerConfig::load(None, &|name: &str| env.get(name).cloned())
}

/// A new workspace has no ContainerAppSystemLogs table until the first event: the rule is
/// created without validating its query, and the query counts KEDA's warning events only.
#[test]
fn the_scaler_error_alert_can_be_created_on_a_new_workspace() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let alerts = main.module(&deployment, "modules/alerts.bicep");
    let rule = alerts.resource_declared("scalerErrors");
    assert_eq!(rule.condition, Value::Bool(true), "always created");
    assert_eq!(
        rule.body.path("properties.skipQueryValidation"),
        Some(&Value::Bool(true)),
        "creation validates the query against tables a new workspace lacks (SEM0100)"
    );
    let query = rule.body.path("properties.criteria.allOf").unwrap().items()[0]
        .get("query")
        .and_then(Value::as_str)
        .unwrap()
        .to_owned();
    for needed in [
        "ContainerAppSystemLogs",
        "EventSource",
        "\"KEDA\"",
        "Type",
        "\"Warning\"",
    ] {
        assert!(query.contains(needed), "{query} lacks {needed}");
    }
    assert!(!query.contains("isfuzzy"), "{query}");
}

/// Session mode end to end in the templates: the consumed entity requires sessions (Bicep could
/// not create one before) and the worker's session settings come from parameters; the worker's
/// own validation accepts what the deployment sets, and refuses sessions with delayed retries.
#[test]
fn session_mode_creates_a_session_entity_and_configures_the_worker() {
    let deployment = deployment();
    let plain = worker_config(&BTreeMap::new()).expect("the default deployment's worker config");
    assert!(plain.sessions.is_none());
    for entity_kind in ["queue", "topic"] {
        let overrides = with(&[
            ("sessions", Value::Bool(true)),
            ("maxSessions", Value::Int(16)),
            ("sessionIdleSecs", Value::Int(9)),
            ("entityKind", Value::Str(entity_kind.into())),
        ]);
        let main = Scope::main_with(&deployment, overrides.clone());
        let servicebus = main.module(&deployment, "modules/servicebus.bicep");
        let symbol = if entity_kind == "queue" {
            "queue"
        } else {
            "topicSubscription"
        };
        assert_eq!(
            servicebus
                .resource(symbol)
                .path("properties.requiresSession"),
            Some(&Value::Bool(true)),
            "{entity_kind}: the consumed entity must require sessions"
        );
        let config = worker_config(&overrides)
            .unwrap_or_else(|e| panic!("{entity_kind}: the worker refuses its settings: {e}"));
        let sessions = config.sessions.expect("session mode on");
        assert_eq!(sessions.max_sessions, 16);
        assert_eq!(sessions.idle, std::time::Duration::from_secs(9));
    }
    // The worker refuses delayed retries in session mode, and the deployment stops first
    // (round4::m7_the_deployment_refuses_what_the_worker_refuses).
    let refused = worker_app(&with(&[
        ("sessions", Value::Bool(true)),
        ("retryMaxRetries", Value::Int(3)),
    ]));
    assert!(format!("{refused:?}").contains("Failed("), "{refused:?}");
}

/// The environment is a workload profiles environment (the consumption-only type is legacy),
/// the app and the job run on its Consumption profile, and Defender's vulnerability assessment
/// is configured when Defender is on.
#[test]
fn the_environment_has_workload_profiles_and_sql_has_a_vulnerability_assessment() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let apps = main.module(&deployment, "modules/containerapp.bicep");
    let profiles = apps
        .resource("environment")
        .path("properties.workloadProfiles")
        .map(|p| p.items().to_vec())
        .unwrap_or_default();
    assert!(
        profiles
            .iter()
            .any(|p| p.get("workloadProfileType").and_then(Value::as_str) == Some("Consumption")),
        "{profiles:?}"
    );
    for symbol in ["app", "migrateJob"] {
        assert_eq!(
            apps.resource(symbol).path("properties.workloadProfileName"),
            Some(&Value::Str("Consumption".into())),
            "{symbol}"
        );
    }
    let sql = main.module(&deployment, "modules/sql.bicep");
    assert_eq!(sql.param("defender"), &Value::Bool(true));
    let assessment = sql.resource_declared("vulnerabilityAssessment");
    assert_eq!(assessment.condition, Value::Bool(true));
    assert_eq!(
        assessment.body.path("properties.state"),
        Some(&Value::Str("Enabled".into()))
    );
}

/// The pull server follows acrResourceId; a registryServer naming another registry stops the
/// deployment; a prefix with capitals still gives names Azure accepts.
#[test]
fn the_registry_server_is_cross_checked_and_the_prefix_lowered() {
    let deployment = deployment();
    let acr =
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerRegistry/registries/MyReg";
    let pull = |registry_server: &str| {
        let main = Scope::main_with(
            &deployment,
            with(&[
                ("acrResourceId", Value::Str(acr.into())),
                ("registryServer", Value::Str(registry_server.into())),
            ]),
        );
        main.module(&deployment, "modules/containerapp.bicep")
            .param("registryServer")
            .clone()
    };
    // m3: the registry's own loginServer, read by registry.bicep, not NAME + suffix.
    let own = Value::Unknown("registryAccess!.outputs.loginServer".into());
    assert_eq!(pull(""), own);
    assert_eq!(pull("MyReg.azurecr.io"), own);
    assert!(
        matches!(pull("other.azurecr.io"), Value::Failed(m) if m.contains("acrResourceId")),
        "{:?}",
        pull("other.azurecr.io")
    );
    let main = Scope::main_with(
        &deployment,
        with(&[("namePrefix", Value::Str("SbInbox-Dev".into()))]),
    );
    let problems = name_problems(&main, &deployment);
    assert!(problems.is_empty(), "names:\n{}", problems.join("\n"));
}
