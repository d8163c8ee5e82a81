//! The monitoring the charts ship, as tests read it: the alert rule files
//! and dashboards under each chart's `files/`, the PromQL in them taken
//! apart far enough to name every series it reads (metric, label matchers,
//! grouping labels), the Prometheus text format a component's `/metrics`
//! answers, promtool, and the Prometheus Operator kinds the charts render.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A chart's alert rules (`files/rules.yaml`).
pub fn rules_file(chart: &str) -> PathBuf {
    super::chart::root()
        .join("deploy/helm")
        .join(chart)
        .join("files/rules.yaml")
}

/// A chart's dashboards (`files/dashboards/*.json`), sorted.
pub fn dashboard_files(chart: &str) -> Vec<PathBuf> {
    let dir = super::chart::root()
        .join("deploy/helm")
        .join(chart)
        .join("files/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no dashboards in {}", dir.display());
    files
}

/// Every alert of a rules file: (name, expression).
pub fn alerts(rules: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(rules).unwrap();
    let v: Value = serde_norway::from_str(&text).unwrap();
    let mut out = Vec::new();
    for group in v["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("an alert name").to_owned();
            let expr = rule["expr"].as_str().expect("an expression").to_owned();
            out.push((name, expr));
        }
    }
    out
}

/// What a dashboard queries: (where, PromQL) for every panel target, and
/// for every `label_values(metric, label)` variable its metric as a
/// selector with that label. Grafana's variables are replaced by what they
/// stand for in PromQL: a regex matching everything, a range.
pub fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut panels: Vec<&Value> = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {:?} has a target without expr", p["title"]));
            out.push((
                format!(
                    "panel {:?} {}",
                    p["title"].as_str().unwrap_or(""),
                    t["refId"]
                ),
                grafana_to_promql(expr),
            ));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] != "query" {
            continue;
        }
        let query = var["query"]["query"]
            .as_str()
            .or_else(|| var["query"].as_str())
            .unwrap_or_default();
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| {
                panic!(
                    "variable {:?}: not label_values(metric, label)",
                    var["name"]
                )
            });
        let (metric, label) = inner
            .split_once(',')
            .unwrap_or_else(|| panic!("variable {:?}: label_values needs a metric", var["name"]));
        out.push((
            format!("variable {:?}", var["name"].as_str().unwrap_or("")),
            format!("count by ({}) ({})", label.trim(), metric.trim()),
        ));
    }
    out
}

/// `expr` with Grafana's variables replaced by PromQL that means the same
/// to Prometheus: `$__rate_interval` a range, `$var` an all-matching regex.
pub fn grafana_to_promql(expr: &str) -> String {
    let mut out = expr
        .replace("$__rate_interval", "5m")
        .replace("$__range", "1h");
    while let Some(i) = out.find('$') {
        let end = out[i + 1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(out.len(), |e| i + 1 + e);
        out.replace_range(i..end, ".*");
    }
    out
}

/// One series selector of an expression: the metric and the labels its
/// matchers name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// The metric name.
    pub metric: String,
    /// Labels named in `{…}`.
    pub labels: Vec<String>,
}

/// What an expression reads: its selectors, and the labels it groups or
/// matches on (`by`, `without`, `on`, `ignoring`, `group_left`,
/// `group_right`).
#[derive(Debug, Default)]
pub struct Reads {
    /// Every series selector.
    pub selectors: Vec<Selector>,
    /// Every label of a grouping or matching clause.
    pub grouping: BTreeSet<String>,
}

const KEYWORDS: [&str; 12] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
];
const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Takes `expr` apart far enough to name what it reads. Not a PromQL
/// parser (promtool checks the syntax): it skips strings, ranges and
/// numbers, takes an identifier followed by `(`, `by` or `without` as a
/// function or aggregation, the list after a grouping keyword as labels,
/// and every other identifier outside braces as a metric, with the labels
/// its `{…}` matches on.
pub fn reads(expr: &str) -> Reads {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Reads::default();
    let mut i = 0;
    let ident = |i: usize| -> (String, usize) {
        let mut j = i;
        while j < chars.len()
            && (chars[j].is_ascii_alphanumeric() || chars[j] == '_' || chars[j] == ':')
        {
            j += 1;
        }
        (chars[i..j].iter().collect(), j)
    };
    let skip_ws = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    // The labels named in the `{…}` starting at `i`; returns them and the
    // index after `}`.
    let matchers = |mut i: usize| -> (Vec<String>, usize) {
        let mut labels = Vec::new();
        i += 1;
        loop {
            i = skip_ws(i);
            match chars.get(i) {
                None => return (labels, i),
                Some('}') => return (labels, i + 1),
                Some(',') => i += 1,
                Some('"' | '\'' | '`') => i = skip_string(&chars, i),
                Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
                    let (name, j) = ident(i);
                    labels.push(name);
                    i = j;
                    // The operator and value.
                    i = skip_ws(i);
                    while i < chars.len() && "=!~".contains(chars[i]) {
                        i += 1;
                    }
                    i = skip_ws(i);
                    if i < chars.len() && "\"'`".contains(chars[i]) {
                        i = skip_string(&chars, i);
                    }
                }
                Some(c) => panic!("unexpected {c:?} in the matchers of {expr}"),
            }
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let (name, j) = ident(i);
            let next = skip_ws(j);
            if GROUPING.contains(&name.as_str()) && chars.get(next) == Some(&'(') {
                let close = chars[next..]
                    .iter()
                    .position(|&c| c == ')')
                    .map_or(chars.len(), |p| next + p);
                let list: String = chars[next + 1..close].iter().collect();
                out.grouping.extend(
                    list.split(',')
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned),
                );
                i = close + 1;
            } else if chars.get(next) == Some(&'(')
                || KEYWORDS.contains(&name.as_str())
                || name == "group_right"
                // An aggregation with its grouping first: `sum by (l) (…)`.
                || ["by", "without"].contains(&ident(next).0.as_str())
            {
                i = j;
            } else if chars.get(next) == Some(&'{') {
                let (labels, after) = matchers(next);
                out.selectors.push(Selector {
                    metric: name,
                    labels,
                });
                i = after;
            } else {
                out.selectors.push(Selector {
                    metric: name,
                    labels: Vec::new(),
                });
                i = j;
            }
        } else {
            i += 1;
        }
    }
    out
}

fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && quote != '`' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The series of a Prometheus text exposition: metric name → the label
/// names seen on its samples (comments and `# EOF` skipped).
pub fn exposition(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let labels = out.entry(line[..end].to_owned()).or_default();
        if line[end..].starts_with('{') {
            let chars: Vec<char> = line[end..].chars().collect();
            let mut i = 1;
            while i < chars.len() && chars[i] != '}' {
                let start = i;
                while chars[i] != '=' {
                    i += 1;
                }
                labels.insert(chars[start..i].iter().collect::<String>().trim().to_owned());
                i = skip_string(&chars, i + 1);
                if chars.get(i) == Some(&',') {
                    i += 1;
                }
            }
        }
    }
    out
}

/// Labels Prometheus adds to every series it scrapes through a
/// PodMonitor: an expression may use them though no `/metrics` has them.
pub const TARGET_LABELS: [&str; 6] = [
    "namespace",
    "pod",
    "container",
    "instance",
    "job",
    "endpoint",
];

/// Everything `reads` names that `series` (the scraped components' series)
/// lacks, one line each; empty when the expression reads only what exists.
pub fn missing(what: &str, expr: &str, series: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reads = reads(expr);
    let mut out = Vec::new();
    if reads.selectors.is_empty() {
        out.push(format!("{what}: reads no series: {expr}"));
    }
    let mut seen_labels = BTreeSet::new();
    for s in &reads.selectors {
        let Some(labels) = series.get(&s.metric) else {
            out.push(format!("{what}: no component exports {}", s.metric));
            continue;
        };
        seen_labels.extend(labels.iter().cloned());
        for l in &s.labels {
            if !labels.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
                out.push(format!(
                    "{what}: {} has no label {l} (it has {labels:?})",
                    s.metric
                ));
            }
        }
    }
    for l in &reads.grouping {
        if !seen_labels.contains(l) && !TARGET_LABELS.contains(&l.as_str()) && l != "le" {
            out.push(format!(
                "{what}: groups or matches on {l}, which none of its series has"
            ));
        }
    }
    out
}

/// The promtool binary. Missing is a failure, not a skip: the alert tests
/// are part of the suite (`.ci/run` installs Debian's `prometheus`).
pub fn promtool() -> Command {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "promtool was not found: it comes with Debian's `prometheus` package \
         (apt-get install prometheus), which .ci/run installs"
    );
    Command::new("promtool")
}

/// Runs promtool with `args` in `dir`: its output, or why it failed.
pub fn run_promtool(args: &[&str], dir: &Path) -> Result<String, String> {
    let out = promtool()
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("running promtool: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "promtool {args:?} exited with {}:\n{text}",
            out.status
        ))
    }
}

/// The Prometheus Operator kinds the charts render, as the operator's CRDs
/// declare the fields the charts use: unknown fields are refused, so a
/// misspelt one fails the schema check as a Kubernetes one does.
pub mod operator {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use serde::{Deserialize, Serialize};

    /// `PodMonitor.monitoring.coreos.com/v1`.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PodMonitor {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: PodMonitorSpec,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PodMonitorSpec {
        pub selector: LabelSelector,
        pub pod_metrics_endpoints: Vec<PodMetricsEndpoint>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PodMetricsEndpoint {
        pub port: String,
        pub path: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub interval: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub scrape_timeout: Option<String>,
    }

    /// `PrometheusRule.monitoring.coreos.com/v1`.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PrometheusRule {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: PrometheusRuleSpec,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PrometheusRuleSpec {
        pub groups: Vec<RuleGroup>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct RuleGroup {
        pub name: String,
        pub rules: Vec<Rule>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Rule {
        pub alert: String,
        pub expr: String,
        #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
        pub for_: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub labels: Option<BTreeMap<String, String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub annotations: Option<BTreeMap<String, String>>,
    }
}
