//! Reads the cache answers are authorized as the account's identity, and
//! reads outside the namespaces it caches are answered as the API server
//! answers them. The oracle is what a real kube-apiserver 1.36 answered
//! ServiceAccount `fx-a/narrow` (a Role allowing get and list of configmaps
//! in `fx-a`): `kube-sim/fixtures/errors/403-*.json`.

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::chain::{AccountSpec, Chain};
use support::{Kubectl, http, wait_for};

/// The RBAC and objects the fixtures were recorded with.
const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: fx-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: fx-b}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: fx-a}
data: {color: blue, size: large}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: fx-b}
data: {color: red}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: narrow, namespace: fx-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmap-reader, namespace: fx-a}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: narrow-configmap-reader, namespace: fx-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-reader}
subjects:
- {kind: ServiceAccount, name: narrow, namespace: fx-a}
"#;

fn fixture(name: &str) -> Value {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kube-sim/fixtures/errors")
        .join(name);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn names(k: &Kubectl, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = k.ok(args).lines().map(str::to_owned).collect();
    v.sort();
    v
}

/// The facade's cache-served answers to `account`, from its metrics.
fn served_from_cache(chain: &Chain, account: &str) -> u64 {
    let (_, text) = http(chain.facade, "GET", "/metrics", &[]);
    text.lines()
        .filter(|l| l.starts_with("spinlink_sidecar_facade_requests_total{"))
        .filter(|l| l.contains(&format!("account=\"{account}\"")) && l.contains("source=\"cache\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The recorded cluster in kube-sim, and the chain in front of it serving
/// it as `account` (with the agent's `yaml` for it); returns kube-sim, kubectl
/// straight to it, the chain and kubectl through it, once the cache holds
/// fx-a's config map.
fn start(dir: &Path, account: &str, yaml: &str) -> (support::Proc, Kubectl, Chain, Kubectl) {
    let (sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    direct.ok_with_input(&["apply", "-f", "-"], Some(CLUSTER));
    let chain = Chain::start(
        dir,
        &sim_kubeconfig,
        &[AccountSpec {
            name: account,
            yaml,
        }],
    );
    let via = chain.kubectl(account);
    wait_for("fx-a's config map in the cache", || {
        let out = via.run_with_input(&["get", "cm", "settings", "-n", "fx-a"], None);
        out.status.success().then_some(())
    });
    (sim, direct, chain, via)
}

#[test]
fn cached_reads_are_authorized_as_the_impersonated_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let (_sim, direct, chain, narrow) = start(
        tmp.path(),
        "narrow",
        "impersonate:\n  serviceAccount: fx-a/narrow",
    );

    // What the identity may read is read, from the cache.
    let before = served_from_cache(&chain, "narrow");
    assert_eq!(
        names(&narrow, &["get", "cm", "-n", "fx-a", "-o", "name"]),
        names(&direct, &["get", "cm", "-n", "fx-a", "-o", "name"]),
    );
    assert!(
        served_from_cache(&chain, "narrow") > before,
        "an allowed read is answered from the cache"
    );

    // What it may not read is refused exactly as the API server refuses it,
    // though the cache (filled with the agent's rights) holds all of it.
    let cases = [
        (
            "/api/v1/namespaces/fx-b/configmaps/settings",
            "403-get.json",
        ),
        (
            "/api/v1/namespaces/fx-b/configmaps",
            "403-list-namespaced.json",
        ),
        ("/api/v1/configmaps", "403-list-all-namespaces.json"),
        (
            "/api/v1/namespaces/fx-b/configmaps?watch=true",
            "403-watch.json",
        ),
        ("/api/v1/namespaces", "403-list-cluster-scoped.json"),
    ];
    for (path, file) in cases {
        let (status, body) = chain.get("narrow", path);
        assert_eq!(status, 403, "{path}: {body}");
        let got: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(got, fixture(file), "{path}");
    }
    // Kinds its role never names: deployments, events, Secret metadata.
    for what in ["deployments", "events", "secrets"] {
        let out = narrow.run_with_input(&["get", what, "-n", "demo"], None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "User \"system:serviceaccount:fx-a:narrow\" cannot list resource \"{what}\""
            )),
            "{what}: {stderr}"
        );
    }

    // A role granted later takes effect at once: a refused read goes to
    // the API server, whatever the kept refusal.
    direct.ok(&[
        "create",
        "rolebinding",
        "narrow-view-b",
        "-n",
        "fx-b",
        "--role=configmap-reader-b",
        "--serviceaccount=fx-a:narrow",
    ]);
    direct.ok(&[
        "create",
        "role",
        "configmap-reader-b",
        "-n",
        "fx-b",
        "--verb=list",
        "--resource=configmaps",
    ]);
    wait_for("the new role to take effect", || {
        let (status, _) = chain.get("narrow", "/api/v1/namespaces/fx-b/configmaps");
        (status == 200).then_some(())
    });
}

#[test]
fn reads_outside_the_cached_namespaces_are_answered_as_the_api_server_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let (_sim, direct, _chain, scoped) = start(tmp.path(), "scoped", "namespaces: [fx-a]");
    for args in [
        &["get", "cm", "-n", "fx-b", "-o", "name"][..],
        &["get", "cm", "settings", "-n", "fx-b", "-o", "name"],
        &["get", "cm", "-A", "-o", "name"],
        &["get", "ns", "-o", "name"],
        &["get", "cm", "-n", "fx-a", "-o", "name"],
    ] {
        assert_eq!(names(&scoped, args), names(&direct, args), "{args:?}");
    }
    let json = |k: &Kubectl| -> Value {
        serde_json::from_str(&k.ok(&["get", "cm", "settings", "-n", "fx-b", "-o", "json"])).unwrap()
    };
    assert_eq!(json(&scoped)["data"], json(&direct)["data"]);
}
