//! The install manifests under `deploy/`, checked as a cluster and the real
//! binary would check them.
//!
//! - Both Helm charts are rendered and linted (strictly) by Helm's own Go SDK
//!   through `deploy/tools/helm.py` (PyPI `helm-python-sdk`, works offline),
//!   with every values file under each chart's `ci/`.
//! - Every rendered object, and every Kustomize overlay rendered by
//!   `kubectl kustomize`, is deserialized into its `k8s-openapi` type (or the
//!   cert-manager types below) and serialized back: a field the schema does
//!   not know, or a value of the wrong type, shows up as a difference.
//! - The agent's RBAC grants exactly the verbs the agent uses ([`AGENT_VERBS`]).
//! - The agent configuration in the chart's ConfigMap is loaded by
//!   `spinlink agent --check-config`, the gateway's and the sidecar's by
//!   `spinlink gateway|sidecar --check-config`.
//! - The Dockerfile copies paths that exist and builds and runs `spinlink`.
//!
//! Each check has a test that feeds it something broken, so a check that
//! passes everything fails here. Start at [`render`] and [`check_schema`].

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::chart::{documents, helm, root};

// ---------------------------------------------------------------------------
// Rendering

/// The namespace charts are rendered into.
const NAMESPACE: &str = "spinlink-test";

fn chart_dir(chart: &str) -> PathBuf {
    root().join("deploy/helm").join(chart)
}

/// The values files under a chart's `ci/`, sorted; there must be some.
fn ci_values(chart: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir(chart).join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "{chart}/ci has {} values files",
        files.len()
    );
    files
}

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::from_str::<Option<Value>>(&text)
        .unwrap()
        .unwrap_or(Value::Null)
}

/// The objects `helm template` renders for `chart` with `values`.
fn render(chart: &str, values: &Path) -> Vec<Value> {
    let objects = support::chart::render_path(&chart_dir(chart), &[values], "rel", NAMESPACE);
    assert!(!objects.is_empty(), "{} rendered nothing", values.display());
    objects
}

/// The objects `kubectl kustomize DIR` renders.
fn kustomize(dir: &Path) -> Result<Vec<Value>, String> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|e| format!("running kubectl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(documents(&String::from_utf8(out.stdout).unwrap()))
}

fn kind(obj: &Value) -> &str {
    obj["kind"].as_str().unwrap_or("")
}

fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

fn find<'a>(objects: &'a [Value], k: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind(o) == k).collect()
}

fn one<'a>(objects: &'a [Value], k: &str, name_suffix: &str) -> &'a Value {
    let found: Vec<_> = find(objects, k)
        .into_iter()
        .filter(|o| name(o).ends_with(name_suffix))
        .collect();
    assert_eq!(found.len(), 1, "one {k} named *{name_suffix}");
    found[0]
}

// ---------------------------------------------------------------------------
// Schemas

/// Deserializes `obj` into `T` and serializes it back; every difference is a
/// field `T` does not have or a value it does not take.
fn roundtrip<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut diffs = Vec::new();
    diff("", obj, &back, &mut diffs);
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("; "))
    }
}

fn diff(path: &str, input: &Value, back: &Value, out: &mut Vec<String>) {
    match (input, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => diff(&format!("{path}.{k}"), v, w, out),
                    None if v.is_null() => out.push(format!("{path}.{k}: null")),
                    None => out.push(format!("{path}.{k}: unknown field")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), v, w, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} read as {b}")),
    }
}

/// The cert-manager `v1` resources the charts use, with the fields they use
/// (cert-manager's CRD schema for them); anything else is refused.
mod cert_manager {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde::{Deserialize, Serialize};

