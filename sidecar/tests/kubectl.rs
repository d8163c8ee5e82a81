//! Real kubectl against the facade: discovery from the recorded documents of
//! a real API server, a few objects from the recorded lists, then
//! `kubectl get pods -A` (Table) and `kubectl get configmaps -n demo -o json`.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use spinlink_proto::v1::{self, cache_up};

/// The `kubectl` on PATH is a dispatcher that picks a kubectl by the server's
/// `/version` (1.36 here); the newest installed binary is the fallback.
const KUBECTL_CANDIDATES: &[&str] = &["kubectl", "/usr/lib/google-cloud-sdk/bin/kubectl.1.33"];

fn kubectl_binary() -> Option<&'static str> {
    KUBECTL_CANDIDATES.iter().copied().find(|k| {
        Command::new(k)
            .args(["version", "--client"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn discovery_documents() -> Vec<v1::Document> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kube-sim/fixtures/discovery");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let Some(stem) = file.strip_suffix(".json") else {
            continue;
        };
        if stem.ends_with(".aggregated") {
            continue;
        }
        // File name = path with '/' turned into '_' (groups have no '_').
        let path = format!("/{}", stem.replace('_', "/"));
        docs.push(v1::Document {
            path,
            content_type: "application/json".into(),
            body: std::fs::read(dir.join(&file)).unwrap(),
        });
    }
    assert!(docs.iter().any(|d| d.path == "/apis/apps/v1"));
    assert!(docs.iter().any(|d| d.path == "/api/v1"));
    docs
}

fn items(list: &str) -> Vec<serde_json::Value> {
    fixture(&format!("objects/{list}"))["items"]
        .as_array()
        .unwrap()
        .clone()
}

fn run(kubectl: &str, home: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(home.join("cache"))
        .args(args)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_reads_the_cache() -> anyhow::Result<()> {
    let Some(kubectl) = kubectl_binary() else {
        panic!("no kubectl found among {KUBECTL_CANDIDATES:?}");
    };
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "dev").await?;
    cache
        .send(cache_up::Msg::Discovery(v1::DiscoverySnapshot {
            documents: discovery_documents(),
        }))
        .await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let configmaps = kind("", "v1", "configmaps", "ConfigMap", true);
    let pod_items = items("pods.list.json");
    let cm_items = items("configmaps.list.json");
    sync(&mut cache, &pods, &pod_items).await?;
    sync(&mut cache, &configmaps, &cm_items).await?;
    cache.wait_acked().await?;

    let home = tempfile::tempdir()?;
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: dev\n  cluster:\n    server: http://{}/accounts/dev\n\
             contexts:\n- name: dev\n  context:\n    cluster: dev\n    user: dev\ncurrent-context: dev\nusers:\n- name: dev\n  user: {{}}\n",
            sidecar.facade
        ),
    )?;

    let (home_path, kc) = (home.path().to_owned(), kubeconfig.clone());
    let (ok, stdout, stderr) =
        tokio::task::spawn_blocking(move || run(kubectl, &home_path, &kc, &["get", "pods", "-A"]))
            .await?;
    assert!(ok, "kubectl get pods -A failed: {stderr}");
    let header = stdout.lines().next().unwrap_or_default();
    for col in ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"] {
        assert!(header.contains(col), "{stdout}");
    }
    for p in &pod_items {
        let name = p["metadata"]["name"].as_str().unwrap();
        assert!(stdout.contains(name), "{name} missing from:\n{stdout}");
    }
    assert!(
        stdout.lines().skip(1).all(|l| l.starts_with("demo ")),
        "{stdout}"
    );

    let (home_path, kc) = (home.path().to_owned(), kubeconfig.clone());
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        run(
            kubectl,
            &home_path,
            &kc,
            &["get", "configmaps", "-n", "demo", "-o", "json"],
        )
    })
    .await?;
    assert!(ok, "kubectl get configmaps failed: {stderr}");
    let list: serde_json::Value = serde_json::from_str(&stdout)?;
    let mut got: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    let mut want: Vec<&str> = cm_items
        .iter()
        .filter(|i| i["metadata"]["namespace"] == "demo")
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    got.sort_unstable();
    want.sort_unstable();
    assert!(!want.is_empty());
    assert_eq!(got, want);
    sidecar.stop().await
}
