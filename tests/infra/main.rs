//! Offline checks of the Bicep under `infra/`: every file parses with the tree-sitter Bicep
//! grammar (no ERROR or MISSING node), module paths exist, module calls pass exactly the
//! module's parameters, `main.parameters.json` matches `main.bicep`, dedupe retention covers the
//! replay horizon, no template holds a secret, templates, docs and image agree, and what the
//! deployment would create holds up (`deployment`: names, identities, image, ordering, grace,
//! probes, scale defaults; evaluated offline by `eval`).
//! `database`: the worker reaches the database with the defaults, the first deployment waits
//! for no ready replica, `infra/setup-database.sh` creates the users by object id, migrates and
//! only then scales (run against recording stand-ins for `az` and `sqlcmd`).
//! `workflows`: the servicebus-emulator workflow agrees with its compose file, Config.json and
//! tests; the release workflow can attest and log in to Azure on every tag. `az bicep build`,
//! `az bicep lint`, `docker build` and those workflows run in GitHub Actions only.
#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

mod bicep;
mod check;
mod dashboards;
mod database;
mod deployment;
mod eval;
mod round4;
mod wiring;
mod workflows;

use std::path::{Path, PathBuf};

use check::{Deployment, check};

fn infra_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("infra")
}

/// A file of the repository, by path from its root.
fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn deployment() -> Deployment {
    Deployment::read(&infra_dir()).expect("read infra/")
}

#[test]
fn infra_parses_and_is_consistent() {
    let deployment = deployment();
    assert!(
        deployment.bicep.len() >= 2,
        "expected main.bicep and modules"
    );
    let problems = check(&deployment);
    assert!(
        problems.is_empty(),
        "infra/ problems:\n{}",
        problems.join("\n")
    );
    // Every module file is used by main.bicep, and every call's params were read.
    let main = bicep::parse(&deployment.bicep[Path::new("main.bicep")]).unwrap();
    let modules = deployment.bicep.len() - 1;
    assert_eq!(main.modules.len(), modules, "{:#?}", main.modules);
    assert!(
        main.modules
            .iter()
            .all(|m| m.params.as_ref().is_some_and(|p| !p.is_empty()))
    );
    assert!(main.params.iter().filter(|p| p.required).count() >= 4);
    assert!(main.output_refs.len() >= 10, "{:#?}", main.output_refs);
}

#[test]
fn main_declares_the_documented_outputs() {
    let main = bicep::parse(&deployment().bicep[Path::new("main.bicep")]).unwrap();
    for output in [
        "serviceBusNamespaceFqdn",
        "entity",
        "sqlServerFqdn",
        "appName",
        "workerIdentityClientId",
    ] {
        assert!(
            main.outputs.iter().any(|o| o == output),
            "missing output {output}"
        );
    }
}

/// The article: retention must exceed the longest possible replay. The worker checks the same at
/// start-up; this catches a parameters file that would make it refuse to start.
#[test]
fn retention_covers_the_replay_horizon() {
    let deployment = deployment();
    let main = bicep::parse(&deployment.bicep[Path::new("main.bicep")]).unwrap();
    let values = deployment.parameter_values().unwrap();
    let value = |name: &str| -> i64 {
        values
            .get(name)
            .and_then(serde_json::Value::as_i64)
            .or_else(|| main.param(name).and_then(|p| p.int_default))
            .unwrap_or_else(|| panic!("{name}: no integer value or default"))
    };
    let horizon = value("messageTtlSecs")
        + value("lockDurationSecs") * value("maxDeliveryCount")
        + value("retryMaxRetries") * value("retryMaxDelaySecs")
        + value("dlqResubmitWindowSecs");
    let retention = value("retentionSecs");
    // The same rule as the worker's start-up check (it refuses retention < horizon).
    assert!(
        retention >= horizon,
        "retentionSecs {retention} must cover the replay horizon {horizon}"
    );
}

