//! The dashboards and alert rules query only names the worker emits: every metric, label and
//! dimension in `infra/dashboards/*.json` and every `*MetricName` default of main.bicep is in
//! `sb_inbox::telemetry::names`.

use std::collections::BTreeSet;
use std::path::Path;

use sb_inbox::telemetry::names::{attr, metric, prometheus_label, prometheus_name};

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Prometheus series names of every metric (histograms as `_bucket`, `_sum`, `_count`).
fn prometheus_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (name, _) in metric::ALL {
        let base = prometheus_name(name);
        for suffix in ["", "_bucket", "_sum", "_count"] {
            names.insert(format!("{base}{suffix}"));
        }
    }
    names
}

/// Prometheus labels: our attributes, plus `le` (histogram buckets).
fn prometheus_labels() -> BTreeSet<String> {
    let mut labels: BTreeSet<String> = attr::ALL.iter().map(|a| prometheus_label(a)).collect();
    labels.insert("le".to_owned());
    labels
}

/// The identifiers a PromQL expression uses as metric names and as label names.
#[derive(Debug, Default, PartialEq)]
struct PromNames {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

const PROM_FUNCTIONS: [&str; 11] = [
    "sum",
    "max",
    "min",
    "avg",
    "rate",
    "increase",
    "histogram_quantile",
    "by",
    "without",
    "ignoring",
    "on",
];

fn prom_names(expr: &str) -> PromNames {
    let mut names = PromNames::default();
    // Grafana's `label_values(metric, label)`: the second argument is a label.
    if let Some(args) = expr
        .trim()
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'))
        && let Some((selector, label)) = args.rsplit_once(',')
    {
        let mut inner = prom_names(selector);
        inner.labels.insert(label.trim().to_owned());
        return inner;
    }
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    // Inside `{…}` identifiers are labels; after `by`/`without`, the parenthesised list is.
    let mut in_selector = false;
    let mut label_list = false;
    let mut expect_label_list = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            // Skip string literals (label values).
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c == '$' {
            // Grafana variables ($consumer, $__rate_interval).
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            continue;
        }
        if c == '[' {
            // Range durations: [5m], [$__rate_interval].
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
            continue;
        }
        match c {
            '{' => in_selector = true,
            '}' => in_selector = false,
            '(' if expect_label_list => {
                label_list = true;
                expect_label_list = false;
            }
            ')' => label_list = false,
            _ => {}
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word == "by" || word == "without" {
                expect_label_list = true;
            } else if in_selector || label_list {
                names.labels.insert(word);
            } else if !PROM_FUNCTIONS.contains(&word.as_str()) {
                names.metrics.insert(word);
            }
            continue;
        }
        i += 1;
    }
    names
}

fn strings_in(value: &serde_json::Value, key: &str, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match v {
                    serde_json::Value::String(s) if k == key => out.push(s.clone()),
                    _ => strings_in(v, key, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                strings_in(item, key, out);
            }
        }
        _ => {}
    }
}

/// What is wrong with the Grafana dashboard's queries (panel `expr` and variable `query`).
fn grafana_problems(dashboard: &serde_json::Value) -> (Vec<String>, PromNames) {
    let mut queries = Vec::new();
    strings_in(dashboard, "expr", &mut queries);
    strings_in(dashboard, "query", &mut queries);
    let (metrics, labels) = (prometheus_metrics(), prometheus_labels());
    let mut problems = Vec::new();
    let mut used = PromNames::default();
    for query in queries.iter().filter(|q| *q != "prometheus") {
        let names = prom_names(query);
        for name in &names.metrics {
            if !metrics.contains(name) {
                problems.push(format!("unknown metric `{name}` in {query}"));
            }
        }
        for label in &names.labels {
            if !labels.contains(label) {
                problems.push(format!("unknown label `{label}` in {query}"));
            }
        }
        used.metrics.extend(names.metrics);
        used.labels.extend(names.labels);
    }
    (problems, used)
}

/// Double-quoted literals of a KQL query.
fn kql_literals(query: &str) -> Vec<String> {
    query
        .split('"')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_owned())
        .collect()
}

/// Our namespaces: a literal starting with one of these must be a metric or attribute name.
const PREFIXES: [&str; 4] = ["sb_inbox.", "messaging.", "server.", "error."];

