//! The monitoring that ships with the charts, without a cluster: the alert
//! rules pass `promtool check rules` and `promtool test rules` with a case
//! for every alert (and a broken expectation fails); every dashboard
//! expression is PromQL promtool accepts; and the charts render the
//! PodMonitors, the PrometheusRule and the dashboards ConfigMap only when
//! asked, selecting the pods and ports the charts run and carrying exactly
//! the files tested here. `tests/e2e_metrics.rs` checks that every series
//! they read exists on a running chain.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};
use support::chart::{self, render, root};
use support::monitoring::{
    self, alerts, dashboard_files, dashboard_queries, rules_file, run_promtool,
};

const CHARTS: [&str; 2] = ["spinlink", "spinlink-agent"];

/// The promtool unit tests of `chart`'s rules.
fn rule_tests(chart: &str) -> std::path::PathBuf {
    root()
        .join("deploy/monitoring")
        .join(format!("{chart}.test.yaml"))
}

#[test]
fn promtool_checks_the_rules_and_every_alert_has_a_passing_unit_test() {
    for chart in CHARTS {
        let rules = rules_file(chart);
        let out = run_promtool(&["check", "rules", rules.to_str().unwrap()], &root())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.contains("SUCCESS"), "{out}");

        let tests = rule_tests(chart);
        run_promtool(
            &["test", "rules", tests.to_str().unwrap()],
            tests.parent().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{e}"));

        // Every alert has a case where it fires with its labels and
        // annotations spelt out. promtool compares the whole list of
        // alerts at each evaluation, so the series beside the firing ones
        // in each case check that their neighbours stay quiet.
        let text = std::fs::read_to_string(&tests).unwrap();
        let cases: Value = serde_norway::from_str(&text).unwrap();
        let mut fires = BTreeSet::new();
        for test in cases["tests"].as_array().unwrap() {
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap().to_owned();
                match case["exp_alerts"].as_array() {
                    Some(a) if !a.is_empty() => {
                        assert!(
                            a.iter().all(|e| e["exp_annotations"].is_object()),
                            "{chart}: {name}: a firing case must state the annotations"
                        );
                        fires.insert(name);
                    }
                    _ => {}
                }
            }
        }
        let names: BTreeSet<String> = alerts(&rules).into_iter().map(|(n, _)| n).collect();
        assert!(!names.is_empty(), "{chart}: no alerts");
        let untested: Vec<_> = names.difference(&fires).collect();
        assert!(
            untested.is_empty(),
            "{chart}: alerts never tested firing: {untested:?}"
        );
    }
}

#[test]
fn promtool_test_rules_fails_on_a_wrong_expectation() {
    // The unit tests above could pass by testing nothing: the same file,
    // with one expected severity changed, must fail.
    let tmp = tempfile::tempdir().unwrap();
    let chart = "spinlink-agent";
    let text = std::fs::read_to_string(rule_tests(chart)).unwrap();
    let rules = rules_file(chart);
    let text = text.replace(
        "../helm/spinlink-agent/files/rules.yaml",
        rules.to_str().unwrap(),
    );
    let broken = text.replacen("severity: critical", "severity: page", 1);
    assert_ne!(broken, text);
    std::fs::write(tmp.path().join("ok.test.yaml"), &text).unwrap();
    std::fs::write(tmp.path().join("broken.test.yaml"), &broken).unwrap();
    run_promtool(&["test", "rules", "ok.test.yaml"], tmp.path()).unwrap_or_else(|e| panic!("{e}"));
    let e = run_promtool(&["test", "rules", "broken.test.yaml"], tmp.path()).unwrap_err();
    assert!(e.contains("SpinlinkAgentDisconnected"), "{e}");
}

