//! The database on the first deployment (issue 31): the worker and the migrate job can reach it
//! with the defaults, no revision waits on a ready replica before the users and the schema exist,
//! the users are created by object id, and `infra/setup-database.sh` runs steps 2-4 in the order
//! docs/deploy.md gives, checked by running it against stand-ins for `az` and `sqlcmd` that
//! record their calls. The restore runbook stops the worker in a way the platform accepts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::eval::{RESOURCE_GROUP_ID, Scope, Value};
use crate::{deployment, read};

/// Without a VNet the Container Apps environment has no fixed egress address, so the server's
/// firewall must admit Azure services, or the migrate job fails with 40615 and the worker is
/// never ready.
#[test]
fn the_worker_reaches_the_database_with_the_defaults() {
    let deployment = deployment();
    let main = Scope::main(&deployment);
    let environment = main
        .module(&deployment, "modules/containerapp.bicep")
        .resource("environment");
    assert_eq!(
        environment.path("properties.vnetConfiguration"),
        Some(&Value::Null),
        "the default environment has no VNet: the firewall rule is its path"
    );
    let rule = main
        .module(&deployment, "modules/sql.bicep")
        .resource_declared("allowAzure");
    assert_eq!(
        rule.condition,
        Value::Bool(true),
        "no firewall rule admits the Container Apps environment with the parameters file"
    );
    for bound in ["startIpAddress", "endIpAddress"] {
        assert_eq!(
            rule.body.path(&format!("properties.{bound}")),
            Some(&Value::Str("0.0.0.0".into())),
            "0.0.0.0-0.0.0.0 is Azure's marker for Azure services"
        );
    }
    // Said plainly where the operator decides.
    let docs = read("docs/deploy.md");
    assert!(
        docs.contains("admits connections from every Azure customer's services"),
        "docs/deploy.md must state what the default firewall rule admits"
    );
}

fn min_replicas(overrides: &[(&str, Value)]) -> Value {
    let deployment = deployment();
    let overrides: BTreeMap<String, Value> = overrides
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    let main = Scope::main_with(&deployment, overrides);
    main.module(&deployment, "modules/containerapp.bicep")
        .resource("app")
        .path("properties.template.scale.minReplicas")
        .cloned()
        .unwrap_or(Value::Null)
}

/// Before the users and the schema exist `/readyz` answers 503: the first revision must not
/// wait for a ready replica, so the first deployment (the parameters file as shipped) creates
/// the app with 0 minimum replicas, and `databaseReady=true` restores minReplicas.
#[test]
fn the_first_deployment_waits_for_no_ready_replica() {
    assert_eq!(
        min_replicas(&[]),
        Value::Int(0),
        "the first deployment must not wait for a replica the database cannot make ready"
    );
    assert_eq!(
        min_replicas(&[("databaseReady", Value::Bool(true))]),
        Value::Int(1)
    );
    assert_eq!(
        min_replicas(&[
            ("databaseReady", Value::Bool(true)),
            ("minReplicas", Value::Int(3))
        ]),
        Value::Int(3)
    );
    for file in ["infra/main.parameters.json", "infra/main.bicepparam"] {
        assert!(
            !read(file).contains("databaseReady"),
            "{file} is the first deployment's: databaseReady stays at its default (false)"
        );
    }
}

/// A directory of stand-ins for `az` and `sqlcmd` that append each call to `calls.log`.
pub(crate) struct FakeTools {
    dir: PathBuf,
}

impl FakeTools {
    /// `job_status` is what `az containerapp job execution show` answers after one `Running`.
    pub(crate) fn new(name: &str, job_status: &str) -> Self {
        Self::with(name, job_status, "azureServices", 0)
    }

