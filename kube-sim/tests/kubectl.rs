//! Real kubectl against kube-sim: `get`, `apply` (client- and server-side), `scale`,
//! `patch` (merge, json, strategic), `delete` with its default wait.
//!
//! `/usr/bin/kubectl` here is the Google Cloud SDK dispatcher, which runs the
//! `kubectl.1.XX` matching the server's minor version (1.27–1.33 are installed); kube-sim
//! reports 1.33 by default so the dispatcher picks a shipped binary. Skipped (with a
//! message) when no kubectl exists.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::start;
use spinlink_kube_sim::{Sim, write_kubeconfig};

const SDK_BIN: &str = "/usr/lib/google-cloud-sdk/bin";

fn find_kubectl() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KUBECTL") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .chain([PathBuf::from("/usr/bin/kubectl")])
        .find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn new(bin: PathBuf, url: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kube/config");
        write_kubeconfig(&kubeconfig, url, "kube-sim", None).unwrap();
        Kubectl {
            bin,
            dir,
            kubeconfig,
        }
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).await.unwrap();
        }
        drop(input);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        self.ok_stdin(args, None).await
    }

    async fn ok_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, stdin).await;
        assert!(ok, "kubectl {args:?} failed:\nstdout: {out}\nstderr: {err}");
        assert!(!err.contains("WARNING: version difference"), "{err}");
        out
    }
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx
  namespace: demo
  labels: {app: nginx}
spec:
  replicas: 2
  selector:
    matchLabels: {app: nginx}
  template:
    metadata:
      labels: {app: nginx}
    spec:
      containers:
      - name: nginx
        image: nginx:1.25
        ports:
        - containerPort: 80
      - name: sidecar
        image: busybox:1.36
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_workflow() {
    let Some(bin) = find_kubectl() else {
        eprintln!("skipping: no kubectl found (set KUBECTL or put kubectl on PATH)");
        return;
    };
    let s = start(Sim::with_demo_workload()).await;
    let k = Kubectl::new(bin, &s.url);

    let out = k.ok(&["get", "pods", "-A"]).await;
    assert!(out.contains("NAMESPACE") && out.contains("READY"), "{out}");
    assert!(
        out.contains("web-7b46c4b544-cwkb7") && out.contains("Running"),
        "{out}"
    );
    let out = k.ok(&["version"]).await;
    assert!(out.contains("Server Version: v1.33"), "{out}");

    // Client-side apply: create, then a change goes through a strategic merge patch.
    let out = k.ok_stdin(&["apply", "-f", "-"], Some(DEPLOYMENT)).await;
    assert!(out.contains("deployment.apps/nginx created"), "{out}");
    let out = k
        .ok_stdin(
            &["apply", "-f", "-"],
            Some(&DEPLOYMENT.replace("nginx:1.25", "nginx:1.27")),
        )
        .await;
    assert!(out.contains("deployment.apps/nginx configured"), "{out}");
    let d = s.sim.get("deployments", Some("demo"), "nginx").unwrap();
    let cs = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!((cs.len(), cs[0]["image"].as_str()), (2, Some("nginx:1.27")));
    assert_eq!(d["metadata"]["generation"], 2);

    // Server-side apply.
    let ssa = DEPLOYMENT.replace("name: nginx\n  namespace", "name: nginx-ssa\n  namespace");
    let out = k
        .ok_stdin(&["apply", "--server-side", "-f", "-"], Some(&ssa))
        .await;
    assert!(
        out.contains("deployment.apps/nginx-ssa serverside-applied"),
        "{out}"
    );
    let d = s.sim.get("deployments", Some("demo"), "nginx-ssa").unwrap();
    assert_eq!(d["metadata"]["managedFields"][0]["manager"], "kubectl");

    let out = k
        .ok(&[
            "scale",
            "deployment",
            "nginx",
            "-n",
            "demo",
            "--replicas",
            "4",
        ])
        .await;
    assert!(out.contains("deployment.apps/nginx scaled"), "{out}");
    assert_eq!(
        s.sim.get("deployments", Some("demo"), "nginx").unwrap()["spec"]["replicas"],
        4
    );

    k.ok(&[
        "patch",
        "deployment",
        "nginx",
        "-n",
        "demo",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"patched":"merge"}}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "deployment",
        "nginx",
        "-n",
        "demo",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
    ])
    .await;
    k.ok(&["patch", "deployment", "nginx", "-n", "demo", "--type", "strategic", "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"busybox:1.37"}]}}}}"#]).await;
    let d = s.sim.get("deployments", Some("demo"), "nginx").unwrap();
    assert_eq!(d["metadata"]["labels"]["patched"], "merge");
    assert_eq!(d["spec"]["replicas"], 3);
    let cs = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(
        (cs.len(), cs[0]["image"].as_str(), cs[1]["image"].as_str()),
        (2, Some("nginx:1.27"), Some("busybox:1.37"))
    );

    let out = k
        .ok(&["get", "deploy", "-n", "demo", "nginx", "-o", "yaml"])
        .await;
    let v: serde_json::Value = serde_norway::from_str(&out).unwrap();
    assert_eq!(v["kind"], "Deployment");
    assert_eq!(v["spec"]["replicas"], 3);
    let out = k
        .ok(&["get", "deploy", "-n", "demo", "web", "-o", "yaml"])
        .await;
    assert!(out.contains("image: nginx:1.25"), "{out}");
    let out = k.ok(&["get", "deploy", "-n", "demo"]).await;
    assert!(
        out.contains("UP-TO-DATE")
            && out
                .lines()
                .any(|l| l.starts_with("nginx ") && l.contains("3/3")),
        "{out}"
    );

    let out = k.ok(&["get", "secrets", "-n", "demo", "-o", "yaml"]).await;
    let v: serde_json::Value = serde_norway::from_str(&out).unwrap();
    assert_eq!(v["items"][0]["metadata"]["name"], "app-secret");
    assert_eq!(v["items"][0]["data"]["token"], "czNjcjN0");

    // Delete waits (by default) until the object is gone.
    let out = k.ok(&["delete", "deployment", "nginx", "-n", "demo"]).await;
    assert!(out.contains("deployment.apps \"nginx\" deleted"), "{out}");
    assert!(s.sim.get("deployments", Some("demo"), "nginx").is_none());
    let out = k
        .ok(&["delete", "pod", "-n", "demo", "api-5d8f9c7b6d-cwkb7"])
        .await;
    assert!(out.contains("deleted"), "{out}");
    let (ok, _, err) = k.run(&["get", "deploy", "-n", "demo", "nginx"], None).await;
    assert!(
        !ok && (err.contains("NotFound") || err.contains("not found")),
        "{err}"
    );
}

/// Every installed kubectl minor version can list through kube-sim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_installed_kubectl_version_lists() {
    let versions: Vec<PathBuf> = (27..=33)
        .map(|m| Path::new(SDK_BIN).join(format!("kubectl.1.{m}")))
        .filter(|p| p.is_file())
        .collect();
    if versions.is_empty() {
        eprintln!("skipping: no {SDK_BIN}/kubectl.1.XX binaries");
        return;
    }
    let s = start(Sim::with_demo_workload()).await;
    for bin in versions {
        let k = Kubectl::new(bin.clone(), &s.url);
        let (ok, out, err) = k.run(&["get", "deploy,svc,cm", "-n", "demo"], None).await;
        assert!(ok, "{}: {err}", bin.display());
        assert!(
            out.contains("deployment.apps/web")
                && out.contains("service/api")
                && out.contains("configmap/app-config"),
            "{}: {out}",
            bin.display()
        );
    }
}