#[test]
fn promql_reads_name_metrics_their_label_matchers_and_groupings() {
    let r = monitoring::reads(
        r#"histogram_quantile(0.99, sum by (le, account) (rate(a_bucket{pod=~"x.*",source!="relay"}[5m])))
           unless on (namespace) (max(b_total{reason=~"t_.*|\"q\""}) > 14 * 86400) - time()"#,
    );
    let selectors: Vec<(String, Vec<String>)> = r
        .selectors
        .iter()
        .map(|s| (s.metric.clone(), s.labels.clone()))
        .collect();
    assert_eq!(
        selectors,
        vec![
            (
                "a_bucket".to_owned(),
                vec!["pod".to_owned(), "source".to_owned()]
            ),
            ("b_total".to_owned(), vec!["reason".to_owned()]),
        ]
    );
    assert_eq!(
        r.grouping,
        ["account", "le", "namespace"].map(str::to_owned).into()
    );
    // And what the check reports against a scrape.
    let series = monitoring::exposition(
        "# TYPE a counter\na_bucket{pod=\"p\",source=\"s\",le=\"1\"} 1\nb_total{reason=\"x,y\"} 2\n",
    );
    let expr = r#"sum by (account) (a_bucket{source="s"}) + c{reason="r"} + b_total{zone="z"}"#;
    let found = monitoring::missing("t", expr, &series);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].contains("no component exports c"), "{found:?}");
    assert!(found[1].contains("b_total has no label zone"), "{found:?}");
    assert!(
        found[2].contains("groups or matches on account"),
        "{found:?}"
    );
    assert_eq!(
        monitoring::grafana_to_promql("rate(x{pod=~\"$pod\"}[$__rate_interval])"),
        "rate(x{pod=~\".*\"}[5m])"
    );
}