    /// As [`FakeTools::new`], the deployment's `databaseNetwork` output `network`, and
    /// `sqlcmd` failing its first `sqlcmd_failures` calls (the firewall rule not active yet, a
    /// paused database resuming).
    pub(crate) fn with(name: &str, job_status: &str, network: &str, sqlcmd_failures: u32) -> Self {
        let dir =
            std::env::temp_dir().join(format!("sb-inbox-infra-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let az = format!(
            r#"#!/usr/bin/env bash
echo "az $*" >> "{log}"
case "$*" in
  *"deployment group show"*sqlServerFqdn*) echo sbinbox-dev-sql-u7c3k9x2m4q1z.database.windows.net ;;
  *"deployment group show"*sqlDatabaseName*) echo sbinbox ;;
  *"deployment group show"*migrateJobName*) echo sbinbox-dev-migrate ;;
  *"deployment group show"*workerIdentityName*) echo sbinbox-dev-worker ;;
  *"deployment group show"*workerIdentityClientId*) echo 11111111-1111-1111-1111-111111111111 ;;
  *"deployment group show"*databaseNetwork*) echo "{network}" ;;
  *"deployment group show"*migrateIdentityName*) echo sbinbox-dev-migrate ;;
  *"deployment group show"*migrateIdentityClientId*) echo 22222222-2222-2222-2222-222222222222 ;;
  *"deployment group show"*) echo "unexpected output query: $*" >&2; exit 3 ;;
  *"containerapp job start"*) echo sbinbox-dev-migrate-x1y2z3 ;;
  *"containerapp job execution show"*)
    if [ -e "{dir}/polled" ]; then echo {job_status}; else touch "{dir}/polled"; echo Running; fi ;;
esac
"#,
            log = dir.join("calls.log").display(),
            dir = dir.display(),
        );
        let sqlcmd = format!(
            r#"#!/usr/bin/env bash
echo "sqlcmd $*" >> "{log}"
n=$(cat "{dir}/sqlcmd-calls" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "{dir}/sqlcmd-calls"
if [ "$n" -le {sqlcmd_failures} ]; then echo "Msg 40615: Cannot open server" >&2; exit 1; fi
"#,
            log = dir.join("calls.log").display(),
            dir = dir.display(),
        );
        for (tool, text) in [("az", az), ("sqlcmd", sqlcmd)] {
            let path = dir.join(tool);
            std::fs::write(&path, text).unwrap();
            Command::new("chmod").arg("+x").arg(&path).status().unwrap();
        }
        FakeTools { dir }
    }

    /// Runs `infra/setup-database.sh` with the stand-ins first on PATH: its exit code and the
    /// calls in order.
    pub(crate) fn run_setup(&self) -> (Option<i32>, Vec<String>) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let path = format!(
            "{}:{}",
            self.dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let output = Command::new("bash")
            .arg(root.join("infra/setup-database.sh"))
            .args(["-g", "rg-test", "-p", "infra/main.bicepparam"])
            .args(["--client-ip", "203.0.113.7"])
            .current_dir(root)
            .env("PATH", path)
            .env("SETUP_DATABASE_POLL_SECS", "0")
            .env("SETUP_DATABASE_RETRY_SECS", "0")
            .output()
            .unwrap();
        let calls = std::fs::read_to_string(self.dir.join("calls.log")).unwrap_or_default();
        let calls = calls.lines().map(str::to_owned).collect();
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        (output.status.code(), calls)
    }
}