fn workbook_problems(workbook: &serde_json::Value) -> (Vec<String>, BTreeSet<String>) {
    let mut queries = Vec::new();
    strings_in(workbook, "query", &mut queries);
    let known: BTreeSet<&str> = metric::ALL
        .iter()
        .map(|(name, _)| *name)
        .chain(attr::ALL)
        .collect();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for query in &queries {
        for literal in kql_literals(query) {
            if PREFIXES.iter().any(|p| literal.starts_with(p)) {
                if !known.contains(literal.as_str()) {
                    problems.push(format!("unknown name \"{literal}\" in {query}"));
                }
                used.insert(literal);
            }
        }
    }
    (problems, used)
}

/// Metrics behind the panels the issue asks for (throughput, outcomes, duplicate rate, lock
/// renewals and lost locks, outbox backlog); both dashboards must query each.
const PANEL_METRICS: [&str; 6] = [
    metric::CONSUMED_MESSAGES,
    metric::OUTCOMES,
    metric::DUPLICATES,
    metric::LOCK_RENEWALS,
    metric::LOCK_LOST,
    metric::OUTBOX_BACKLOG,
];

fn json(relative: &str) -> serde_json::Value {
    serde_json::from_str(&read(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

#[test]
fn grafana_queries_name_only_emitted_metrics_and_labels() {
    let (problems, used) = grafana_problems(&json("infra/dashboards/sb-inbox.grafana.json"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for name in PANEL_METRICS {
        let series = prometheus_name(name);
        assert!(used.metrics.contains(&series), "no panel queries {series}");
    }
    for histogram in [metric::PROCESS_DURATION, metric::MESSAGE_AGE] {
        let buckets = format!("{}_bucket", prometheus_name(histogram));
        assert!(
            used.metrics.contains(&buckets),
            "no percentiles of {histogram}"
        );
    }
    for label in [
        attr::OUTCOME,
        attr::CONTRACT,
        attr::DEAD_LETTER_REASON,
        attr::PRODUCER,
    ] {
        assert!(used.labels.contains(&prometheus_label(label)), "{label}");
    }
}

#[test]
fn workbook_queries_name_only_emitted_metrics_and_dimensions() {
    let (problems, used) = workbook_problems(&json("infra/dashboards/sb-inbox.workbook.json"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for name in PANEL_METRICS.into_iter().chain([
        metric::MESSAGE_AGE,
        attr::OUTCOME,
        attr::CONTRACT,
        attr::DEAD_LETTER_REASON,
        attr::OPERATION_NAME,
    ]) {
        assert!(used.contains(name), "the workbook never queries {name}");
    }
}

#[test]
fn alert_metric_parameters_are_emitted_metrics() {
    let main = read("infra/main.bicep");
    let mut found = 0;
    for line in main.lines() {
        let Some(rest) = line.strip_prefix("param ") else {
            continue;
        };
        if !rest
            .split_whitespace()
            .next()
            .unwrap_or("")
            .ends_with("MetricName")
        {
            continue;
        }
        let default = rest.split('\'').nth(1).unwrap_or_else(|| panic!("{line}"));
        assert!(
            metric::ALL.iter().any(|(name, _)| *name == default),
            "{line}: not a metric the worker emits"
        );
        found += 1;
    }
    assert!(found >= 3, "lock lost, process duration and age alerts");
}

// ---- The checks catch broken samples ----

#[test]
fn promql_names_are_split_into_metrics_and_labels() {
    let names = prom_names(
        r#"histogram_quantile(0.95, sum by (le, sb_inbox_contract) (rate(messaging_process_duration_seconds_bucket{sb_inbox_consumer=~"$consumer"}[$__rate_interval])))"#,
    );
    assert_eq!(
        names.metrics,
        BTreeSet::from(["messaging_process_duration_seconds_bucket".to_owned()])
    );
    assert_eq!(
        names.labels,
        BTreeSet::from([
            "le".to_owned(),
            "sb_inbox_contract".to_owned(),
            "sb_inbox_consumer".to_owned()
        ])
    );
}

#[test]
fn a_misspelt_metric_or_label_is_reported() {
    let dashboard = serde_json::json!({"panels": [{"targets": [
        {"expr": "sum by (sb_inbox_outcomes) (rate(sb_inbox_outcome_total[5m]))"}
    ]}]});
    let (problems, _) = grafana_problems(&dashboard);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("`sb_inbox_outcome_total`"),
        "{problems:#?}"
    );
    assert!(problems[1].contains("`sb_inbox_outcomes`"), "{problems:#?}");

    let workbook = serde_json::json!({"items": [{"content": {"query":
        "customMetrics | where name == \"sb_inbox.lock.lost_total\" | extend m = customDimensions[\"messaging.message.idx\"]"
    }}]});
    let (problems, _) = workbook_problems(&workbook);
    assert_eq!(problems.len(), 2, "{problems:#?}");
}