    /// `Certificate.cert-manager.io/v1`.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Certificate {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: CertificateSpec,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct CertificateSpec {
        pub secret_name: String,
        pub issuer_ref: IssuerRef,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub common_name: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub dns_names: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub uris: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub duration: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub renew_before: Option<String>,
        #[serde(rename = "isCA", skip_serializing_if = "Option::is_none")]
        pub is_ca: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub private_key: Option<PrivateKey>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub usages: Option<Vec<String>>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PrivateKey {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub algorithm: Option<Algorithm>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub size: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub rotation_policy: Option<RotationPolicy>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    pub enum Algorithm {
        #[serde(rename = "RSA")]
        Rsa,
        #[serde(rename = "ECDSA")]
        Ecdsa,
        Ed25519,
    }

    #[derive(Debug, Serialize, Deserialize)]
    pub enum RotationPolicy {
        Never,
        Always,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct IssuerRef {
        pub name: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub kind: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub group: Option<String>,
    }

    /// `Issuer.cert-manager.io/v1` (self-signed or CA).
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Issuer {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: IssuerSpec,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct IssuerSpec {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub self_signed: Option<SelfSigned>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub ca: Option<CaIssuer>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct SelfSigned {}

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct CaIssuer {
        pub secret_name: String,
    }

    /// Key usages cert-manager accepts.
    pub const USAGES: &[&str] = &[
        "signing",
        "digital signature",
        "content commitment",
        "key encipherment",
        "key agreement",
        "data encipherment",
        "cert sign",
        "crl sign",
        "encipher only",
        "decipher only",
        "any",
        "server auth",
        "client auth",
        "code signing",
        "email protection",
        "s/mime",
        "ipsec end system",
        "ipsec tunnel",
        "ipsec user",
        "timestamping",
        "ocsp signing",
        "microsoft sgc",
        "netscape sgc",
    ];
}

/// Checks one object against the schema of its `apiVersion` and `kind`.
fn check_schema(obj: &Value) -> Result<(), String> {
    use k8s_openapi::api::{apps, autoscaling, core, networking, policy, rbac};
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let k = kind(obj);
    let result = match (api_version, k) {
        ("v1", "ConfigMap") => roundtrip::<core::v1::ConfigMap>(obj),
        ("v1", "Secret") => {
            // The API server's base64 decoder skips line breaks, and
            // kustomize wraps long values.
            let mut obj = obj.clone();
            let data = obj.get_mut("data").and_then(Value::as_object_mut);
            for value in data.into_iter().flat_map(|d| d.values_mut()) {
                if let Some(s) = value.as_str() {
                    *value = json!(s.replace(['\n', '\r'], ""));
                }
            }
            roundtrip::<core::v1::Secret>(&obj)
        }
        ("v1", "Service") => roundtrip::<core::v1::Service>(obj),
        ("v1", "ServiceAccount") => roundtrip::<core::v1::ServiceAccount>(obj),
        ("v1", "Namespace") => roundtrip::<core::v1::Namespace>(obj),
        ("apps/v1", "Deployment") => roundtrip::<apps::v1::Deployment>(obj),
        ("networking.k8s.io/v1", "NetworkPolicy") => {
            roundtrip::<networking::v1::NetworkPolicy>(obj)
        }
        ("policy/v1", "PodDisruptionBudget") => roundtrip::<policy::v1::PodDisruptionBudget>(obj),
        ("autoscaling/v2", "HorizontalPodAutoscaler") => {
            roundtrip::<autoscaling::v2::HorizontalPodAutoscaler>(obj)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => roundtrip::<rbac::v1::ClusterRole>(obj),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            roundtrip::<rbac::v1::ClusterRoleBinding>(obj)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => roundtrip::<rbac::v1::Role>(obj),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => roundtrip::<rbac::v1::RoleBinding>(obj),
        ("cert-manager.io/v1", "Certificate") => roundtrip::<cert_manager::Certificate>(obj)
            .and_then(|()| {
                let usages = obj["spec"]["usages"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                match usages
                    .iter()
                    .find(|u| !cert_manager::USAGES.contains(&u.as_str().unwrap_or("")))
                {
                    Some(u) => Err(format!("spec.usages: {u} is not a key usage")),
                    None => Ok(()),
                }
            }),
        ("cert-manager.io/v1", "Issuer") => roundtrip::<cert_manager::Issuer>(obj),
        ("monitoring.coreos.com/v1", "PodMonitor") => {
            roundtrip::<support::monitoring::operator::PodMonitor>(obj)
        }
        ("monitoring.coreos.com/v1", "PrometheusRule") => {
            roundtrip::<support::monitoring::operator::PrometheusRule>(obj)
        }
        _ => Err("no schema known for this apiVersion and kind".to_owned()),
    };
    let result = result.and_then(|()| check_names(obj));
    result.map_err(|e| format!("{api_version} {k} {}: {e}", name(obj)))
}

/// What the API server checks beyond the schema and would refuse at apply
/// time: DNS-1123 names, and within pods, mounts of volumes that exist.
fn check_names(obj: &Value) -> Result<(), String> {
    let dns1123 = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    };
    let n = name(obj);
    if !dns1123(n) {
        return Err(format!("metadata.name {n:?} is not a DNS-1123 subdomain"));
    }
    if kind(obj) == "Deployment" {
        let pod = &obj["spec"]["template"]["spec"];
        let volumes: BTreeSet<&str> = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for c in pod["containers"].as_array().into_iter().flatten() {
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let v = m["name"].as_str().unwrap_or("");
                if !volumes.contains(v) {
                    return Err(format!("container {} mounts missing volume {v}", c["name"]));
                }
            }
        }
        // Containers of one pod share its network: no port twice.
        let mut ports = BTreeSet::new();
        for c in pod["containers"].as_array().into_iter().flatten() {
            for p in c["ports"].as_array().into_iter().flatten() {
                if !ports.insert(p["containerPort"].to_string()) {
                    return Err(format!(
                        "port {} is used twice in the pod",
                        p["containerPort"]
                    ));
                }
            }
        }
        let selector = &obj["spec"]["selector"]["matchLabels"];
        let labels = &obj["spec"]["template"]["metadata"]["labels"];
        for (k, v) in selector.as_object().into_iter().flatten() {
            if &labels[k] != v {
                return Err(format!("selector {k}={v} does not match the pod labels"));
            }
        }
    }
    Ok(())
}

fn check_all(objects: &[Value], what: &str) {
    let errors: Vec<String> = objects
        .iter()
        .filter_map(|o| check_schema(o).err())
        .collect();
    assert!(errors.is_empty(), "{what}:\n{}", errors.join("\n"));
}

// ---------------------------------------------------------------------------
// Goal 1 and 2: the charts lint, render and match the schemas

#[test]
fn charts_lint_strictly_with_every_ci_values_file() {
    for chart in ["spinlink-agent", "spinlink"] {
        let dir = chart_dir(chart);
        for values in ci_values(chart) {
            let report = helm(&[
                "lint",
                dir.to_str().unwrap(),
                "--strict",
                "--namespace",
                NAMESPACE,
                "-f",
                values.to_str().unwrap(),
            ])
            .unwrap_or_else(|e| panic!("{e}"));
            assert!(report.contains("1 chart(s) linted, ok"), "{report}");
        }
    }
}

#[test]
fn lint_and_render_refuse_a_broken_chart() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("spinlink-agent");
    copy_dir(&chart_dir("spinlink-agent"), &copy);
    std::fs::write(
        copy.join("templates/broken.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Values.nope.deeper }}\n",
    )
    .unwrap();
    let values = chart_dir("spinlink-agent").join("ci/agent-watch-only.yaml");
    let lint = helm(&[
        "lint",
        copy.to_str().unwrap(),
        "--strict",
        "-f",
        values.to_str().unwrap(),
    ]);
    assert!(lint.is_err(), "lint passed a broken template: {lint:?}");
    let template = helm(&[
        "template",
        copy.to_str().unwrap(),
        "-f",
        values.to_str().unwrap(),
    ]);
    assert!(template.is_err(), "template rendered a broken template");
    // Missing required values fail the render with the chart's message.
    let empty = tmp.path().join("empty.yaml");
    std::fs::write(&empty, "{}\n").unwrap();
    let err = helm(&[
        "template",
        chart_dir("spinlink-agent").to_str().unwrap(),
        "-f",
        empty.to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(err.contains("is required"), "{err}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn rendered_charts_match_the_kubernetes_schemas() {
    for chart in ["spinlink-agent", "spinlink"] {
        for values in ci_values(chart) {
            let objects = render(chart, &values);
            check_all(&objects, &values.display().to_string());
            // The Clouddriver patch is a partial Deployment: apply it to a
            // stand-in Clouddriver and check the result.
            for cm in find(&objects, "ConfigMap") {
                if let Some(patch) = cm["data"]["patch.yaml"].as_str() {
                    let patched = apply_clouddriver_patch(patch);
                    check_all(
                        &patched,
                        &format!("{}: patched Clouddriver", values.display()),
                    );
                    assert_sidecar_added(&patched);
                }
            }
        }
    }
}

#[test]
fn schema_check_refuses_unknown_fields_and_wrong_types() {
    let values = chart_dir("spinlink-agent").join("ci/agent-watch-only.yaml");
    let objects = render("spinlink-agent", &values);
    let deployment = one(&objects, "Deployment", "agent").clone();
    check_schema(&deployment).unwrap();

    let mut typo = deployment.clone();
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = json!("Always");
    let err = check_schema(&typo).unwrap_err();
    assert!(err.contains("imagePullPolicyy: unknown field"), "{err}");

    let mut wrong_type = deployment.clone();
    wrong_type["spec"]["replicas"] = json!("two");
    assert!(check_schema(&wrong_type).is_err());

    let mut misplaced = deployment.clone();
    misplaced["spec"]["template"]["spec"]["readOnlyRootFilesystem"] = json!(true);
    assert!(check_schema(&misplaced).is_err());

    let mut bad_mount = deployment;
    bad_mount["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["name"] =
        json!("gone");
    assert!(
        check_schema(&bad_mount)
            .unwrap_err()
            .contains("missing volume")
    );

    let cert = json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": "x"},
        "spec": {"secretName": "x", "issuerRef": {"name": "ca"}, "usages": ["client auth"]}});
    check_schema(&cert).unwrap();
    let mut cert_typo = cert.clone();
    cert_typo["spec"]["dnsName"] = json!(["a"]);
    assert!(check_schema(&cert_typo).is_err());
    let mut cert_usage = cert;
    cert_usage["spec"]["usages"] = json!(["client-auth"]);
    assert!(check_schema(&cert_usage).is_err());

    let unknown_kind = json!({"apiVersion": "v1", "kind": "Pods", "metadata": {"name": "x"}});
    assert!(check_schema(&unknown_kind).is_err());
    let bad_name =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name"}});
    assert!(check_schema(&bad_name).is_err());
}

// ---------------------------------------------------------------------------
// Goal 2: RBAC grants exactly what the agent does

/// Every verb the agent uses on the API server, and where it comes from.
/// - `list`, `watch`: the cache side lists and watches every kind discovery
///   advertises with both verbs (agent/src/kinds.rs `from_discovery`,
///   agent/src/cache/watch.rs); kinds it may not list are skipped on 403.
/// - `get`: relayed reads of one object (kubectl get NAME, Clouddriver's
///   reads before a deploy), agent/src/relay/execute.rs.
/// - `create`, `update`, `patch`, `delete`: relayed writes of a deploy-capable
///   agent (Clouddriver's apply, scale, rollout, delete, and pods/exec,
///   which is `create` on a subresource). Never `deletecollection`: neither
///   kubectl nor Clouddriver sends it, and the chart does not grant it.
const AGENT_VERBS: &[&str] = &["get", "list", "watch"];
const AGENT_DEPLOY_VERBS: &[&str] = &["create", "update", "patch", "delete"];
/// What leader election does with its Leases (agent/src/leader.rs: `get_opt`,
/// `create`, `replace`).
const AGENT_LEASE_VERBS: &[&str] = &["get", "create", "update"];

/// The leader-election Role: present exactly when leader election is on, in
/// the release namespace, on Leases only, bound to the agent alone.
fn check_lease_rbac(objects: &[Value], values: &Value, sa: &str) -> Result<(), String> {
    let enabled = values["leaderElection"]["enabled"]
        .as_bool()
        .unwrap_or(false)
        && values["mode"] != "infrastructure";
    let leader: Vec<&Value> = objects
        .iter()
        .filter(|o| kind(o) == "Role" && name(o).ends_with("-leader"))
        .collect();
    match (enabled, leader.as_slice()) {
        (false, []) => Ok(()),
        (false, _) => Err("a Lease Role without leader election".into()),
        (true, [role]) => {
            let rules = role["rules"].as_array().cloned().unwrap_or_default();
            let ok = rules.len() == 1
                && strings(&rules[0]["apiGroups"]) == set(&["coordination.k8s.io"])
                && strings(&rules[0]["resources"]) == set(&["leases"])
                && strings(&rules[0]["verbs"]) == set(AGENT_LEASE_VERBS);
            if !ok {
                return Err(format!("the Lease Role grants {rules:?}"));
            }
            let bound = objects.iter().any(|b| {
                kind(b) == "RoleBinding"
                    && b["roleRef"]["name"] == role["metadata"]["name"]
                    && b["subjects"]
                        .as_array()
                        .is_some_and(|s| s.len() == 1 && s[0]["name"] == sa)
            });
            if !bound {
                return Err("the Lease Role is not bound to the agent".into());
            }
            let config: Value = serde_norway::from_str(
                one(objects, "ConfigMap", "-config")["data"]["agent.yaml"]
                    .as_str()
                    .unwrap_or(""),
            )
            .unwrap_or(Value::Null);
            if config["leaderElection"]["enabled"] != true
                || config["leaderElection"]["namespace"] != role["metadata"]["namespace"]
            {
                return Err("the agent config does not elect in the Role's namespace".into());
            }
            Ok(())
        }
        (true, _) => Err(format!("want one Lease Role, got {}", leader.len())),
    }
}
/// The discovery documents the agent reads and relays (agent/src/cluster.rs).
const AGENT_NON_RESOURCE_URLS: &[&str] = &[
    "/version",
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi",
    "/openapi/*",
];

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Checks the agent RBAC in `objects` against what values file `values` asks
/// for; returns what is wrong.
fn check_agent_rbac(objects: &[Value], values: &Value) -> Result<(), String> {
    let infrastructure = values["mode"] == "infrastructure";
    let deploy = values["rbac"]["deploy"].as_bool().unwrap_or(false);
    let namespaces = strings(&values["rbac"]["namespaces"]);
    let mut expected = set(AGENT_VERBS);
    if deploy {
        expected.extend(set(AGENT_DEPLOY_VERBS));
    }
    let roles: Vec<&Value> = objects
        .iter()
        .filter(|o| matches!(kind(o), "ClusterRole" | "Role") && !name(o).ends_with("-leader"))
        .collect();
    if infrastructure {
        return match roles.is_empty() {
            true => Ok(()),
            false => Err("infrastructure mode needs no RBAC in the agent's cluster".into()),
        };
    }
    let want_kind = if namespaces.is_empty() {
        "ClusterRole"
    } else {
        "Role"
    };
    let scopes: BTreeSet<String> = roles
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap_or("").to_owned())
        .collect();
    if namespaces.is_empty() {
        if roles.len() != 1 || kind(roles[0]) != "ClusterRole" {
            return Err(format!("want one ClusterRole, got {}", roles.len()));
        }
    } else if scopes != namespaces || roles.iter().any(|r| kind(r) != "Role") {
        return Err(format!(
            "want a Role in each of {namespaces:?}, got {scopes:?}"
        ));
    }
    let sa = name(one(objects, "ServiceAccount", ""));
    check_lease_rbac(objects, values, sa)?;
    for role in &roles {
        for rule in role["rules"].as_array().into_iter().flatten() {
            let verbs = strings(&rule["verbs"]);
            if rule.get("nonResourceURLs").is_some() {
                if want_kind == "Role" {
                    return Err("nonResourceURLs in a Role".into());
                }
                if strings(&rule["nonResourceURLs"]) != set(AGENT_NON_RESOURCE_URLS)
                    || verbs != set(&["get"])
                {
                    return Err(format!("discovery rule grants {rule}"));
                }
                continue;
            }
            if strings(&rule["apiGroups"]) != set(&["*"])
                || strings(&rule["resources"]) != set(&["*"])
            {
                return Err(format!("rule is not on every resource: {rule}"));
            }
            if verbs != expected {
                return Err(format!(
                    "{} {} grants {verbs:?}, the agent uses {expected:?}",
                    kind(role),
                    name(role)
                ));
            }
        }
        // Each role is bound to the agent's ServiceAccount, and only to it.
        let bindings: Vec<&Value> = objects
            .iter()
            .filter(|b| {
                b["roleRef"]["name"] == role["metadata"]["name"]
                    && b["roleRef"]["kind"] == role["kind"]
                    && b["metadata"]["namespace"] == role["metadata"]["namespace"]
            })
            .collect();
        let subjects: Vec<&Value> = bindings
            .iter()
            .flat_map(|b| b["subjects"].as_array().into_iter().flatten())
            .collect();
        if bindings.len() != 1 || subjects.len() != 1 || subjects[0]["name"] != sa {
            return Err(format!(
                "{} {} is not bound to exactly {sa}",
                kind(role),
                name(role)
            ));
        }
    }
    // The pod runs as that ServiceAccount.
    let deployment = one(objects, "Deployment", "agent");
    if deployment["spec"]["template"]["spec"]["serviceAccountName"] != sa {
        return Err("the Deployment does not use the agent's ServiceAccount".into());
    }
    Ok(())
}

#[test]
fn agent_rbac_grants_exactly_the_verbs_the_agent_uses() {
    let mut seen = BTreeSet::new();
    for values in ci_values("spinlink-agent") {
        let v = yaml_file(&values);
        let objects = render("spinlink-agent", &values);
        check_agent_rbac(&objects, &v).unwrap_or_else(|e| panic!("{}: {e}", values.display()));
        seen.insert((
            v["mode"].as_str().unwrap_or("agent").to_owned(),
            v["rbac"]["deploy"].as_bool().unwrap_or(false),
            !strings(&v["rbac"]["namespaces"]).is_empty(),
        ));
        // A watch-only agent refuses relayed writes itself too.
        if v["mode"] != "infrastructure" && !v["rbac"]["deploy"].as_bool().unwrap_or(false) {
            let config = agent_config(&objects);
            let relay = &config["kubernetes"]["accounts"][0]["relay"]["verbs"];
            assert_eq!(strings(relay), set(AGENT_VERBS), "{}", values.display());
        }
    }
    // The ci/ files cover watch-only, deploy-capable, namespaced and
    // infrastructure mode.
    for case in [
        ("agent".to_owned(), false, false),
        ("agent".to_owned(), true, false),
        ("agent".to_owned(), true, true),
        ("infrastructure".to_owned(), false, false),
    ] {
        assert!(seen.contains(&case), "no ci values file for {case:?}");
    }
}

#[test]
fn rbac_check_refuses_more_or_fewer_verbs() {
    let values = chart_dir("spinlink-agent").join("ci/agent-watch-only.yaml");
    let v = yaml_file(&values);
    let objects = render("spinlink-agent", &values);
    check_agent_rbac(&objects, &v).unwrap();
    let role_at = objects
        .iter()
        .position(|o| kind(o) == "ClusterRole")
        .unwrap();

    let mut more = objects.clone();
    more[role_at]["rules"][0]["verbs"]
        .as_array_mut()
        .unwrap()
        .push(json!("delete"));
    assert!(check_agent_rbac(&more, &v).unwrap_err().contains("grants"));

    let mut fewer = objects.clone();
    fewer[role_at]["rules"][0]["verbs"] = json!(["list", "watch"]);
    assert!(check_agent_rbac(&fewer, &v).is_err());

    let mut secrets_only = objects.clone();
    secrets_only[role_at]["rules"][0]["resources"] = json!(["secrets"]);
    assert!(check_agent_rbac(&secrets_only, &v).is_err());

    let mut wide_discovery = objects;
    wide_discovery[role_at]["rules"][1]["nonResourceURLs"] = json!(["*"]);
    assert!(check_agent_rbac(&wide_discovery, &v).is_err());

    // Leader election: the Lease Role is required with it and exact.
    let values = chart_dir("spinlink-agent").join("ci/agent-deploy-ha.yaml");
    let v = yaml_file(&values);
    let objects = render("spinlink-agent", &values);
    check_agent_rbac(&objects, &v).unwrap();
    let lease_at = objects
        .iter()
        .position(|o| kind(o) == "Role" && name(o).ends_with("-leader"))
        .expect("a Lease Role with leader election");
    let mut wider = objects.clone();
    wider[lease_at]["rules"][0]["verbs"] = json!(["get", "create", "update", "delete"]);
    assert!(check_agent_rbac(&wider, &v).is_err());
    let mut missing = objects.clone();
    missing.remove(lease_at);
    assert!(check_agent_rbac(&missing, &v).is_err());
    let mut off = v.clone();
    off["leaderElection"]["enabled"] = json!(false);
    assert!(check_agent_rbac(&objects, &off).is_err());
}

// ---------------------------------------------------------------------------
// Goal 3: the configurations the charts render load in the binary

/// The parsed `agent.yaml` of the chart's ConfigMap.
fn agent_config(objects: &[Value]) -> Value {
    let text = one(objects, "ConfigMap", "-config")["data"]["agent.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    serde_norway::from_str(&text).unwrap()
}

/// Every string in `v` that is a path under `/etc/spinlink/`.
fn mounted_paths(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.starts_with("/etc/spinlink/") => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| mounted_paths(x, out)),
        Value::Object(o) => o.values().for_each(|x| mounted_paths(x, out)),
        _ => {}
    }
}

/// Asserts every file the configuration names lies under a mount of
/// `container`, then rewrites `/etc/spinlink/` to `dir` and creates the files
/// there, so the configuration can be loaded outside the pod.
fn relocate(config_text: &str, container: &Value, dir: &Path) -> String {
    let config: Value = serde_norway::from_str(config_text).unwrap();
    let mut paths = Vec::new();
    mounted_paths(&config, &mut paths);
    let mounts: Vec<String> = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            m["mountPath"]
                .as_str()
                .map(|p| format!("{}/", p.trim_end_matches('/')))
        })
        .collect();
    for path in &paths {
        assert!(
            mounts.iter().any(|m| path.starts_with(m.as_str())),
            "{path} is not under any of the container's mounts {mounts:?}"
        );
        let local = dir.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(local.parent().unwrap()).unwrap();
        std::fs::write(&local, stand_in(path)).unwrap();
    }
    config_text.replace(
        "/etc/spinlink/",
        &format!("{}/etc/spinlink/", dir.display()),
    )
}

/// Real PEM for certificate, key and CA paths (cert-manager's file names),
/// so a check that parses them passes; empty for anything else.
fn stand_in(path: &str) -> String {
    use spinlink_tls::dev::{DevCa, Leaf};
    static PKI: std::sync::OnceLock<(String, String, String)> = std::sync::OnceLock::new();
    let (ca, cert, key) = PKI.get_or_init(|| {
        let ca = DevCa::generate("deploy-test-ca").unwrap();
        let leaf = ca
            .issue(
                &Leaf::server("deploy-test")
                    .also_client()
                    .with_dns("deploy-test"),
            )
            .unwrap();
        (ca.cert_pem().to_owned(), leaf.cert_pem, leaf.key_pem)
    });
    if path.ends_with("tls.key") {
        key.clone()
    } else if path.ends_with("tls.crt") {
        cert.clone()
    } else if path.ends_with(".crt") || path.ends_with(".pem") {
        ca.clone()
    } else {
        String::new()
    }
}

fn container<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// Runs `spinlink agent --check-config --config FILE`.
fn agent_check_config(text: &str, dir: &Path) -> Result<String, String> {
    let file = dir.join("agent.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spinlink"))
        .args(["agent", "--check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{stderr}"))
    }
}