impl Drop for FakeTools {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn position(calls: &[String], what: &[&str]) -> usize {
    calls
        .iter()
        .position(|c| what.iter().all(|w| c.contains(w)))
        .unwrap_or_else(|| panic!("no call with {what:?} in:\n{}", calls.join("\n")))
}

/// Steps 2-4 in order: users by client id (firewall open meanwhile), the migrate job until it
/// succeeded, then the redeployment with databaseReady=true; the firewall rule removed at the
/// end.
#[test]
fn the_setup_script_creates_users_by_client_id_then_migrates_then_scales() {
    let tools = FakeTools::new("setup-ok", "Succeeded");
    let (code, calls) = tools.run_setup();
    assert_eq!(code, Some(0), "{}", calls.join("\n"));
    let open = position(
        &calls,
        &[
            "sql server firewall-rule create",
            "--start-ip-address 203.0.113.7",
        ],
    );
    let worker = position(
        &calls,
        &[
            "sqlcmd",
            "IdentityName=sbinbox-dev-worker",
            "ClientId=11111111-1111-1111-1111-111111111111",
            "Role=worker",
            "create_managed_identity_user.sql",
        ],
    );
    let migrate_user = position(
        &calls,
        &[
            "sqlcmd",
            "IdentityName=sbinbox-dev-migrate",
            "ClientId=22222222-2222-2222-2222-222222222222",
            "Role=migrate",
        ],
    );
    let start = position(
        &calls,
        &["containerapp job start", "-n sbinbox-dev-migrate"],
    );
    let succeeded = calls
        .iter()
        .rposition(|c| c.contains("containerapp job execution show"))
        .unwrap();
    let redeploy = position(
        &calls,
        &[
            "deployment group create",
            "-p infra/main.bicepparam",
            "databaseReady=true",
        ],
    );
    let close = position(&calls, &["sql server firewall-rule delete"]);
    assert!(
        open < worker && worker < migrate_user && migrate_user < start,
        "{calls:#?}"
    );
    assert!(
        start < succeeded && succeeded < redeploy && redeploy < close,
        "{calls:#?}"
    );
    // It waited: one `Running` answer, then `Succeeded`.
    let polls = calls
        .iter()
        .filter(|c| c.contains("containerapp job execution show"))
        .count();
    assert_eq!(polls, 2, "{calls:#?}");
    let sql = read("sql/mssql/create_managed_identity_user.sql");
    assert!(
        sql.contains("WITH SID = ' + @sid + N', TYPE = E"),
        "the script creates the user by client id, without a Graph lookup"
    );
}

/// A failed migration leaves the app at 0 minimum replicas (no redeployment) and says so.
#[test]
fn the_setup_script_stops_when_the_migration_fails() {
    let tools = FakeTools::new("setup-failed", "Failed");
    let (code, calls) = tools.run_setup();
    assert_eq!(code, Some(1), "{}", calls.join("\n"));
    assert!(
        !calls.iter().any(|c| c.contains("deployment group create")),
        "{calls:#?}"
    );
    // The firewall rule goes on failure too.
    position(&calls, &["sql server firewall-rule delete"]);
}

/// docs/deploy.md gives the steps in the order the templates need: deploy, users, migrate,
/// databaseReady=true.
#[test]
fn the_docs_give_the_first_deployment_steps_in_order() {
    let docs = read("docs/deploy.md");
    let at = |needle: &str| {
        docs.find(needle)
            .unwrap_or_else(|| panic!("docs/deploy.md lacks {needle:?}"))
    };
    let deploy = at("az deployment group create -g RG -n main -f infra/main.bicep");
    let users = at("ClientId=\"$WORKER_CLIENT_ID\"");
    let migrate = at("az containerapp job start -g RG -n");
    let ready = at("-p databaseReady=true");
    let script = at("infra/setup-database.sh -g RG -p infra/main.bicepparam");
    assert!(
        deploy < users && users < migrate && migrate < ready,
        "deploy {deploy}, users {users}, migrate {migrate}, databaseReady {ready}"
    );
    assert!(deploy < script, "the script follows the first deployment");
}

/// `az containerapp update --max-replicas 0` is refused (the minimum is 1): the runbook stops
/// the worker by deactivating its revision, and starts it again by activating it.
#[test]
fn the_restore_runbook_stops_the_worker_by_deactivating_its_revision() {
    let docs = read("docs/deploy.md");
    for line in docs.lines().filter(|l| l.contains("--max-replicas")) {
        let value = line
            .split("--max-replicas")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or("");
        assert!(
            value.parse::<u32>().is_ok_and(|n| n >= 1),
            "--max-replicas must be at least 1: {line}"
        );
    }
    let restore = &docs[docs
        .find("## Restore the database")
        .expect("restore section")..];
    let restore = &restore[..restore[3..].find("\n## ").map_or(restore.len(), |i| i + 3)];
    let deactivate = restore
        .find("az containerapp revision deactivate")
        .expect("the restore runbook deactivates the revision");
    let restore_db = restore.find("az sql db restore").expect("restore command");
    let activate = restore
        .find("az containerapp revision activate")
        .expect("the restore runbook activates the revision again");
    assert!(
        deactivate < restore_db && restore_db < activate,
        "{restore}"
    );
}

/// `databaseNetwork: 'private'`: the environment runs in the VNet's delegated subnet, the server
/// has a private endpoint there resolved through the privatelink zone linked to that VNet, and
/// takes no public traffic.
#[test]
fn the_private_network_reaches_the_database_through_its_private_endpoint() {
    let deployment = deployment();
    let main = Scope::main_with(
        &deployment,
        BTreeMap::from([("databaseNetwork".to_owned(), Value::Str("private".into()))]),
    );
    let sql = main.module(&deployment, "modules/sql.bicep");
    assert_eq!(
        sql.resource_declared("allowAzure").condition,
        Value::Bool(false)
    );
    assert_eq!(
        sql.resource("server")
            .path("properties.publicNetworkAccess"),
        Some(&Value::Str("Disabled".into()))
    );
    let network = main.module(&deployment, "modules/network.bicep");
    let vnet = network.resource("vnet");
    let vnet_name = vnet.get("name").and_then(Value::as_str).unwrap().to_owned();
    let subnets = vnet.path("properties.subnets").unwrap().items().to_vec();
    let apps = &subnets[0];
    let delegation = format!("{:?}", apps.path("properties.delegations"));
    assert!(
        delegation.contains("Microsoft.App/environments"),
        "{delegation}"
    );
    let prefix = apps
        .path("properties.addressPrefix")
        .and_then(Value::as_str)
        .unwrap();
    let bits: u8 = prefix.rsplit('/').next().unwrap().parse().unwrap();
    assert!(
        bits <= 27,
        "a workload profiles environment needs at least a /27: {prefix}"
    );
    // The environment is placed in that subnet (main names it by resourceId).
    let environment = main
        .module(&deployment, "modules/containerapp.bicep")
        .resource("environment");
    let apps_name = apps.get("name").and_then(Value::as_str).unwrap();
    assert_eq!(
        environment.path("properties.vnetConfiguration.infrastructureSubnetId"),
        Some(&Value::Str(format!(
            "{RESOURCE_GROUP_ID}/providers/Microsoft.Network/virtualNetworks/{vnet_name}/subnets/{apps_name}"
        ))),
        "the environment must run in network.bicep's delegated subnet"
    );
    assert!(
        main.module_depends_on("app").iter().any(|d| d == "network"),
        "the app module waits for the network it runs in"
    );
    // The private endpoint targets the SQL server, and its zone is the privatelink one.
    let endpoint = network.resource("sqlEndpoint");
    let connection = &endpoint
        .path("properties.privateLinkServiceConnections")
        .unwrap()
        .items()[0];
    assert_eq!(
        connection.path("properties.groupIds"),
        Some(&Value::Array(vec![Value::Str("sqlServer".into())]))
    );
    assert!(
        format!("{:?}", connection.path("properties.privateLinkServiceId")).contains("serverId")
    );
    assert_eq!(
        network.resource("sqlZone").get("name"),
        Some(&Value::Str("privatelink.database.windows.net".into()))
    );
    let names = crate::deployment::names_with(&[("databaseNetwork", Value::Str("private".into()))]);
    assert!(names.is_empty(), "names:\n{}", names.join("\n"));
}
