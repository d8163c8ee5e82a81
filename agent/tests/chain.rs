//! Delivery without loss through the real chain, in one process: kube-sim →
//! agent → gateway → sidecar. The gateway is stopped, objects are deleted in
//! kube-sim, the gateway comes back, and the sidecar's cache must equal
//! kube-sim's state — by resuming the watch from the sidecar's
//! resourceVersion (no listing) when kube-sim still has the history, and by
//! listing again inside `SyncStart`/`SyncEnd` after a 410 when it has not.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use spinlink_agent::{Agent, Config};
use spinlink_kube_sim::{Server, Sim};
use spinlink_tls::dev::{DevPki, dev_agent_identity, dev_gateway_identity};
use tokio_util::sync::CancellationToken;

const AGENT: &str = "a1";
const WAIT: Duration = Duration::from_secs(30);

fn write(dir: &Path, name: &str, value: &serde_json::Value) -> std::path::PathBuf {
    // JSON is YAML.
    let path = dir.join(name);
    std::fs::write(&path, value.to_string()).unwrap();
    path
}

async fn start_gateway(
    dir: &Path,
    pki: &DevPki,
    listen: SocketAddr,
    sidecar: SocketAddr,
) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
    let config = json!({
        "gatewayId": "gw",
        "shutdownGraceSeconds": 1,
        "listen": listen.to_string(),
        "tls": {"certFile": pki.cert("gateway"), "keyFile": pki.key("gateway"),
                "clientCaFile": pki.ca_cert()},
        "policy": [{"identities": [dev_agent_identity(AGENT)], "accounts": ["dev"]}],
        "upstreams": [{"url": format!("https://localhost:{}", sidecar.port())}],
        "upstreamTls": {"caFile": pki.ca_cert(), "certFile": pki.cert("gateway"),
                        "keyFile": pki.key("gateway")},
    });
    let config = spinlink_gateway::Config::from_file(&write(dir, "gateway.yaml", &config)).unwrap();
    let gateway = spinlink_gateway::Gateway::bind(config).await.unwrap();
    let addr = gateway.local_addr();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            gateway.run(stop).await.unwrap();
        }
    });
    (addr, stop, task)
}

