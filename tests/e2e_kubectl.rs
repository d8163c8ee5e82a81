//! kubectl fidelity: the commands Clouddriver runs, with every kubectl the
//! machine has (1.27 … 1.33), through the facade and directly against the
//! simulated cluster, compared.
//!
//! One kube-sim serves both sides. `spinlink dev --kubeconfig` puts the whole
//! chain (agent, gateway, sidecar) in front of it. Each kubectl version gets
//! two twin namespaces: the same script of commands runs in `f-<v>` through
//! the facade and in `d-<v>` straight at kube-sim, and the answers must agree
//! once the namespace names, server-assigned identifiers and timestamps are
//! normalized away.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Kubectl, Proc};

/// Where the machine keeps one kubectl per minor version.
const KUBECTL_DIR: &str = "/usr/lib/google-cloud-sdk/bin";

/// How long a read through the facade may take to agree with the cluster
/// after a write (the watch event has to come back through the chain).
const CONVERGE: Duration = Duration::from_secs(10);

struct Chain {
    _dir: tempfile::TempDir,
    _sim: Proc,
    _dev: Proc,
    sim_kubeconfig: PathBuf,
    facade_kubeconfig: PathBuf,
    root: PathBuf,
}

fn chain() -> Chain {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let sim_kubeconfig = dir.join("sim.kubeconfig");
    let mut sim = Proc::start(
        "kube-sim",
        &dir,
        &[
            "kube-sim",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig-out",
            sim_kubeconfig.to_str().unwrap(),
        ],
    );
    sim.listening("kube-sim");
    let state = dir.join("state");
    let dev = support::dev(&dir, &state, Some(&sim_kubeconfig));
    Chain {
        _dir: tmp,
        _sim: sim,
        _dev: dev,
        sim_kubeconfig,
        facade_kubeconfig: state.join("kubeconfig"),
        root: dir,
    }
}

/// One side of the comparison: a kubectl binary, a kubeconfig and a namespace.
struct Side {
    kubectl: Kubectl,
    ns: String,
}

impl Side {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let args: Vec<String> = args.iter().map(|a| a.replace("{ns}", &self.ns)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stdin = stdin.map(|s| s.replace("{ns}", &self.ns));
        self.kubectl.run_with_input(&args, stdin.as_deref())
    }
}

