//! Consistency of a Bicep deployment: every file parses, every module path exists, every module
//! call passes exactly the module's parameters (all required ones, no unknown ones), every
//! `module.outputs.x` used exists in that module, and the parameters file supplies every required
//! parameter of the entry file and nothing else.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use crate::bicep::{self, BicepFile};

/// The files of one deployment, by path relative to the infra folder (`main.bicep`,
/// `modules/x.bicep`), so tests can check broken samples without touching the disk.
#[derive(Debug, Default, Clone)]
pub(crate) struct Deployment {
    pub(crate) bicep: BTreeMap<PathBuf, String>,
    /// The `main.parameters.json` text.
    pub(crate) parameters: String,
}

impl Deployment {
    /// Reads every `*.bicep` under `dir` and `dir/main.parameters.json`.
    pub(crate) fn read(dir: &Path) -> std::io::Result<Self> {
        let mut bicep = BTreeMap::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(folder) = pending.pop() {
            for entry in std::fs::read_dir(&folder)? {
                let path = entry?.path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|e| e == "bicep") {
                    let relative = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
                    bicep.insert(relative, std::fs::read_to_string(&path)?);
                }
            }
        }
        let parameters = std::fs::read_to_string(dir.join("main.parameters.json"))?;
        Ok(Self { bicep, parameters })
    }

    /// The parameter values of `main.parameters.json`, by name.
    pub(crate) fn parameter_values(&self) -> Result<BTreeMap<String, serde_json::Value>, String> {
        let json: serde_json::Value = serde_json::from_str(&self.parameters)
            .map_err(|e| format!("main.parameters.json: not JSON: {e}"))?;
        let params = json
            .get("parameters")
            .and_then(serde_json::Value::as_object)
            .ok_or("main.parameters.json: no \"parameters\" object")?;
        Ok(params
            .iter()
            .map(|(name, p)| (name.clone(), p.get("value").cloned().unwrap_or_default()))
            .collect())
    }
}

/// Every problem found, one line each; empty when the deployment is consistent.
pub(crate) fn check(deployment: &Deployment) -> Vec<String> {
    let mut problems = Vec::new();
    let mut parsed: BTreeMap<PathBuf, BicepFile> = BTreeMap::new();
    for (path, source) in &deployment.bicep {
        match bicep::parse(source) {
            Ok(file) => {
                parsed.insert(path.clone(), file);
            }
            Err(errors) => {
                problems.extend(
                    errors
                        .into_iter()
                        .map(|e| format!("{}:{e}", path.display())),
                );
            }
        }
    }

    for (path, file) in &parsed {
        let mut seen = Vec::new();
        for output in &file.outputs {
            if seen.contains(&output) {
                problems.push(format!(
                    "{}: output `{output}` declared twice",
                    path.display()
                ));
            }
            seen.push(output);
        }
        for call in &file.modules {
            let at = format!("{}:{}: module `{}`", path.display(), call.line, call.symbol);
            let target = resolve(path, &call.path);
            let Some(module) = parsed.get(&target) else {
                if deployment.bicep.contains_key(&target) {
                    // It exists but does not parse: already reported above.
                    continue;
                }
                problems.push(format!("{at}: '{}' does not exist", call.path));
                continue;
            };
            let Some(passed) = &call.params else {
                problems.push(format!(
                    "{at}: `params` is not an object literal, cannot check it"
                ));
                continue;
            };
            for p in module.params.iter().filter(|p| p.required) {
                if !passed.contains(&p.name) {
                    problems.push(format!("{at}: required parameter `{}` not passed", p.name));
                }
            }
            for name in passed {
                if module.param(name).is_none() {
                    problems.push(format!("{at}: '{}' has no parameter `{name}`", call.path));
                }
            }
        }
        for used in &file.output_refs {
            let Some(call) = file.modules.iter().find(|m| m.symbol == used.symbol) else {
                // `x.outputs.y` on something that is not a module (e.g. a nested deployment).
                continue;
            };
            let Some(module) = parsed.get(&resolve(path, &call.path)) else {
                continue;
            };
            if !module.outputs.contains(&used.output) {
                problems.push(format!(
                    "{}:{}: '{}' has no output `{}`",
                    path.display(),
                    used.line,
                    call.path,
                    used.output
                ));
            }
        }
    }

    match (
        parsed.get(Path::new("main.bicep")),
        deployment.parameter_values(),
    ) {
        (None, _) if !deployment.bicep.contains_key(Path::new("main.bicep")) => {
            problems.push("main.bicep does not exist".to_owned());
        }
        (None, _) => {}
        (Some(_), Err(e)) => problems.push(e),
        (Some(main), Ok(values)) => {
            for p in main.params.iter().filter(|p| p.required) {
                if !values.contains_key(&p.name) {
                    problems.push(format!(
                        "main.parameters.json: required parameter `{}` of main.bicep not supplied",
                        p.name
                    ));
                }
            }
            for name in values.keys() {
                if main.param(name).is_none() {
                    problems.push(format!(
                        "main.parameters.json: `{name}` is not a parameter of main.bicep"
                    ));
                }
            }
        }
    }
    problems
}

/// `modules/x.bicep` called from `main.bicep` resolves to `modules/x.bicep`; `../a.bicep` from
/// `modules/b.bicep` to `a.bicep`.
fn resolve(from: &Path, target: &str) -> PathBuf {
    let base = from.parent().unwrap_or_else(|| Path::new(""));
    let mut out = PathBuf::new();
    for component in base.join(target).components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