/// The names of the objects the sidecar's cache holds for `resource` in `demo`.
fn cached(accounts: &spinlink_sidecar::Accounts, resource: &str) -> Vec<String> {
    let Some(account) = accounts.get("dev") else {
        return Vec::new();
    };
    let cache = account.read_cache();
    let Some(kind) = cache.kind("", "v1", resource) else {
        return Vec::new();
    };
    let mut names: Vec<String> = kind
        .objects
        .values()
        .filter(|e| e.object()["metadata"]["namespace"] == "demo")
        .map(|e| {
            e.object()["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    names.sort();
    names
}

fn in_sim(sim: &Sim, resource: &str) -> Vec<String> {
    let mut names: Vec<String> = sim
        .list(resource, Some("demo"))
        .iter()
        .map(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    names.sort();
    names
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn counter(text: &str, name: &str, kind: &str) -> u64 {
    let prefix = format!("spinlink_agent_{name}_total{{account=\"dev\",kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn configmap(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "demo"}, "data": {"k": name}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_while_disconnected_reach_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &[AGENT]).unwrap();
    let stop = CancellationToken::new();

    let sim = Sim::with_demo_workload();
    for n in 0..6 {
        sim.create(configmap(&format!("cm-{n}"))).unwrap();
    }
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let kubeconfig = dir.join("sim.kubeconfig");
    spinlink_kube_sim::write_kubeconfig(&kubeconfig, &server.url(), "sim", None).unwrap();
    tokio::spawn(server.run(stop.clone()));

    let sidecar_config = json!({
        "instanceId": "sc",
        "tunnel": {"listen": "127.0.0.1:0", "tls": {"certFile": pki.cert("sidecar"),
            "keyFile": pki.key("sidecar"), "clientCaFile": pki.ca_cert(),
            "gatewayIdentities": [dev_gateway_identity()]}},
        "facade": {"listen": "127.0.0.1:0"},
        "store": {"url": format!("sqlite://{}", dir.join("sidecar.db").display())},
    });
    let sidecar_config =
        spinlink_sidecar::Config::from_file(&write(dir, "sidecar.yaml", &sidecar_config)).unwrap();
    let sidecar = spinlink_sidecar::Sidecar::bind(sidecar_config)
        .await
        .unwrap();
    let tunnel = sidecar.tunnel_addr();
    let accounts = sidecar.accounts();
    tokio::spawn(sidecar.run(stop.clone()));

    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (gw_addr, gw_stop, gw_task) = start_gateway(dir, &pki, any_port, tunnel).await;

    let agent_name = format!("agent-{AGENT}");
    let agent_config = json!({
        "agentId": AGENT,
        "gateway": {"url": format!("https://localhost:{}", gw_addr.port()),
            "caFile": pki.ca_cert(), "certFile": pki.cert(&agent_name),
            "keyFile": pki.key(&agent_name)},
        "reconnect": {"initialBackoffMillis": 50, "maxBackoffMillis": 200},
        "cache": {"pageSize": 2},
        "kubernetes": {"accounts": [{"name": "dev", "kubeconfigFile": kubeconfig}]},
    });
    let agent = Agent::new(Config::from_yaml_str(&agent_config.to_string(), "agent.yaml").unwrap())
        .unwrap();
    let metrics = agent.metrics();
    let agent_task = tokio::spawn(agent.run(stop.clone()));

    wait_until("the first sync", || {
        accounts.status("dev").is_some_and(|s| s.ready())
            && cached(&accounts, "configmaps") == in_sim(&sim, "configmaps")
    })
    .await;
    let relists = counter(&metrics.encode(), "relists", "configmaps");
    assert_eq!(relists, 1, "{}", metrics.encode());

    // 1. Within kube-sim's history: the watch resumes, no listing.
    gw_stop.cancel();
    gw_task.await.unwrap();
    sim.delete("configmaps", Some("demo"), "cm-0").unwrap();
    sim.delete("configmaps", Some("demo"), "cm-1").unwrap();
    sim.create(configmap("added-while-away")).unwrap();
    let (_, gw_stop, gw_task) = start_gateway(dir, &pki, gw_addr, tunnel).await;
    wait_until("the cache to follow the deletions", || {
        cached(&accounts, "configmaps") == in_sim(&sim, "configmaps")
    })
    .await;
    let text = metrics.encode();
    assert_eq!(counter(&text, "relists", "configmaps"), relists, "{text}");
    assert_eq!(counter(&text, "watch_gone", "configmaps"), 0, "{text}");

    // 2. History gone: 410, then a listing that drops what was deleted.
    gw_stop.cancel();
    gw_task.await.unwrap();
    sim.delete("configmaps", Some("demo"), "cm-2").unwrap();
    sim.delete("configmaps", Some("demo"), "cm-3").unwrap();
    sim.compact();
    let (_, gw_stop, gw_task) = start_gateway(dir, &pki, gw_addr, tunnel).await;
    wait_until("the cache to drop what was deleted", || {
        cached(&accounts, "configmaps") == in_sim(&sim, "configmaps")
    })
    .await;
    let names = cached(&accounts, "configmaps");
    assert!(
        !names.contains(&"cm-2".to_owned()) && names.contains(&"cm-4".to_owned()),
        "{names:?}"
    );
    let text = metrics.encode();
    assert!(counter(&text, "watch_gone", "configmaps") >= 1, "{text}");
    assert!(counter(&text, "relists", "configmaps") > relists, "{text}");

    stop.cancel();
    gw_stop.cancel();
    let _ = tokio::time::timeout(WAIT, gw_task).await;
    tokio::time::timeout(WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
