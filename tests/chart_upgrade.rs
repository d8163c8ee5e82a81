//! `helm upgrade` from the released charts (`deploy/helm/released/`) changes
//! no field Kubernetes refuses to change in place. Both versions are rendered
//! with each values file the released chart was tested with (a values file
//! that worked must still work), and every object the two share — same kind
//! and name — must keep its immutable fields: a workload's selector, a
//! StatefulSet's serviceName, volumeClaimTemplates and podManagementPolicy,
//! a Service's clusterIP, a Job's pod template, a PVC's spec. A change to
//! any of them fails `helm upgrade` in a real cluster (or, for a selector,
//! orphans the old pods).

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::chart::{render_path, root};

/// The released chart archives: (chart, archive).
const RELEASED: [(&str, &str); 2] = [
    ("spinlink", "spinlink-0.1.0.tgz"),
    ("spinlink-agent", "spinlink-agent-0.1.0.tgz"),
];

fn released(archive: &str) -> PathBuf {
    root().join("deploy/helm/released").join(archive)
}

/// The released chart's `ci/` values files, unpacked into `dir`.
fn released_values(archive: &str, chart: &str, dir: &Path) -> Vec<PathBuf> {
    let out = std::process::Command::new("tar")
        .args(["xzf", released(archive).to_str().unwrap(), "-C"])
        .arg(dir)
        .output()
        .expect("tar");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join(chart).join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{chart}: no ci values in the release");
    files
}

fn render(chart: &Path, values: &Path) -> Vec<Value> {
    render_path(chart, &[values], "spinlink", "spinlink")
}

/// The fields of `o` Kubernetes will not change in place, by kind.
fn immutable(o: &Value) -> Vec<(&'static str, Value)> {
    let spec = &o["spec"];
    let pick = |names: &[&'static str]| -> Vec<(&'static str, Value)> {
        names.iter().map(|n| (*n, spec[*n].clone())).collect()
    };
    match o["kind"].as_str().unwrap_or_default() {
        "Deployment" | "DaemonSet" | "ReplicaSet" => pick(&["selector"]),
        "StatefulSet" => pick(&[
            "selector",
            "serviceName",
            "volumeClaimTemplates",
            "podManagementPolicy",
        ]),
        "Service" => pick(&["clusterIP", "clusterIPs", "ipFamilies"]),
        "Job" => pick(&["selector", "template", "completions"]),
        "PersistentVolumeClaim" => pick(&["accessModes", "storageClassName", "volumeMode"]),
        _ => Vec::new(),
    }
}

fn key(o: &Value) -> (String, String) {
    (
        o["kind"].as_str().unwrap_or_default().to_owned(),
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// The immutable fields `old` and `new` disagree on.
fn changed(old: &[Value], new: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for o in old {
        let Some(n) = new.iter().find(|n| key(n) == key(o)) else {
            continue;
        };
        for ((field, was), (_, now)) in immutable(o).into_iter().zip(immutable(n)) {
            if was != now {
                out.push(format!("{:?}.spec.{field}: {was} -> {now}", key(o)));
            }
        }
    }
    out
}

#[test]
fn upgrading_from_the_released_charts_changes_no_immutable_field() {
    for (chart, archive) in RELEASED {
        let dir = tempfile::tempdir().unwrap();
        let mut compared = 0;
        for values in released_values(archive, chart, dir.path()) {
            let old = render(&released(archive), &values);
            let new = render(&root().join("deploy/helm").join(chart), &values);
            let changes = changed(&old, &new);
            assert!(
                changes.is_empty(),
                "{chart} with {}: {changes:#?}",
                values.display()
            );
            compared += old
                .iter()
                .filter(|o| !immutable(o).is_empty() && new.iter().any(|n| key(n) == key(o)))
                .count();
        }
        assert!(compared > 0, "{chart}: no workload or Service compared");
    }
}

#[test]
fn a_changed_selector_is_caught() {
    let (chart, archive) = RELEASED[0];
    let dir = tempfile::tempdir().unwrap();
    let values = released_values(archive, chart, dir.path()).remove(0);
    let old = render(&released(archive), &values);
    let mut new = old.clone();
    let workload = new
        .iter_mut()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    workload["spec"]["selector"]["matchLabels"]["extra"] = "label".into();
    let changes = changed(&old, &new);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(changes[0].contains("selector"), "{changes:?}");
}

#[test]
fn each_chart_says_what_an_upgrade_does() {
    for (chart, _) in RELEASED {
        let notes = std::fs::read_to_string(
            root()
                .join("deploy/helm")
                .join(chart)
                .join("templates/NOTES.txt"),
        )
        .unwrap();
        assert!(
            notes.contains("helm upgrade") && notes.contains("docs/upgrading.md"),
            "{chart}: NOTES.txt does not say what an upgrade does"
        );
    }
}