/// Replaces RFC 3339 timestamps (`2026-01-01T00:00:00Z`, with or without
/// fractions) with `<time>`.
fn mask_timestamps(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let digits = |from: usize, n: usize| {
        b.len() >= from + n && b[from..from + n].iter().all(u8::is_ascii_digit)
    };
    while i < b.len() {
        let stamp = digits(i, 4)
            && b.get(i + 4) == Some(&b'-')
            && digits(i + 5, 2)
            && b.get(i + 7) == Some(&b'-')
            && digits(i + 8, 2)
            && b.get(i + 10) == Some(&b'T')
            && digits(i + 11, 2)
            && b.get(i + 13) == Some(&b':')
            && digits(i + 14, 2)
            && b.get(i + 16) == Some(&b':')
            && digits(i + 17, 2);
        if stamp {
            let mut j = i + 19;
            if b.get(j) == Some(&b'.') {
                j += 1;
                while b.get(j).is_some_and(u8::is_ascii_digit) {
                    j += 1;
                }
            }
            if b.get(j) == Some(&b'Z') {
                j += 1;
            }
            out.push_str("<time>");
            i = j;
        } else {
            let c = s[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Drops what the server assigns per object (uids, resourceVersions,
/// timestamps) so twin objects compare equal.
fn normalize_json(v: &mut Value) {
    match v {
        Value::Object(map) => {
            // A generated name is random: keep its prefix.
            if let Some(prefix) = map.get("generateName").and_then(Value::as_str) {
                let masked = format!("{prefix}<random>");
                map.insert("name".into(), Value::String(masked));
            }
            for key in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "time",
                "clusterIP",
                "clusterIPs",
            ] {
                map.remove(key);
            }
            for value in map.values_mut() {
                normalize_json(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_json),
        Value::String(s) => *s = mask_timestamps(s),
        _ => {}
    }
}

#[derive(Debug, PartialEq)]
struct Answer {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `out` normalized for comparison; `twins` (both sides' namespaces) read
/// `<ns>`, so cluster-wide lists naming both compare equal.
fn answer(out: &Output, twins: &[&str], json: bool) -> Answer {
    let mask = |s: String| twins.iter().fold(s, |s, ns| s.replace(ns, "<ns>"));
    let text = |b: &[u8]| mask_timestamps(&mask(String::from_utf8_lossy(b).into_owned()));
    let stdout = if json && out.status.success() {
        let mut v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
        normalize_json(&mut v);
        mask(serde_json::to_string_pretty(&v).unwrap())
    } else {
        text(&out.stdout)
    };
    // kubectl's own noise differs by nothing but timing; keep the error lines.
    let stderr = text(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("Warning: ") && !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    Answer {
        code: out.status.code(),
        stdout,
        stderr,
    }
}

/// The lines where two answers differ, for a readable failure.
fn diff(got: &Answer, want: &Answer) -> String {
    let mut out = format!(
        "exit code: facade {:?}, cluster {:?}\n",
        got.code, want.code
    );
    for (what, g, w) in [
        ("stdout", &got.stdout, &want.stdout),
        ("stderr", &got.stderr, &want.stderr),
    ] {
        let (gl, wl): (Vec<&str>, Vec<&str>) = (g.lines().collect(), w.lines().collect());
        for i in 0..gl.len().max(wl.len()) {
            let (a, b) = (gl.get(i).copied(), wl.get(i).copied());
            if a != b {
                out.push_str(&format!(
                    "{what} line {}:\n  facade:  {}\n  cluster: {}\n",
                    i + 1,
                    a.unwrap_or("<none>"),
                    b.unwrap_or("<none>")
                ));
            }
        }
    }
    out
}

/// One step of the script.
struct Step {
    args: &'static [&'static str],
    stdin: Option<String>,
    /// Compare stdout as normalized JSON.
    json: bool,
    /// A read the cache answers: retried until it agrees (bounded).
    read: bool,
    /// Compare only the exit code and what `check` says of stdout.
    loose: Option<fn(&str) -> bool>,
    /// Must succeed on both sides: agreeing is not enough when both could
    /// fail alike (kube-sim serves both).
    succeeds: bool,
}

fn step(args: &'static [&'static str]) -> Step {
    Step {
        args,
        stdin: None,
        json: false,
        read: false,
        loose: None,
        succeeds: false,
    }
}

/// A write that must succeed on both sides.
fn creates(args: &'static [&'static str]) -> Step {
    Step {
        succeeds: true,
        ..step(args)
    }
}

/// A read right after a write through the facade: asked once, not retried,
/// so it passes only if the facade folded its write's answer into the cache
/// (read-your-writes).
fn visible(args: &'static [&'static str]) -> Step {
    Step {
        succeeds: true,
        ..step(args)
    }
}

fn read_json(args: &'static [&'static str]) -> Step {
    Step {
        json: true,
        read: true,
        ..step(args)
    }
}

fn with_input(args: &'static [&'static str], stdin: String) -> Step {
    Step {
        stdin: Some(stdin),
        ..step(args)
    }
}

fn deployment(replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: {{ns}}\n  labels: {{app: web}}\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    \
         metadata: {{labels: {{app: web}}}}\n    spec:\n      containers:\n      - name: web\n        image: {image}\n"
    )
}

fn service() -> String {
    "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: {ns}\n  labels: {app: web}\n\
     spec:\n  selector: {app: web}\n  ports:\n  - port: 80\n    targetPort: 8080\n"
        .to_owned()
}

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {{ns}}\ndata:\n  key: {value}\n"
    )
}

/// A pod bound to a node (kube-sim has no scheduler), so that deleting it is
/// graceful: it terminates, then the simulated kubelet removes it.
fn pod() -> String {
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: worker\n  namespace: {ns}\n  labels: {app: worker}\n\
     spec:\n  nodeName: sim-node-1\n  containers:\n  - name: main\n    image: busybox:1.36\n"
        .to_owned()
}

/// Events about the deployment `web` and, so that the field selector has
/// something to leave out, about its replica set and another deployment.
fn events() -> String {
    let event = |name: &str, kind: &str, object: &str, api: &str| {
        format!(
            "apiVersion: v1\nkind: Event\nmetadata:\n  name: {name}\n  namespace: {{ns}}\n\
             involvedObject:\n  apiVersion: {api}\n  kind: {kind}\n  name: {object}\n  namespace: {{ns}}\n\
             reason: ScalingReplicaSet\nmessage: {name}\ntype: Normal\ncount: 1\n\
             source:\n  component: deployment-controller\n"
        )
    };
    [
        event("web.scaled-up", "Deployment", "web", "apps/v1"),
        event("web.scaled-down", "Deployment", "web", "apps/v1"),
        event("web-rs.created", "ReplicaSet", "web", "apps/v1"),
        event("other.scaled-up", "Deployment", "other", "apps/v1"),
    ]
    .join("---\n")
}