#[test]
fn no_secrets_in_templates() {
    let forbidden = [
        "listKeys(",
        "listConnectionStrings(",
        "administratorLoginPassword",
        "SharedAccessKey=",
        "AccountKey=",
        "Password=",
        "@secure()",
    ];
    let deployment = deployment();
    let mut found = Vec::new();
    for (path, source) in &deployment.bicep {
        for needle in forbidden {
            if source.contains(needle) {
                found.push(format!("{}: {needle}", path.display()));
            }
        }
    }
    for needle in forbidden {
        if deployment.parameters.contains(needle) {
            found.push(format!("main.parameters.json: {needle}"));
        }
    }
    assert!(
        found.is_empty(),
        "secrets in templates:\n{}",
        found.join("\n")
    );
}

// ---- The checker catches broken samples ----

const MODULE: &str = "\
@description('Needed.')
param name string
param size int = 1
output id string = name
";

const MAIN: &str = "\
param prefix string
param location string = resourceGroup().location
module m 'modules/m.bicep' = {
  name: 'm'
  params: {
    name: prefix
    size: 2
  }
}
module c 'modules/m.bicep' = if (true) {
  name: 'c'
  params: {
    name: location
  }
}
output id string = m.outputs.id
";

const PARAMETERS: &str = r#"{ "parameters": { "prefix": { "value": "x" } } }"#;

fn sample(main: &str, module: &str, parameters: &str) -> Deployment {
    let mut d = Deployment {
        parameters: parameters.to_owned(),
        ..Deployment::default()
    };
    d.bicep.insert("main.bicep".into(), main.to_owned());
    d.bicep.insert("modules/m.bicep".into(), module.to_owned());
    d
}

fn problems_of(main: &str, module: &str, parameters: &str) -> String {
    check(&sample(main, module, parameters)).join("\n")
}

#[test]
fn sample_is_consistent() {
    assert_eq!(problems_of(MAIN, MODULE, PARAMETERS), "");
}

#[test]
fn catches_wrong_module_path() {
    let main = MAIN.replace("'modules/m.bicep' = {", "'modules/missing.bicep' = {");
    let problems = problems_of(&main, MODULE, PARAMETERS);
    assert!(
        problems.contains("'modules/missing.bicep' does not exist"),
        "{problems}"
    );
}

#[test]
fn catches_missing_required_module_parameter() {
    let module = format!("{MODULE}param extra string\n");
    let problems = problems_of(MAIN, &module, PARAMETERS);
    assert!(
        problems.contains("module `m`: required parameter `extra` not passed"),
        "{problems}"
    );
    assert!(
        problems.contains("module `c`: required parameter `extra` not passed"),
        "conditional module calls are checked too: {problems}"
    );
}

#[test]
fn catches_unknown_module_parameter() {
    let main = MAIN.replace("size: 2", "size: 2\n    colour: 'red'");
    let problems = problems_of(&main, MODULE, PARAMETERS);
    assert!(problems.contains("has no parameter `colour`"), "{problems}");
}

#[test]
fn catches_unknown_module_output() {
    let main = MAIN.replace("m.outputs.id", "m.outputs.name");
    let problems = problems_of(&main, MODULE, PARAMETERS);
    assert!(
        problems.contains("'modules/m.bicep' has no output `name`"),
        "{problems}"
    );
}

#[test]
fn catches_required_parameter_missing_from_parameters_file() {
    let problems = problems_of(MAIN, MODULE, r#"{ "parameters": {} }"#);
    assert!(
        problems.contains("required parameter `prefix` of main.bicep not supplied"),
        "{problems}"
    );
}

#[test]
fn catches_unknown_parameter_in_parameters_file() {
    let parameters = r#"{ "parameters": { "prefix": { "value": "x" }, "sku": { "value": 1 } } }"#;
    let problems = problems_of(MAIN, MODULE, parameters);
    assert!(
        problems.contains("`sku` is not a parameter of main.bicep"),
        "{problems}"
    );
}

#[test]
fn catches_syntax_errors() {
    let module = MODULE.replace("param size int = 1", "param size int = (1");
    let problems = problems_of(MAIN, &module, PARAMETERS);
    assert!(problems.starts_with("modules/m.bicep:"), "{problems}");
    assert!(
        problems.contains("syntax error") || problems.contains("missing"),
        "{problems}"
    );
}

#[test]
fn a_default_makes_a_parameter_optional() {
    let file = bicep::parse(MODULE).unwrap();
    assert!(file.param("name").unwrap().required);
    let size = file.param("size").unwrap();
    assert!(!size.required);
    assert_eq!(size.int_default, Some(1));
}