#[test]
fn agent_config_from_the_chart_loads_in_the_binary() {
    for values in ci_values("spinlink-agent") {
        let objects = render("spinlink-agent", &values);
        let text = one(&objects, "ConfigMap", "-config")["data"]["agent.yaml"]
            .as_str()
            .unwrap();
        let deployment = one(&objects, "Deployment", "agent");
        let args = strings(&container(deployment, "agent")["args"]);
        assert!(args.contains("/etc/spinlink/config/agent.yaml"), "{args:?}");
        let tmp = tempfile::tempdir().unwrap();
        let local = relocate(text, container(deployment, "agent"), tmp.path());
        let out = agent_check_config(&local, tmp.path()).unwrap_or_else(|e| {
            panic!(
                "{}: the agent refused the chart's config:\n{e}\n{local}",
                values.display()
            )
        });
        assert!(out.starts_with("ok: "), "{out}");
    }
}

/// The agent's probes reach the port its config serves the admin API on.
fn check_agent_probes(config: &Value, deployment: &Value) -> Result<(), String> {
    let listen = config["admin"]["listen"]
        .as_str()
        .ok_or("the agent config has no admin.listen")?;
    let port: u64 = listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("admin.listen {listen:?} has no port"))?;
    let agent = container(deployment, "agent");
    let declared = agent["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "admin"))
        .and_then(|p| p["containerPort"].as_u64());
    if declared != Some(port) {
        return Err(format!(
            "admin containerPort {declared:?}, config listens on {port}"
        ));
    }
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &agent[probe]["httpGet"];
        if get["path"] != path || get["port"] != "admin" {
            return Err(format!("{probe} is {get}, want {path} on the admin port"));
        }
    }
    Ok(())
}

