//! Client-side `kubectl apply` of a Secret through spinlink, as Clouddriver
//! deploys Secrets: re-applying with a key fewer removes that key, as it
//! does against a real API server, while no Secret value ever leaves the
//! cluster. The oracle is what a real kube-apiserver 1.36 held after the
//! same two applies (`kube-sim/fixtures/apply/`, recorded with kubectl
//! 1.33).

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::Kubectl;

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kube-sim/fixtures/apply")
        .join(name)
}

fn fixture_text(name: &str) -> String {
    std::fs::read_to_string(fixture_path(name)).unwrap()
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&fixture_text(name)).unwrap()
}

/// Applies `manifest` (a fixture) with `k`; kubectl's stderr.
fn apply(k: &Kubectl, manifest: &str) -> String {
    let out = k.run_with_input(&["apply", "-f", "-"], Some(&fixture_text(manifest)));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kubectl apply {manifest}: {stderr}");
    stderr
}

fn get_json(k: &Kubectl, kind: &str) -> Value {
    serde_json::from_str(&k.ok(&["get", kind, "fx-applied", "-n", "fx-apply", "-o", "json"]))
        .unwrap()
}

#[test]
fn reapplying_a_secret_removes_a_key_as_the_api_server_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let state = dir.join("state");
    let _dev = support::dev(dir, &state, Some(&sim_kubeconfig));
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    let facade = Kubectl::new(dir, "facade", &state.join("kubeconfig"));
    direct.ok_with_input(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: fx-apply\n"),
    );

    for kind in ["secret", "configmap"] {
        // First {a, b}, then {a}: b must go.
        let first = apply(&facade, &format!("{kind}-ab.yaml"));
        support::wait_for("the first apply through the facade", || {
            let out = facade.run_with_input(&["get", kind, "fx-applied", "-n", "fx-apply"], None);
            out.status.success().then_some(())
        });
        let second = apply(&facade, &format!("{kind}-a.yaml"));
        for stderr in [first, second] {
            assert!(
                !stderr.contains("missing the kubectl.kubernetes.io/last-applied-configuration"),
                "{kind}: {stderr}"
            );
        }

        // The cluster holds what the real API server held after the same
        // applies: the same data and the same last-applied configuration.
        let want = fixture_json(&format!("{kind}.after.json"));
        let got = get_json(&direct, kind);
        assert_eq!(got["data"], want["data"], "{kind} in the cluster: {got:#}");
        assert_eq!(
            got["metadata"]["annotations"][LAST_APPLIED],
            want["metadata"]["annotations"][LAST_APPLIED],
            "{kind}"
        );
    }

    // Through the facade the Secret keeps its last-applied keys, never a
    // value.
    let secret = facade.ok(&[
        "get",
        "secret",
        "fx-applied",
        "-n",
        "fx-apply",
        "-o",
        "json",
    ]);
    assert!(
        !secret.contains("U0VOVElORUw"),
        "a Secret value left the cluster: {secret}"
    );
    let secret: Value = serde_json::from_str(&secret).unwrap();
    // The keys the real server held, each value a filler of the same decoded
    // length (what `kubectl describe secret` prints).
    let held = fixture_json("secret.after.json");
    let fillers: serde_json::Map<String, Value> = held["data"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let len = spinlink_agent::scrub::decoded_len(v.as_str().unwrap());
            (k.clone(), Value::from(spinlink_agent::scrub::filler(len)))
        })
        .collect();
    assert_eq!(secret["data"], Value::Object(fillers), "{secret:#}");
    let applied: Value = serde_json::from_str(
        secret["metadata"]["annotations"][LAST_APPLIED]
            .as_str()
            .expect("the last-applied configuration is kept"),
    )
    .unwrap();
    assert_eq!(
        applied["data"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["a"],
        "{applied:#}"
    );
}