#[test]
fn dashboards_are_grafana_json_whose_queries_promtool_parses() {
    let tmp = tempfile::tempdir().unwrap();
    let mut uids = BTreeSet::new();
    for chart in CHARTS {
        for file in dashboard_files(chart) {
            let what = file.display().to_string();
            let d: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                d["title"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("spinlink / ")),
                "{what}"
            );
            let uid = d["uid"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: no uid"));
            assert!(
                uid.len() <= 40 && uids.insert(uid.to_owned()),
                "{what}: uid {uid}"
            );
            // Every panel queries the data source the dashboard's variable
            // picks, and has an id of its own.
            let datasource = d["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["type"] == "datasource")
                .unwrap_or_else(|| panic!("{what}: no data source variable"));
            assert_eq!(datasource["query"], "prometheus", "{what}");
            let mut ids = BTreeSet::new();
            for p in d["panels"].as_array().unwrap() {
                assert!(
                    ids.insert(p["id"].as_u64().unwrap()),
                    "{what}: panel id {}",
                    p["id"]
                );
                if p["type"] != "row" {
                    assert_eq!(
                        p["datasource"],
                        json!({"type": "prometheus", "uid": "${datasource}"}),
                        "{what}: {}",
                        p["title"]
                    );
                    assert!(p["description"].as_str().is_some_and(|s| !s.is_empty()));
                }
            }
            // Each query as a recording rule: promtool parses them all.
            let queries = dashboard_queries(&d);
            assert!(queries.len() >= 10, "{what}: {} queries", queries.len());
            let rules: Vec<Value> = queries
                .iter()
                .enumerate()
                .map(|(i, (_, expr))| json!({"record": format!("dashboard:query_{i}"), "expr": expr}))
                .collect();
            let path = tmp.path().join(format!("{uid}.rules.yaml"));
            let text = serde_norway::to_string(&json!({"groups": [{"name": uid, "rules": rules}]}))
                .unwrap();
            std::fs::write(&path, text).unwrap();
            run_promtool(&["check", "rules", path.to_str().unwrap()], tmp.path())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
    assert_eq!(
        uids.len(),
        3,
        "agent, gateway and sidecar dashboards: {uids:?}"
    );
}

/// `values` (a chart's CI file) with every monitoring object turned on.
fn with_monitoring(dir: &Path, chart: &str, ci: &str) -> std::path::PathBuf {
    let base = std::fs::read_to_string(root().join("deploy/helm").join(chart).join("ci").join(ci))
        .unwrap();
    let mut values: Value = serde_norway::from_str(&base).unwrap();
    values["monitoring"] = json!({
        "podMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}},
        "dashboards": {"enabled": true, "namespace": "grafana", "annotations": {"grafana_folder": "spinlink"}},
    });
    let path = dir.join(format!("{chart}-monitoring.yaml"));
    std::fs::write(&path, serde_norway::to_string(&values).unwrap()).unwrap();
    path
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// Whether `selector.matchLabels` selects a pod with `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let want = selector["matchLabels"].as_object().unwrap();
    !want.is_empty() && want.iter().all(|(k, v)| labels[k] == *v)
}

/// The PodMonitor endpoint scrapes a named port the container declares,
/// and that port is the one `listen` (the component's config) binds.
fn check_scrape(monitor: &Value, container: &Value, listen: &str) {
    let endpoints = monitor["spec"]["podMetricsEndpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1, "{monitor}");
    let ep = &endpoints[0];
    assert_eq!(ep["path"], "/metrics");
    let port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == ep["port"])
        .unwrap_or_else(|| panic!("no port {} in {container}", ep["port"]));
    let bound: u16 = listen.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(port["containerPort"], bound, "{container}");
}

/// The rendered dashboards ConfigMap carries `chart`'s files as they are,
/// labelled for Grafana's sidecar.
fn check_dashboards(objects: &[Value], chart: &str) {
    let maps: Vec<_> = of_kind(objects, "ConfigMap")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"].is_string())
        .collect();
    assert_eq!(maps.len(), 1, "{chart}: one dashboards ConfigMap");
    let map = maps[0];
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(map["metadata"]["namespace"], "grafana");
    assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "spinlink");
    let data = map["data"].as_object().unwrap();
    let files = dashboard_files(chart);
    assert_eq!(data.len(), files.len(), "{chart}: {:?}", data.keys());
    for f in files {
        let key = f.file_name().unwrap().to_str().unwrap();
        let rendered: Value = serde_json::from_str(data[key].as_str().unwrap()).unwrap();
        let file: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        assert_eq!(rendered, file, "{chart}: {key} differs from its file");
    }
}

/// The rendered PrometheusRule is the rules file promtool tested.
fn check_rule(objects: &[Value], chart: &str) {
    let rules = of_kind(objects, "PrometheusRule");
    assert_eq!(rules.len(), 1, "{chart}");
    let rule = rules[0];
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let file: Value =
        serde_norway::from_str(&std::fs::read_to_string(rules_file(chart)).unwrap()).unwrap();
    assert_eq!(
        rule["spec"], file,
        "{chart}: the PrometheusRule is not files/rules.yaml"
    );
    let _: monitoring::operator::PrometheusRule = serde_json::from_value(rule.clone())
        .unwrap_or_else(|e| panic!("{chart}: PrometheusRule schema: {e}"));
}

#[test]
fn the_spinnaker_chart_renders_monitors_rules_and_dashboards_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let ci = root().join("deploy/helm/spinlink/ci/default.yaml");
    let plain = render("spinlink", &[&ci], "rel", "spin");
    for kind in ["PodMonitor", "PrometheusRule"] {
        assert!(
            of_kind(&plain, kind).is_empty(),
            "{kind} rendered by default"
        );
    }
    let text = serde_json::to_string(&plain).unwrap();
    assert!(!text.contains("grafana_dashboard") && !text.contains("spinlink-metrics"));

    let values = with_monitoring(tmp.path(), "spinlink", "default.yaml");
    let objects = render("spinlink", &[&values], "rel", "spin");
    check_rule(&objects, "spinlink");
    check_dashboards(&objects, "spinlink");
    let monitors = of_kind(&objects, "PodMonitor");
    assert_eq!(monitors.len(), 2, "gateway and sidecar");
    for m in &monitors {
        assert_eq!(m["metadata"]["labels"]["release"], "kube-prometheus-stack");
        let _: monitoring::operator::PodMonitor = serde_json::from_value((*m).clone())
            .unwrap_or_else(|e| panic!("PodMonitor schema: {e}"));
    }
    let data = chart::data(&objects);

    // The gateway's: its pods, their admin port, the one its config binds.
    let gateway = chart::find(&objects, "Deployment", "rel-spinlink-gateway");
    let monitor = chart::find(&objects, "PodMonitor", "rel-spinlink-gateway");
    assert!(selects(
        &monitor["spec"]["selector"],
        &gateway["spec"]["template"]["metadata"]["labels"]
    ));
    let config: Value = serde_norway::from_str(
        data.values()
            .find_map(|d| d.get("gateway.yaml"))
            .expect("the gateway config"),
    )
    .unwrap();
    let container = &gateway["spec"]["template"]["spec"]["containers"][0];
    check_scrape(
        monitor,
        container,
        config["admin"]["listen"].as_str().unwrap(),
    );

    // The sidecar's: the Clouddriver pods the patch puts it into, its
    // metrics port, the one its config binds, open in its NetworkPolicy.
    let patch: Value =
        serde_norway::from_str(&data["rel-spinlink-clouddriver-patch"]["patch.yaml"]).unwrap();
    let template = &patch["spec"]["template"];
    let mut pod_labels = json!({"app": "spin", "cluster": "spin-clouddriver"});
    for (k, v) in template["metadata"]["labels"].as_object().unwrap() {
        pod_labels[k] = v.clone();
    }
    let monitor = chart::find(&objects, "PodMonitor", "rel-spinlink-sidecar");
    assert!(
        selects(&monitor["spec"]["selector"], &pod_labels),
        "{monitor}"
    );
    assert!(
        !selects(
            &monitor["spec"]["selector"],
            &json!({"app": "spin", "cluster": "spin-clouddriver"})
        ),
        "selects Clouddriver pods without a sidecar"
    );
    let sidecar = template["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "spinlink-sidecar")
        .unwrap();
    let config: Value = serde_norway::from_str(
        data.values()
            .find_map(|d| d.get("sidecar.yaml"))
            .expect("the sidecar config"),
    )
    .unwrap();
    let listen = config["metrics"]["listen"]
        .as_str()
        .expect("metrics.listen");
    check_scrape(monitor, sidecar, listen);
    let policy = chart::find(&objects, "NetworkPolicy", "rel-spinlink-sidecar");
    let port: u16 = listen.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        policy["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .any(|rule| rule["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["port"] == port)),
        "the sidecar NetworkPolicy does not admit the metrics port: {policy}"
    );
}