/// The commands Clouddriver's Kubernetes provider runs, in an order that
/// builds on itself.
fn script() -> Vec<Step> {
    vec![
        with_input(&["apply", "-f", "-"], deployment(1, "nginx:1.25")),
        with_input(&["apply", "-f", "-"], service()),
        with_input(&["apply", "-f", "-"], deployment(2, "nginx:1.25")),
        read_json(&[
            "get",
            "deployment,replicaSet,service",
            "-n",
            "{ns}",
            "-l",
            "app=web",
            "-o",
            "json",
        ]),
        read_json(&["get", "deployment", "web", "-n", "{ns}", "-o", "json"]),
        read_json(&["get", "namespace", "{ns}", "-o", "json"]),
        // Cluster-scoped lists: every namespace, both twins' included.
        read_json(&["get", "namespaces", "-o", "json"]),
        Step {
            read: true,
            ..step(&["get", "namespaces", "-o", "name"])
        },
        with_input(&["apply", "-f", "-"], events()),
        // Two of the four events match both terms.
        read_json(&[
            "get",
            "event",
            "-n",
            "{ns}",
            "--field-selector",
            "involvedObject.name=web,involvedObject.kind=Deployment",
            "-o",
            "json",
        ]),
        step(&["get", "deployment", "missing", "-n", "{ns}", "-o", "json"]),
        with_input(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            configmap("settings", "one"),
        ),
        with_input(&["replace", "-f", "-"], configmap("settings", "two")),
        read_json(&["get", "configmap", "settings", "-n", "{ns}", "-o", "json"]),
        Step {
            loose: Some(|out| out.starts_with("configmap/gen-") && out.trim_end().ends_with(" created")),
            ..with_input(
                &["create", "-f", "-"],
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  generateName: gen-\n  namespace: {ns}\ndata: {k: v}\n"
                    .to_owned(),
            )
        },
        with_input(&["create", "-f", "-"], configmap("settings", "three")),
        step(&["patch", "deployment", "web", "-n", "{ns}", "--type", "merge", "-p", r#"{"spec":{"replicas":3}}"#]),
        step(&[
            "patch",
            "deployment",
            "web",
            "-n",
            "{ns}",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/replicas","value":4}]"#,
        ]),
        step(&[
            "patch",
            "deployment",
            "web",
            "-n",
            "{ns}",
            "--type",
            "strategic",
            "-p",
            r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.26"}]}}}}"#,
        ]),
        step(&["scale", "deployment", "web", "-n", "{ns}", "--replicas=5"]),
        read_json(&["get", "deployment", "web", "-n", "{ns}", "-o", "json"]),
        Step {
            read: true,
            ..step(&["rollout", "history", "deployment/web", "-n", "{ns}"])
        },
        step(&["rollout", "pause", "deployment/web", "-n", "{ns}"]),
        step(&["rollout", "resume", "deployment/web", "-n", "{ns}"]),
        step(&["rollout", "undo", "deployment/web", "-n", "{ns}"]),
        step(&["rollout", "restart", "deployment/web", "-n", "{ns}"]),
        with_input(&["apply", "-f", "-"], pod()),
        step(&["logs", "worker", "-n", "{ns}", "--tail=3"]),
        step(&["logs", "worker", "-n", "{ns}", "-c", "nope"]),
        step(&["delete", "configmap", "settings", "-n", "{ns}"]),
        step(&["delete", "configmap", "settings", "-n", "{ns}", "--ignore-not-found"]),
        step(&["delete", "configmap", "settings", "-n", "{ns}"]),
        step(&[
            "delete",
            "deployment",
            "web",
            "-n",
            "{ns}",
            "--cascade=foreground",
            "--grace-period=0",
        ]),
        // The default: kubectl waits, watching, until the kubelet removes it.
        step(&["delete", "pod", "worker", "-n", "{ns}"]),
        read_json(&["get", "deployment,pod,configmap", "-n", "{ns}", "-o", "json"]),
        // The `create` generators, which kubectl 1.32+ sends in protobuf
        // (and whose answers come back in protobuf), each read back at once.
        creates(&["create", "namespace", "{ns}-gen"]),
        visible(&["get", "namespace", "{ns}-gen", "-o", "name"]),
        creates(&["create", "configmap", "gen-cm", "-n", "{ns}", "--from-literal=color=blue"]),
        visible(&["get", "configmap", "gen-cm", "-n", "{ns}", "-o", "name"]),
        read_json(&["get", "configmap", "gen-cm", "-n", "{ns}", "-o", "json"]),
        creates(&["create", "secret", "generic", "gen-secret", "-n", "{ns}", "--from-literal=token=t0ken"]),
        visible(&["get", "secret", "gen-secret", "-n", "{ns}", "-o", "name"]),
        creates(&["create", "serviceaccount", "gen-sa", "-n", "{ns}"]),
        visible(&["get", "serviceaccount", "gen-sa", "-n", "{ns}", "-o", "name"]),
        creates(&["create", "deployment", "gen-deploy", "-n", "{ns}", "--image=nginx"]),
        visible(&["get", "deployment", "gen-deploy", "-n", "{ns}", "-o", "name"]),
        read_json(&["get", "deployment", "gen-deploy", "-n", "{ns}", "-o", "json"]),
        creates(&["create", "job", "gen-job", "-n", "{ns}", "--image=busybox"]),
        visible(&["get", "job", "gen-job", "-n", "{ns}", "-o", "name"]),
        creates(&["create", "service", "clusterip", "gen-svc", "-n", "{ns}", "--tcp=80:8080"]),
        visible(&["get", "service", "gen-svc", "-n", "{ns}", "-o", "name"]),
    ]
}

fn run_matrix(version: &str) {
    let bin = Path::new(KUBECTL_DIR).join(format!("kubectl.{version}"));
    assert!(
        bin.exists(),
        "{} is missing; the kubectl matrix needs every version",
        bin.display()
    );
    let chain = chain();
    let tag = version.replace('.', "");
    let facade = Side {
        kubectl: Kubectl::new(
            &chain.root,
            &format!("facade-{tag}"),
            &chain.facade_kubeconfig,
        )
        .with_binary(&bin),
        ns: format!("f-{tag}"),
    };
    let direct = Side {
        kubectl: Kubectl::new(&chain.root, &format!("direct-{tag}"), &chain.sim_kubeconfig)
            .with_binary(&bin),
        ns: format!("d-{tag}"),
    };
    // Both namespaces exist in the cluster before the script starts, and the
    // facade has seen its own.
    for side in [&facade, &direct] {
        direct
            .kubectl
            .ok_with_input(&["create", "namespace", &side.ns], None);
    }
    support::wait_for("the facade to see its namespace", || {
        facade
            .run(&["get", "namespace", "{ns}", "-o", "name"], None)
            .status
            .success()
            .then_some(())
    });

    for (i, s) in script().iter().enumerate() {
        let what = format!("kubectl {version} step {i}: {:?}", s.args);
        let d = direct.run(s.args, s.stdin.as_deref());
        let twins = [facade.ns.as_str(), direct.ns.as_str()];
        let want = answer(&d, &twins, s.json);
        if s.succeeds {
            assert!(
                d.status.success(),
                "{what}: failed straight at the cluster\n{}",
                String::from_utf8_lossy(&d.stderr)
            );
        }
        let deadline = Instant::now() + if s.read { CONVERGE } else { Duration::ZERO };
        loop {
            let f = facade.run(s.args, s.stdin.as_deref());
            let got = answer(&f, &twins, s.json);
            let same = match s.loose {
                Some(check) => got.code == want.code && check(&got.stdout) && check(&want.stdout),
                None => got == want,
            };
            if same {
                break;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{what}: the facade and the cluster disagree\n{}",
                    diff(&got, &want)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // The reads above were answered from the sidecar's cache, not relayed;
    // so was the OpenAPI every kubectl after the first fetched (apply,
    // create), from the sidecar's memory.
    let kubeconfig = std::fs::read_to_string(&chain.facade_kubeconfig).unwrap();
    let server = kubeconfig
        .split_whitespace()
        .find_map(|w| w.trim_matches('"').strip_prefix("http://"))
        .expect("the facade kubeconfig names an http server");
    let addr = server.split('/').next().unwrap().parse().unwrap();
    let (status, metrics) = support::http(addr, "GET", "/metrics", &[]);
    assert_eq!(status, 200);
    let cached = |verb: &str| {
        metrics.lines().any(|l| {
            l.starts_with("spinlink_sidecar_facade_requests_total")
                && l.contains(&format!("verb=\"{verb}\""))
                && l.contains("source=\"cache\"")
        })
    };
    assert!(
        cached("list") && cached("get") && cached("openapi"),
        "{metrics}"
    );
    // `kubectl delete pod` found the pod terminating and waited for it
    // through a watch.
    assert!(
        metrics.lines().any(|l| {
            l.starts_with("spinlink_sidecar_facade_requests_total")
                && l.contains("verb=\"watch\"")
                && !l.ends_with(" 0")
        }),
        "no watch was served: {metrics}"
    );
}

#[test]
fn kubectl_1_27() {
    run_matrix("1.27");
}

#[test]
fn kubectl_1_28() {
    run_matrix("1.28");
}

#[test]
fn kubectl_1_29() {
    run_matrix("1.29");
}

#[test]
fn kubectl_1_30() {
    run_matrix("1.30");
}

#[test]
fn kubectl_1_31() {
    run_matrix("1.31");
}

#[test]
fn kubectl_1_32() {
    run_matrix("1.32");
}

#[test]
fn kubectl_1_33() {
    run_matrix("1.33");
}

#[test]
fn timestamps_are_masked() {
    assert_eq!(
        mask_timestamps("a 2026-01-02T03:04:05Z b 2026-01-02T03:04:05.123456789Z c"),
        "a <time> b <time> c"
    );
    assert_eq!(mask_timestamps("2026-01-02 no"), "2026-01-02 no");
}