#[test]
fn agent_probes_reach_the_admin_port_the_config_opens() {
    for values in ci_values("spinlink-agent") {
        let objects = render("spinlink-agent", &values);
        let config: Value = serde_norway::from_str(
            one(&objects, "ConfigMap", "-config")["data"]["agent.yaml"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let deployment = one(&objects, "Deployment", "agent");
        check_agent_probes(&config, deployment)
            .unwrap_or_else(|e| panic!("{}: {e}", values.display()));
    }
    for overlay in overlays() {
        let objects = kustomize(&overlay).unwrap();
        let Some(deployment) = find(&objects, "Deployment")
            .into_iter()
            .find(|d| name(d).contains("agent"))
        else {
            continue;
        };
        let config: Value = serde_norway::from_str(
            find(&objects, "ConfigMap")
                .into_iter()
                .find_map(|c| c["data"]["agent.yaml"].as_str())
                .unwrap(),
        )
        .unwrap();
        check_agent_probes(&config, deployment)
            .unwrap_or_else(|e| panic!("{}: {e}", overlay.display()));
    }
    // And the check can fail.
    let objects = render(
        "spinlink-agent",
        &chart_dir("spinlink-agent").join("ci/agent-watch-only.yaml"),
    );
    let deployment = one(&objects, "Deployment", "agent");
    let wrong: Value = serde_norway::from_str("admin: {listen: '0.0.0.0:9999'}").unwrap();
    assert!(check_agent_probes(&wrong, deployment).is_err());
    let none: Value = serde_norway::from_str("agentId: x").unwrap();
    assert!(check_agent_probes(&none, deployment).is_err());
}

#[test]
fn agent_check_config_refuses_keys_it_does_not_know() {
    let values = chart_dir("spinlink-agent").join("ci/agent-watch-only.yaml");
    let objects = render("spinlink-agent", &values);
    let text = one(&objects, "ConfigMap", "-config")["data"]["agent.yaml"]
        .as_str()
        .unwrap();
    let deployment = one(&objects, "Deployment", "agent");
    let tmp = tempfile::tempdir().unwrap();
    let local = relocate(text, container(deployment, "agent"), tmp.path());
    agent_check_config(&local, tmp.path()).unwrap();
    let err =
        agent_check_config(&format!("{local}leaderElection: true\n"), tmp.path()).unwrap_err();
    assert!(err.contains("leaderElection"), "{err}");
    // A file the pod would not have.
    let missing = local.replace("tls.key", "absent.key");
    assert!(agent_check_config(&missing, tmp.path()).is_err());
}

/// Starts `spinlink SUBCOMMAND --config FILE`, returns its first
/// `listening:` line (or panics with its output), and stops it.
fn run_until_listening(subcommand: &str, config: &Path) -> String {
    use std::io::{BufRead as _, Read as _};
    let mut child = Command::new(env!("CARGO_BIN_EXE_spinlink"))
        .args([subcommand, "--config"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("listening:") && tx.send(line).is_err() {
                return;
            }
        }
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(30));
    let _ = child.kill();
    let _ = child.wait();
    match got {
        Ok(line) => line,
        Err(_) => {
            let mut stderr = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
            panic!("spinlink {subcommand} did not start:\n{stderr}")
        }
    }
}

/// Loads a gateway or sidecar configuration with the real binary:
/// `spinlink gateway|sidecar --check-config --config FILE`.
fn load_component_config(subcommand: &str, text: &str, dir: &Path) -> Result<(), String> {
    load_component_config_in_pod(subcommand, text, dir, &[], &Value::Null)
}

/// The same, as `container` runs it: with its arguments after `--config
/// FILE` (the sidecar's `--peer-advertise-url`) and its `fieldRef`
/// variables, as in a pod `spin-clouddriver-7d9c5-x2x7q` at 10.1.2.3
/// (`$(POD_IP)` expanded as the kubelet would).
fn load_component_config_in_pod(
    subcommand: &str,
    text: &str,
    dir: &Path,
    extra: &[String],
    container: &Value,
) -> Result<(), String> {
    let file = dir.join(format!("{subcommand}.yaml"));
    std::fs::write(&file, text).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_spinlink"));
    for e in container["env"].as_array().into_iter().flatten() {
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("status.podIP") => "10.1.2.3",
            Some("metadata.name") => "spin-clouddriver-7d9c5-x2x7q",
            _ => continue,
        };
        command.env(e["name"].as_str().unwrap(), value);
    }
    let out = command
        .args([subcommand, "--check-config", "--config"])
        .arg(&file)
        .args(extra.iter().map(|a| a.replace("$(POD_IP)", "10.1.2.3")))
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The sidecar configuration the chart renders (a Secret's `stringData`).
fn sidecar_config(objects: &[Value]) -> Option<String> {
    find(objects, "Secret")
        .into_iter()
        .find_map(|s| s["stringData"]["sidecar.yaml"].as_str().map(str::to_owned))
}

#[test]
fn gateway_and_sidecar_configs_from_the_chart_load() {
    for values in ci_values("spinlink") {
        let objects = render("spinlink", &values);
        let tmp = tempfile::tempdir().unwrap();
        let gateway = one(&objects, "ConfigMap", "-gateway-config")["data"]["gateway.yaml"]
            .as_str()
            .unwrap();
        let deployment = one(&objects, "Deployment", "-gateway");
        let local = relocate(gateway, container(deployment, "gateway"), tmp.path());
        load_component_config("gateway", &local, tmp.path()).unwrap_or_else(|e| {
            panic!("{}: gateway config refused: {e}\n{local}", values.display())
        });

        let sidecar = sidecar_config(&objects).expect("a sidecar config Secret");
        let patch = one(&objects, "ConfigMap", "-clouddriver-patch")["data"]["patch.yaml"]
            .as_str()
            .unwrap();
        let patch: Value = serde_norway::from_str(patch).unwrap();
        let parsed: Value = serde_norway::from_str(&sidecar).unwrap();
        let facade = parsed["facade"]["listen"].as_str().unwrap();
        assert!(
            facade.starts_with("127.0.0.1:") && !facade.ends_with(":7002"),
            "the facade {facade} must be on loopback and off Clouddriver's port"
        );
        // The tunnel serves the gateway's identity, and only it.
        let fullname = name(one(&objects, "Deployment", "-gateway"))
            .strip_suffix("-gateway")
            .unwrap()
            .to_owned();
        assert_eq!(
            strings(&parsed["tunnel"]["tls"]["gatewayIdentities"]),
            BTreeSet::from([format!("spiffe://spinlink/gateway/{fullname}")]),
            "{}: the sidecar must name the gateway's identity",
            values.display()
        );
        let local = relocate(&sidecar, container(&patch, "spinlink-sidecar"), tmp.path());
        let pod = container(&patch, "spinlink-sidecar");
        let args = sidecar_args(pod);
        load_component_config_in_pod("sidecar", &local, tmp.path(), &args, pod).unwrap_or_else(
            |e| panic!("{}: sidecar config refused: {e}\n{local}", values.display()),
        );
    }
}

/// The sidecar container's arguments after `--config FILE`.
fn sidecar_args(container: &Value) -> Vec<String> {
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let at = args.iter().position(|a| a == "--config").unwrap();
    args[at + 2..].to_vec()
}

/// The labels of a Deployment's pods.
fn pod_labels(deployment: &Value) -> &serde_json::Map<String, Value> {
    deployment["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap()
}

/// Whether `selector` (matchLabels) selects pods labelled `labels`.
fn selects(selector: &Value, labels: &serde_json::Map<String, Value>) -> bool {
    selector["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// The sidecar's scale-out as rendered: the peer port on mutual TLS with
/// the sidecar identity its certificate carries, advertised at the pod's
/// own address (POD_IP from the downward API), the facade on loopback, and
/// a NetworkPolicy letting only gateway pods reach the tunnel port and
/// only sidecar pods the peer port. `clouddriver` is the patched
/// Deployment, `gateway` the gateway's; `certificate` the sidecar's, when
/// rendered.
fn check_scale_out(
    config: &Value,
    clouddriver: &Value,
    gateway: &Value,
    policies: &[&Value],
    certificate: Option<&Value>,
    fullname: &str,
) {
    let identity = format!("spiffe://spinlink/sidecar/{fullname}");
    let peer = &config["peer"];
    let port: u16 = peer["listen"]
        .as_str()
        .unwrap()
        .strip_prefix("0.0.0.0:")
        .expect("the peer port listens on the pod network")
        .parse()
        .unwrap();
    for key in ["certFile", "keyFile", "caFile"] {
        assert!(peer["tls"][key].is_string(), "peer.tls.{key}");
    }
    assert_eq!(strings(&peer["tls"]["peerIdentities"]), set(&[&identity]));
    assert!(
        peer.get("advertiseUrl").is_none() && peer.get("insecure").is_none(),
        "per pod, never in the shared config; never plaintext"
    );
    assert!(
        config["facade"]["listen"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    if let Some(cert) = certificate {
        assert_eq!(strings(&cert["spec"]["uris"]), set(&[&identity]));
        let usages = strings(&cert["spec"]["usages"]);
        assert!(usages.contains("client auth") && usages.contains("server auth"));
    }
    let sidecar = container(clouddriver, "spinlink-sidecar");
    let pod_ip = sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_IP")
        .expect("POD_IP in the sidecar's env");
    assert_eq!(pod_ip["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
    // Named after its pod: replicas sharing the store tell leases apart by it.
    let instance = sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SPINLINK_INSTANCE_ID")
        .expect("SPINLINK_INSTANCE_ID in the sidecar's env");
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let args = sidecar_args(sidecar);
    assert_eq!(
        args,
        [
            "--peer-advertise-url".to_owned(),
            format!("https://$(POD_IP):{port}")
        ]
    );
    let ports: Vec<u64> = sidecar["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect();
    let tunnel: u16 = config["tunnel"]["listen"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ports.contains(&u64::from(port)) && ports.contains(&u64::from(tunnel)));

    // One policy selects the sidecar pods; from whom each port opens.
    let sidecar_pods = pod_labels(clouddriver);
    let gateway_pods = pod_labels(gateway);
    let selecting: Vec<&&Value> = policies
        .iter()
        .filter(|p| selects(&p["spec"]["podSelector"], sidecar_pods))
        .collect();
    assert_eq!(
        selecting.len(),
        1,
        "one NetworkPolicy selects the sidecar pods"
    );
    let policy = &selecting[0]["spec"];
    assert_eq!(policy["policyTypes"], json!(["Ingress"]));
    let rules = policy["ingress"].as_array().unwrap();
    let opening = |port: u16| -> Vec<&Value> {
        rules
            .iter()
            .filter(|r| {
                r["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["port"] == json!(port)))
            })
            .collect()
    };
    for (port, from, not_from, who) in [
        (tunnel, gateway_pods, sidecar_pods, "gateway"),
        (port, sidecar_pods, gateway_pods, "sidecar"),
    ] {
        let rules = opening(port);
        assert_eq!(rules.len(), 1, "port {port}: one rule");
        let peers = rules[0]["from"].as_array().expect("a rule with sources");
        assert!(
            peers.len() == 1
                && peers[0].get("namespaceSelector").is_none()
                && peers[0].get("ipBlock").is_none(),
            "port {port}: pods of this namespace only"
        );
        assert!(
            selects(&peers[0]["podSelector"], from),
            "port {port} opens to the {who} pods"
        );
        assert!(
            !selects(&peers[0]["podSelector"], not_from),
            "port {port} opens to the {who} pods only"
        );
    }
}

/// The agent's pods: a NetworkPolicy opens their admin port and nothing
/// else.
fn check_agent_network_policy(objects: &[Value]) {
    let deployment = find(objects, "Deployment")[0];
    let agent = container(deployment, "agent");
    let policies = find(objects, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "one NetworkPolicy for the agent");
    assert!(selects(
        &policies[0]["spec"]["podSelector"],
        pod_labels(deployment)
    ));
    let opened: BTreeSet<u64> = policies[0]["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p["port"].as_u64().unwrap())
        .collect();
    let admin: BTreeSet<u64> = agent["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect();
    assert_eq!(opened, admin);
}

#[test]
fn the_chart_renders_sidecars_that_scale_out_in_pods() {
    for values in ci_values("spinlink") {
        let objects = render("spinlink", &values);
        let gateway = one(&objects, "Deployment", "-gateway");
        let fullname = name(gateway).strip_suffix("-gateway").unwrap().to_owned();
        let config: Value = serde_norway::from_str(&sidecar_config(&objects).unwrap()).unwrap();
        let patch: Value = serde_norway::from_str(
            one(&objects, "ConfigMap", "-clouddriver-patch")["data"]["patch.yaml"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let clouddriver = find(
            &apply_clouddriver_patch(&serde_json::to_string(&patch).unwrap()),
            "Deployment",
        )[0]
        .clone();
        let certificate = find(&objects, "Certificate")
            .into_iter()
            .find(|c| name(c).ends_with("-sidecar"));
        check_scale_out(
            &config,
            &clouddriver,
            gateway,
            &find(&objects, "NetworkPolicy"),
            certificate,
            &fullname,
        );
        // The gateway finds every sidecar pod through the Service's
        // EndpointSlices, with a token and a Role that reads only those.
        let gateway_config: Value = serde_norway::from_str(
            one(&objects, "ConfigMap", "-gateway-config")["data"]["gateway.yaml"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let automount = &gateway["spec"]["template"]["spec"]["automountServiceAccountToken"];
        if gateway_config["upstreams"][0].get("discovery").is_none() {
            // Upstreams listed by hand: no API access at all.
            assert_eq!(automount, false, "{}", values.display());
            assert!(find(&objects, "Role").is_empty(), "{}", values.display());
            continue;
        }
        let service = one(&objects, "Service", "-sidecar");
        let slices = &gateway_config["upstreams"][0]["discovery"]["endpointSlices"];
        assert_eq!(
            slices["service"].as_str(),
            Some(name(service)),
            "{}",
            values.display()
        );
        assert_eq!(slices["portName"], service["spec"]["ports"][0]["name"]);
        let role = one(&objects, "Role", "-gateway-discovery");
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}])
        );
        let binding = one(&objects, "RoleBinding", "-gateway-discovery");
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(
            binding["subjects"][0]["name"],
            gateway["spec"]["template"]["spec"]["serviceAccountName"]
        );
        assert_eq!(automount, true);
    }
    for values in ci_values("spinlink-agent") {
        check_agent_network_policy(&render("spinlink-agent", &values));
    }
}

#[test]
fn kustomize_renders_sidecars_that_scale_out_in_pods() {
    let dir = kustomize_dir();
    let objects = kustomize(&dir.join("overlays/spinnaker-service-mode")).unwrap();
    let patch =
        std::fs::read_to_string(dir.join("spinnaker-service/clouddriver-sidecar/patch.yaml"))
            .unwrap();
    let clouddriver = find(&apply_clouddriver_patch(&patch), "Deployment")[0].clone();
    let config: Value = serde_norway::from_str(
        &std::fs::read_to_string(dir.join("spinnaker-service/clouddriver-sidecar/sidecar.yaml"))
            .unwrap(),
    )
    .unwrap();
    check_scale_out(
        &config,
        &clouddriver,
        one(&objects, "Deployment", "-gateway"),
        &find(&objects, "NetworkPolicy"),
        find(&objects, "Certificate")
            .into_iter()
            .find(|c| name(c).ends_with("-sidecar")),
        "spinlink",
    );
    let agent = kustomize(&dir.join("overlays/agent-mode")).unwrap();
    check_agent_network_policy(&agent);
}

#[test]
fn gateway_config_check_refuses_unknown_keys() {
    let values = chart_dir("spinlink").join("ci/default.yaml");
    let objects = render("spinlink", &values);
    let tmp = tempfile::tempdir().unwrap();
    let gateway = one(&objects, "ConfigMap", "-gateway-config")["data"]["gateway.yaml"]
        .as_str()
        .unwrap();
    let local = relocate(
        gateway,
        container(one(&objects, "Deployment", "-gateway"), "gateway"),
        tmp.path(),
    );
    load_component_config("gateway", &local, tmp.path()).unwrap();
    // `spinlink gateway` has no --check-config: start the binary itself on
    // the chart's configuration (ports moved to loopback) until it listens.
    let on_loopback = local.replace("0.0.0.0:", "127.0.0.1:");
    let on_loopback = on_loopback
        .lines()
        .map(|l| match l.split_once("listen: 127.0.0.1:") {
            Some((indent, _)) => format!("{indent}listen: 127.0.0.1:0"),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    // Outside a cluster the EndpointSlice watch needs a kubeconfig: one
    // naming an API server nobody serves (the watch retries; the gateway
    // serves meanwhile).
    let mut on_loopback: Value = serde_norway::from_str(&on_loopback).unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n\
         current-context: c\n",
    )
    .unwrap();
    on_loopback["upstreams"][0]["discovery"]["endpointSlices"]["kubeconfig"] =
        json!(kubeconfig.display().to_string());
    let file = tmp.path().join("gateway-run.yaml");
    std::fs::write(&file, serde_norway::to_string(&on_loopback).unwrap()).unwrap();
    let listening = run_until_listening("gateway", &file);
    assert!(
        listening.starts_with("listening: gateway 127.0.0.1:"),
        "{listening}"
    );
    let err = load_component_config(
        "gateway",
        &format!("{local}proxyProtocolV2: true\n"),
        tmp.path(),
    )
    .unwrap_err();
    assert!(err.contains("proxyProtocolV2"), "{err}");
}

// ---------------------------------------------------------------------------
// Goal 4: the gateway and the sidecar as the chart renders them

#[test]
fn gateway_service_is_an_nlb_with_proxy_protocol_and_admin_health_checks() {
    let values = chart_dir("spinlink").join("ci/default.yaml");
    let objects = render("spinlink", &values);
    let service = one(&objects, "Service", "-gateway");
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    let a = &service["metadata"]["annotations"];
    let key = |k: &str| a[format!("service.beta.kubernetes.io/aws-load-balancer-{k}")].clone();
    assert_eq!(key("type"), "external");
    assert_eq!(key("nlb-target-type"), "ip");
    assert_eq!(key("proxy-protocol"), "*");
    assert_eq!(key("attributes"), "load_balancing.cross_zone.enabled=true");
    assert_eq!(key("healthcheck-protocol"), "HTTP");
    assert_eq!(key("healthcheck-path"), "/readyz");

    let deployment = one(&objects, "Deployment", "-gateway");
    let gateway = container(deployment, "gateway");
    let admin_port = gateway["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "admin")
        .unwrap()["containerPort"]
        .clone();
    assert_eq!(key("healthcheck-port"), json!(admin_port.to_string()));
    assert_eq!(gateway["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(gateway["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(gateway["securityContext"]["runAsNonRoot"], true);

    // The gateway listens where the Service and the health check point.
    let config: Value = serde_norway::from_str(
        one(&objects, "ConfigMap", "-gateway-config")["data"]["gateway.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(config["admin"]["listen"], format!("0.0.0.0:{admin_port}"));
    assert_eq!(config["listener"]["proxyProtocol"], true);
    let tunnel_port = gateway["ports"][0]["containerPort"].clone();
    assert_eq!(config["listen"], format!("0.0.0.0:{tunnel_port}"));

    // HPA on the Deployment, PDB and zone spread on its pods.
    let hpa = one(&objects, "HorizontalPodAutoscaler", "-gateway");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    assert!(
        deployment["spec"].get("replicas").is_none(),
        "the HPA owns replicas"
    );
    let pdb = one(&objects, "PodDisruptionBudget", "-gateway");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let spread = &deployment["spec"]["template"]["spec"]["topologySpreadConstraints"];
    assert_eq!(spread[0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );

    // Without the NLB, none of the AWS annotations.
    let plain = render(
        "spinlink",
        &chart_dir("spinlink").join("ci/external-issuer-no-nlb.yaml"),
    );
    let service = one(&plain, "Service", "-gateway");
    assert!(
        service["metadata"]["annotations"]
            .as_object()
            .is_none_or(|a| a.is_empty())
    );
}

#[test]
fn cert_manager_issues_gateway_sidecar_and_agent_certificates() {
    let values = chart_dir("spinlink").join("ci/cert-manager-postgres.yaml");
    let objects = render("spinlink", &values);
    let certs = find(&objects, "Certificate");
    let secret_of =
        |suffix: &str| one(&objects, "Certificate", suffix)["spec"]["secretName"].clone();
    // Each Certificate writes the Secret its workload mounts.
    let gateway = one(&objects, "Deployment", "-gateway");
    let gateway_secret = |volume: &str| {
        gateway["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == volume)
            .unwrap()["secret"]["secretName"]
            .clone()
    };
    assert_eq!(gateway_secret("tls"), secret_of("-gateway"));
    let patch: Value = serde_norway::from_str(
        one(&objects, "ConfigMap", "-clouddriver-patch")["data"]["patch.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let sidecar_tls = patch["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "spinlink-sidecar-tls")
        .unwrap();
    assert_eq!(sidecar_tls["secret"]["secretName"], secret_of("-sidecar"));
    // The gateway dials the sidecar by a name its certificate holds.
    let config: Value = serde_norway::from_str(
        one(&objects, "ConfigMap", "-gateway-config")["data"]["gateway.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let server_name = config["upstreamTls"]["serverName"].clone();
    let sidecar_cert = one(&objects, "Certificate", "-sidecar");
    assert!(
        sidecar_cert["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&server_name)
    );
    // Towards the sidecars the gateway presents its internal certificate,
    // whose identity is the one the sidecars serve.
    let internal = one(&objects, "Certificate", "-gateway-internal");
    assert!(strings(&internal["spec"]["usages"]).contains("client auth"));
    assert!(
        config["upstreamTls"]["certFile"]
            .as_str()
            .unwrap()
            .starts_with("/etc/spinlink/internal-tls/")
    );
    assert_eq!(
        gateway_secret("internal-tls"),
        secret_of("-gateway-internal")
    );
    let served: Value = serde_norway::from_str(&sidecar_config(&objects).unwrap()).unwrap();
    assert_eq!(
        strings(&served["tunnel"]["tls"]["gatewayIdentities"]),
        strings(&internal["spec"]["uris"])
    );
    // Agents' certificates (and the gateway's towards them) come from an
    // issuer of their own, never the one the sidecars trust.
    let issuer = |suffix: &str| {
        one(&objects, "Certificate", suffix)["spec"]["issuerRef"]["name"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let internal_issuer = issuer("-gateway-internal");
    assert_eq!(issuer("-sidecar"), internal_issuer);
    for agent_side in ["-gateway", "-agent-prod-eu", "-agent-staging"] {
        assert_ne!(issuer(agent_side), internal_issuer, "{agent_side}");
    }
    assert_eq!(issuer("-gateway"), issuer("-agent-prod-eu"));
    // One client certificate per listed agent, with the identity the policy names.
    let agent = one(&objects, "Certificate", "-agent-prod-eu");
    assert_eq!(agent["spec"]["uris"][0], "spiffe://spinlink/agent/prod-eu");
    assert!(
        certs.len() >= 7,
        "two CAs, two gateway certificates, sidecar and two agents"
    );
    // PostgreSQL's password only ever comes from a Secret.
    let sidecar = sidecar_config(&objects).unwrap();
    assert!(sidecar.contains("postgres://spinlink@spinlink-db.example.internal:5432/spinlink"));
    let env = &container(&patch, "spinlink-sidecar")["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "PGPASSWORD"
                && e["valueFrom"]["secretKeyRef"]["name"] == "spinlink-db")
    );
}

#[test]
fn agent_certificates_need_an_issuer_of_their_own() {
    let tmp = tempfile::tempdir().unwrap();
    let chart = chart_dir("spinlink");
    for (agents, want) in [
        ("", "certManager.agentIssuerRef.name is required"),
        (
            "  agentIssuerRef: { name: corp-ca, kind: ClusterIssuer }\n",
            "must not be certManager.issuerRef",
        ),
    ] {
        let values = tmp.path().join("values.yaml");
        std::fs::write(
            &values,
            format!(
                "certManager:\n  enabled: true\n  createCa: false\n  \
                 issuerRef: {{ name: corp-ca, kind: ClusterIssuer }}\n{agents}"
            ),
        )
        .unwrap();
        let err = helm(&[
            "template",
            chart.to_str().unwrap(),
            "-f",
            values.to_str().unwrap(),
        ])
        .expect_err("agent certificates rendered from the internal issuer");
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn chart_defaults_hold_no_secrets() {
    for chart in ["spinlink-agent", "spinlink"] {
        let text = std::fs::read_to_string(chart_dir(chart).join("values.yaml")).unwrap();
        for word in ["password:", "BEGIN ", "token:", "secretKey"] {
            assert!(!text.contains(word), "{chart}/values.yaml has {word}");
        }
    }
}

// ---------------------------------------------------------------------------
// Goal 4 and 5: Kustomize

/// A stand-in for the Clouddriver Deployment Halyard or the operator makes.
const CLOUDDRIVER: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: spin-clouddriver
spec:
  replicas: 1
  selector:
    matchLabels: {app: spin, cluster: spin-clouddriver}
  template:
    metadata:
      labels: {app: spin, cluster: spin-clouddriver}
    spec:
      containers:
        - name: clouddriver
          image: us-docker.pkg.dev/spinnaker-community/docker/clouddriver:5.90.0
          ports:
            - containerPort: 7002
"#;

/// Applies a strategic-merge `patch` to [`CLOUDDRIVER`] with kustomize.
fn apply_clouddriver_patch(patch: &str) -> Vec<Value> {
    let tmp = tempfile::tempdir().unwrap();
    let patch: Value = serde_norway::from_str(patch).unwrap();
    let name = patch["metadata"]["name"].as_str().unwrap();
    std::fs::write(
        tmp.path().join("clouddriver.yaml"),
        CLOUDDRIVER.replace("name: spin-clouddriver", &format!("name: {name}")),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("patch.yaml"),
        serde_json::to_string(&patch).unwrap(),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("kustomization.yaml"),
        "resources: [clouddriver.yaml]\npatches:\n  - path: patch.yaml\n",
    )
    .unwrap();
    kustomize(tmp.path()).unwrap_or_else(|e| panic!("{e}"))
}

fn assert_sidecar_added(objects: &[Value]) {
    let deployment = find(objects, "Deployment")[0];
    let names: BTreeSet<&str> = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["clouddriver", "spinlink-sidecar"]),
        "patch must add, not replace"
    );
}

fn kustomize_dir() -> PathBuf {
    root().join("deploy/kustomize")
}

/// Every directory with a kustomization.yaml under `deploy/kustomize/overlays`.
fn overlays() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(kustomize_dir().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn kustomize_overlays_render_and_match_the_schemas() {
    let overlays = overlays();
    let names: BTreeSet<String> = overlays
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "agent-mode",
        "agent-mode-deploy",
        "infrastructure-mode",
        "spinnaker-service-mode",
    ] {
        assert!(names.contains(want), "no overlay {want}: {names:?}");
    }
    for dir in overlays {
        let objects = kustomize(&dir).unwrap_or_else(|e| panic!("{e}"));
        check_all(&objects, &dir.display().to_string());
        // The agent configuration in each agent overlay loads in the binary.
        if let Some(cm) = find(&objects, "ConfigMap")
            .into_iter()
            .find(|c| c["data"]["agent.yaml"].is_string())
        {
            let tmp = tempfile::tempdir().unwrap();
            let deployment = one(&objects, "Deployment", "agent");
            let local = relocate(
                cm["data"]["agent.yaml"].as_str().unwrap(),
                container(deployment, "agent"),
                tmp.path(),
            );
            agent_check_config(&local, tmp.path())
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
            assert!(
                volumes
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["configMap"]["name"] == cm["metadata"]["name"]),
                "{}: the Deployment does not mount {}",
                dir.display(),
                name(cm)
            );
        }
        let agent_rbac_values = match dir.file_name().unwrap().to_str().unwrap() {
            "agent-mode" => Some(json!({})),
            "agent-mode-deploy" => Some(json!({"rbac": {"deploy": true}})),
            "infrastructure-mode" => Some(json!({"mode": "infrastructure"})),
            _ => None,
        };
        if let Some(v) = agent_rbac_values {
            check_agent_rbac(&objects, &v).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        if let Some(cm) = find(&objects, "ConfigMap")
            .into_iter()
            .find(|c| c["data"]["gateway.yaml"].is_string())
        {
            let tmp = tempfile::tempdir().unwrap();
            let deployment = one(&objects, "Deployment", "gateway");
            let local = relocate(
                cm["data"]["gateway.yaml"].as_str().unwrap(),
                container(deployment, "gateway"),
                tmp.path(),
            );
            load_component_config("gateway", &local, tmp.path())
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
    }
}

#[test]
fn kustomize_clouddriver_patch_adds_the_sidecar() {
    let dir = kustomize_dir().join("spinnaker-service/clouddriver-sidecar");
    let patch = std::fs::read_to_string(dir.join("patch.yaml")).unwrap();
    let patched = apply_clouddriver_patch(&patch);
    check_all(&patched, "kustomize Clouddriver patch");
    assert_sidecar_added(&patched);
    // The sidecar configuration beside it loads.
    let tmp = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(dir.join("sidecar.yaml")).unwrap();
    let deployment = find(&patched, "Deployment")[0];
    let local = relocate(
        &config,
        container(deployment, "spinlink-sidecar"),
        tmp.path(),
    );
    let pod = container(deployment, "spinlink-sidecar");
    load_component_config_in_pod("sidecar", &local, tmp.path(), &sidecar_args(pod), pod).unwrap();
    // It serves the identity of the gateway's internal certificate.
    let certificates = documents(
        &std::fs::read_to_string(kustomize_dir().join("spinnaker-service/base/certificates.yaml"))
            .unwrap(),
    );
    let internal = one(&certificates, "Certificate", "-gateway-internal");
    let served: Value = serde_norway::from_str(&config).unwrap();
    assert_eq!(
        strings(&served["tunnel"]["tls"]["gatewayIdentities"]),
        strings(&internal["spec"]["uris"])
    );
    // The operator form carries the same patch.
    let operator = yaml_file(&dir.join("spinnakerservice-patch.yaml"));
    let embedded =
        operator["spec"]["kustomize"]["clouddriver"]["deployment"]["patchesStrategicMerge"][0]
            .as_str()
            .expect("the operator takes patches as strings");
    let embedded: Value = serde_norway::from_str(embedded).unwrap();
    let file: Value = serde_norway::from_str(&patch).unwrap();
    assert_eq!(
        embedded["spec"], file["spec"],
        "spinnakerservice-patch.yaml and patch.yaml differ"
    );
}

#[test]
fn quickstarts_are_the_rendered_overlays() {
    // Plain YAML for those without kustomize: each file is exactly what its
    // overlay renders. SPINLINK_BLESS=1 rewrites them.
    let bless = std::env::var_os("SPINLINK_BLESS").is_some();
    for dir in overlays() {
        let overlay = dir.file_name().unwrap().to_string_lossy().into_owned();
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(out.status.success());
        let rendered = format!(
            "# Rendered from deploy/kustomize/overlays/{overlay} by `kubectl kustomize`;\n\
             # edit the overlay, not this file (tests/deploy.rs keeps them equal).\n{}",
            String::from_utf8(out.stdout).unwrap()
        );
        let file = root().join(format!("deploy/quickstart/{overlay}.yaml"));
        if bless {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &rendered).unwrap();
        }
        let committed = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e} (SPINLINK_BLESS=1 writes it)", file.display()));
        assert!(
            committed == rendered,
            "{} is stale: run with SPINLINK_BLESS=1",
            file.display()
        );
    }
}

// ---------------------------------------------------------------------------
// Goal 6: the Dockerfile

/// What is wrong with a Dockerfile: COPY sources that do not exist (or that
/// .dockerignore leaves out), `--from` stages that are not declared, a
/// workspace member not copied, and a runtime that is not `spinlink` as a
/// non-root user.
fn check_dockerfile(text: &str, dockerignore: &str, context: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let ignored: Vec<String> = dockerignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/').to_owned())
        .collect();
    // Continuation lines joined.
    let joined = text.replace("\\\n", " ");
    let mut stages = Vec::new();
    let mut copied = BTreeSet::new();
    let mut last_from = String::new();
    let mut user_after_last_from = None;
    let mut entrypoint = None;
    for line in joined.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|w| w.to_ascii_uppercase()).as_deref() {
            Some("FROM") => {
                last_from = words[1..].join(" ");
                if let Some(i) = words.iter().position(|w| w.eq_ignore_ascii_case("AS")) {
                    stages.push(words[i + 1].to_owned());
                }
                user_after_last_from = None;
            }
            Some("USER") => user_after_last_from = Some(words[1].to_owned()),
            Some("ENTRYPOINT") => entrypoint = Some(words[1..].join(" ")),
            Some("COPY") => {
                let args: Vec<&str> = words[1..]
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                if let Some(from) = words.iter().find_map(|w| w.strip_prefix("--from=")) {
                    if !stages.iter().any(|s| s == from) {
                        errors.push(format!("COPY --from={from}: no such stage"));
                    }
                    continue;
                }
                for src in &args[..args.len().saturating_sub(1)] {
                    let src = src.trim_start_matches("./").trim_end_matches('/');
                    let src = if src.is_empty() { "." } else { src };
                    if !context.join(src).exists() {
                        errors.push(format!("COPY {src}: not in the repository"));
                    }
                    copied.insert(src.to_owned());
                }
            }
            _ => {}
        }
    }
    // What the build needs, each copied and not left out of the context:
    // the workspace manifests, every member, and the [[test]] paths of cli
    // (cargo refuses a manifest whose targets are missing).
    let mut needed = vec![
        "Cargo.toml".to_owned(),
        "Cargo.lock".to_owned(),
        "tests".to_owned(),
    ];
    needed.extend(toml_lite::members(
        &std::fs::read_to_string(context.join("Cargo.toml")).unwrap(),
    ));
    for path in needed {
        let is_copied = copied
            .iter()
            .any(|c| c == "." || *c == path || path.starts_with(&format!("{c}/")));
        if !is_copied {
            errors.push(format!("{path} is not copied"));
        }
        if ignored
            .iter()
            .any(|i| *i == path || path.starts_with(&format!("{i}/")))
        {
            errors.push(format!("{path} is left out by .dockerignore"));
        }
    }
    if !joined.contains("-p spinlink") || !joined.contains("target/production/spinlink") {
        errors.push("the builder does not build the spinlink binary".into());
    }
    // The shipped binary leaves the simulated API server out (the `dev`
    // feature) and is built with the production profile.
    if !joined.contains("--no-default-features") || !joined.contains("--profile production") {
        errors.push("the builder does not make the production build".into());
    }
    match entrypoint {
        Some(e) if e.contains("\"/spinlink\"") => {}
        other => errors.push(format!("ENTRYPOINT {other:?} does not run /spinlink")),
    }
    match user_after_last_from.as_deref() {
        Some(u) if !u.starts_with("0") && !u.starts_with("root") => {}
        other => errors.push(format!("the runtime stage runs as {other:?}")),
    }
    if !last_from.contains("distroless") {
        errors.push(format!("runtime image {last_from} is not distroless"));
    }
    if stages.len() < 2 {
        errors.push("not multi-stage".into());
    }
    errors
}

/// Just enough TOML for `[workspace] members = [...]`.
mod toml_lite {
    pub type Members = Vec<String>;

    pub fn members(cargo_toml: &str) -> Members {
        let start = cargo_toml.find("members").expect("workspace members");
        let rest = &cargo_toml[start..];
        let list = &rest[rest.find('[').unwrap() + 1..rest.find(']').unwrap()];
        list.split(',')
            .map(|s| s.trim().trim_matches('"').to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

#[test]
fn dockerfile_copies_real_paths_and_runs_spinlink_as_non_root() {
    let text = std::fs::read_to_string(root().join("deploy/docker/Dockerfile")).unwrap();
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    let errors = check_dockerfile(&text, &ignore, &root());
    assert!(errors.is_empty(), "{errors:#?}");
    // The manifests run the image's binary with a subcommand it has.
    for sub in ["agent", "gateway", "sidecar"] {
        let out = Command::new(env!("CARGO_BIN_EXE_spinlink"))
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--config"));
    }
    // And the check can fail.
    let broken = text
        .replace(
            "COPY . .",
            "COPY Cargo.toml Cargo.lock ./\nCOPY gateways ./gateway",
        )
        .replace("USER 65532:65532", "USER root")
        .replace("ENTRYPOINT [\"/spinlink\"]", "ENTRYPOINT [\"/bin/sh\"]")
        .replace("--from=builder", "--from=build")
        .replace("--no-default-features", "");
    let errors = check_dockerfile(&broken, &ignore, &root());
    for want in [
        "COPY gateways",
        "gateway is not copied",
        "tests is not copied",
        "runs as",
        "does not run /spinlink",
        "--from=build:",
        "does not make the production build",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{want}: {errors:?}"
        );
    }
    let errors = check_dockerfile(&text, &format!("{ignore}tests/\n"), &root());
    assert!(
        errors.iter().any(|e| e.contains("tests is left out")),
        "{errors:?}"
    );
}

#[test]
fn kustomize_and_helm_patch_clouddriver_alike() {
    // Released as `spinlink`, the chart's names are the Kustomize ones.
    let chart = chart_dir("spinlink");
    let text = helm(&[
        "template",
        chart.to_str().unwrap(),
        "-f",
        chart.join("ci/default.yaml").to_str().unwrap(),
        "--name",
        "spinlink",
        "--namespace",
        "spinnaker",
    ])
    .unwrap();
    let objects = documents(&text);
    let from_chart: Value = serde_norway::from_str(
        one(&objects, "ConfigMap", "-clouddriver-patch")["data"]["patch.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let from_kustomize =
        yaml_file(&kustomize_dir().join("spinnaker-service/clouddriver-sidecar/patch.yaml"));
    assert_eq!(from_chart, from_kustomize, "the two sidecar patches differ");
    // And the tunnel Services select the same pods.
    let kustomized = kustomize(&kustomize_dir().join("overlays/spinnaker-service-mode")).unwrap();
    assert_eq!(
        one(&objects, "Service", "-sidecar")["spec"]["selector"],
        one(&kustomized, "Service", "-sidecar")["spec"]["selector"]
    );
}

#[test]
fn several_agent_replicas_need_leader_election() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(chart_dir("spinlink-agent").join("ci/agent-deploy-ha.yaml"))
        .unwrap();
    let values = tmp.path().join("no-election.yaml");
    std::fs::write(
        &values,
        base.replace(
            "  enabled: true\n  leaseDurationSeconds: 20\n",
            "  enabled: false\n",
        ),
    )
    .unwrap();
    let chart = chart_dir("spinlink-agent");
    let err = helm(&[
        "template",
        chart.to_str().unwrap(),
        "-f",
        values.to_str().unwrap(),
        "--name",
        "rel",
        "--namespace",
        NAMESPACE,
    ])
    .expect_err("two replicas rendered without leader election");
    assert!(err.contains("leaderElection"), "{err}");
}

/// The Clouddriver settings account registration needs
/// (`../shared/clouddriver-account-api.md`, from Clouddriver's source):
/// account storage with its Kubernetes source, SQL, and the credentials
/// poller with a reload interval.
fn check_clouddriver_profile(profile: &Value, what: &str) {
    for (path, want) in [
        ("/account/storage/enabled", json!(true)),
        ("/account/storage/kubernetes/enabled", json!(true)),
        ("/sql/enabled", json!(true)),
        ("/credentials/poller/enabled", json!(true)),
    ] {
        assert_eq!(
            profile.pointer(path),
            Some(&want),
            "{what}: {path}\n{profile:#}"
        );
    }
    let every = profile
        .pointer("/credentials/poller/types/kubernetes/reloadFrequencyMs")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    assert!(
        every > 0,
        "{what}: no reload interval: the poller would never reload"
    );
}

#[test]
fn clouddriver_registration_is_configured_everywhere() {
    for values in ci_values("spinlink") {
        let objects = render("spinlink", &values);
        let what = values.display().to_string();
        // The sidecar registers with the Clouddriver beside it, naming its
        // own loopback facade.
        let sidecar: Value = serde_norway::from_str(&sidecar_config(&objects).unwrap()).unwrap();
        let cd = &sidecar["clouddriver"];
        assert_eq!(cd["baseUrl"], "http://127.0.0.1:7002", "{what}");
        assert_eq!(
            cd["facadeUrl"].as_str().unwrap(),
            format!("http://{}", sidecar["facade"]["listen"].as_str().unwrap()),
            "{what}"
        );
        assert!(cd["user"].as_str().is_some_and(|u| !u.is_empty()), "{what}");
        // Clouddriver's side, and Fiat's.
        let profile = one(&objects, "ConfigMap", "-clouddriver-profile");
        let cd_profile: Value =
            serde_norway::from_str(profile["data"]["clouddriver-local.yml"].as_str().unwrap())
                .unwrap();
        check_clouddriver_profile(&cd_profile, &what);
        let fiat: Value =
            serde_norway::from_str(profile["data"]["fiat-local.yml"].as_str().unwrap()).unwrap();
        assert!(
            fiat.pointer("/fiat/account/manager/roles")
                .is_some_and(Value::is_array)
        );
        // A patch for every Clouddriver Deployment that loads accounts.
        let patches = &one(&objects, "ConfigMap", "-clouddriver-patch")["data"];
        let values_doc = yaml_file(&values);
        let extra = values_doc
            .pointer("/sidecar/clouddriver/extraDeployments")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            patches.as_object().unwrap().len(),
            1 + extra.len(),
            "{what}"
        );
        for name in extra {
            let name = name.as_str().unwrap();
            let patch: Value =
                serde_norway::from_str(patches[format!("patch-{name}.yaml")].as_str().unwrap())
                    .unwrap();
            assert_eq!(patch["metadata"]["name"], name);
            assert!(
                container_names(&patch).contains(&"spinlink-sidecar".to_owned()),
                "{what}: no sidecar in {name}"
            );
        }
    }
    // The split, Fiat-enabled example renders its roles.
    let objects = render(
        "spinlink",
        &chart_dir("spinlink").join("ci/cert-manager-postgres.yaml"),
    );
    let profile = one(&objects, "ConfigMap", "-clouddriver-profile");
    let fiat: Value =
        serde_norway::from_str(profile["data"]["fiat-local.yml"].as_str().unwrap()).unwrap();
    assert_eq!(
        fiat.pointer("/fiat/account/manager/roles"),
        Some(&json!(["ops"]))
    );

    // Kustomize: the sidecar's config, the Halyard/manifest profile and the
    // operator's profile.
    let dir = kustomize_dir().join("spinnaker-service/clouddriver-sidecar");
    let sidecar = yaml_file(&dir.join("sidecar.yaml"));
    assert_eq!(sidecar["clouddriver"]["baseUrl"], "http://127.0.0.1:7002");
    check_clouddriver_profile(
        &yaml_file(&dir.join("clouddriver-local.yml")),
        "clouddriver-local.yml",
    );
    let operator = yaml_file(&dir.join("spinnakerservice-patch.yaml"));
    check_clouddriver_profile(
        &operator["spec"]["spinnakerConfig"]["profiles"]["clouddriver"],
        "spinnakerservice-patch.yaml",
    );
}

fn container_names(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}