#[test]
fn the_agent_chart_renders_its_monitor_rules_and_dashboard_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let ci = root().join("deploy/helm/spinlink-agent/ci/agent-deploy-ha.yaml");
    let plain = render("spinlink-agent", &[&ci], "rel", "spinlink");
    assert!(
        of_kind(&plain, "PodMonitor").is_empty() && of_kind(&plain, "PrometheusRule").is_empty()
    );
    assert!(
        !serde_json::to_string(&plain)
            .unwrap()
            .contains("grafana_dashboard")
    );

    let values = with_monitoring(tmp.path(), "spinlink-agent", "agent-deploy-ha.yaml");
    let objects = render("spinlink-agent", &[&values], "rel", "spinlink");
    check_rule(&objects, "spinlink-agent");
    check_dashboards(&objects, "spinlink-agent");
    let monitors = of_kind(&objects, "PodMonitor");
    assert_eq!(monitors.len(), 1);
    let monitor = monitors[0];
    let _: monitoring::operator::PodMonitor = serde_json::from_value(monitor.clone())
        .unwrap_or_else(|e| panic!("PodMonitor schema: {e}"));
    let deployment = of_kind(&objects, "Deployment")[0];
    assert!(selects(
        &monitor["spec"]["selector"],
        &deployment["spec"]["template"]["metadata"]["labels"]
    ));
    let config: Value = serde_norway::from_str(
        chart::data(&objects)
            .values()
            .find_map(|d| d.get("agent.yaml"))
            .expect("the agent config"),
    )
    .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    check_scrape(
        monitor,
        container,
        config["admin"]["listen"].as_str().unwrap(),
    );

    // Without the admin port there is nothing to scrape: said, not rendered.
    let mut v: Value = serde_norway::from_str(&std::fs::read_to_string(&values).unwrap()).unwrap();
    v["admin"] = json!({"enabled": false});
    let no_admin = tmp.path().join("no-admin.yaml");
    std::fs::write(&no_admin, serde_norway::to_string(&v).unwrap()).unwrap();
    let dir = root().join("deploy/helm/spinlink-agent");
    let e = chart::helm(&[
        "template",
        dir.to_str().unwrap(),
        "-f",
        no_admin.to_str().unwrap(),
        "--name",
        "rel",
        "--namespace",
        "spinlink",
    ])
    .unwrap_err();
    assert!(e.contains("needs admin.enabled"), "{e}");
}
