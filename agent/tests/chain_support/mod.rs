//! The real chain in one process for the agent's tests: kube-sim, a sidecar,
//! gateways (behind the end-to-end tests' TCP balancer) and agents.
#![allow(dead_code, missing_docs)]

#[path = "../../../tests/support/balancer.rs"]
pub mod balancer;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use spinlink_agent::{Agent, Config};
use spinlink_kube_sim::{Server, Sim};
use spinlink_tls::dev::{DevPki, dev_agent_identity, dev_gateway_identity};
use tokio_util::sync::CancellationToken;

pub const AGENT: &str = "a1";
pub const WAIT: Duration = Duration::from_secs(30);

pub fn write(dir: &Path, name: &str, value: &serde_json::Value) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, value.to_string()).unwrap();
    path
}

pub struct Gateway {
    pub addr: SocketAddr,
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

pub async fn start_gateway(
    dir: &Path,
    pki: &DevPki,
    id: &str,
    sidecar: SocketAddr,
    extra: serde_json::Value,
) -> Gateway {
    let mut config = json!({
        "gatewayId": id,
        "shutdownGraceSeconds": 25,
        "listen": "127.0.0.1:0",
        "tls": {"certFile": pki.cert("gateway"), "keyFile": pki.key("gateway"),
                "clientCaFile": pki.ca_cert()},
        "policy": [{"identities": [dev_agent_identity(AGENT)], "accounts": ["dev"]}],
        "upstreams": [{"url": format!("https://localhost:{}", sidecar.port())}],
        "upstreamTls": {"caFile": pki.ca_cert(), "certFile": pki.cert("gateway"),
                        "keyFile": pki.key("gateway")},
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let config =
        spinlink_gateway::Config::from_file(&write(dir, &format!("{id}.yaml"), &config)).unwrap();
    let gateway = spinlink_gateway::Gateway::bind(config).await.unwrap();
    let addr = gateway.local_addr();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            gateway.run(stop).await.unwrap();
        }
    });
    Gateway { addr, stop, task }
}

pub struct Chain {
    pub _tmp: tempfile::TempDir,
    pub sim: Sim,
    pub accounts: spinlink_sidecar::Accounts,
    pub facade: SocketAddr,
    pub tunnel: SocketAddr,
    pub pki: DevPki,
    pub stop: CancellationToken,
}

pub async fn chain() -> Chain {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &[AGENT]).unwrap();
    let stop = CancellationToken::new();
    let sim = Sim::with_demo_workload();
    for n in 0..4 {
        sim.create(configmap(&format!("cm-{n}"))).unwrap();
    }
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    spinlink_kube_sim::write_kubeconfig(&dir.join("sim.kubeconfig"), &server.url(), "sim", None)
        .unwrap();
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
    let facade = sidecar.facade_addr();
    let accounts = sidecar.accounts();
    tokio::spawn(sidecar.run(stop.clone()));
    Chain {
        _tmp: tmp,
        sim,
        accounts,
        facade,
        tunnel,
        pki,
        stop,
    }
}

impl Chain {
    pub fn dir(&self) -> &Path {
        self._tmp.path()
    }

    pub fn agent(&self, gateway_port: u16) -> Agent {
        self.agent_with(gateway_port, json!({}))
    }

    /// An agent with `extra` top-level keys.
    pub fn agent_with(&self, gateway_port: u16, extra: serde_json::Value) -> Agent {
        let agent_name = format!("agent-{AGENT}");
        let mut config = json!({
            "agentId": AGENT,
            "gateway": {"url": format!("https://localhost:{gateway_port}"),
                "caFile": self.pki.ca_cert(), "certFile": self.pki.cert(&agent_name),
                "keyFile": self.pki.key(&agent_name)},
            // A short spread before following `Reconnect`: the relayed
            // watches these tests follow across a move last a few seconds.
            "reconnect": {"initialBackoffMillis": 50, "maxBackoffMillis": 200,
                "moveSpreadMaxMillis": 500},
            // Secrets are not cached, so the sidecar relays their watches
            // through the agent: the relays these tests follow across moves.
            "kubernetes": {"accounts": [{"name": "dev", "omitKinds": ["Secret"],
                "kubeconfigFile": self.dir().join("sim.kubeconfig")}]},
        });
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        Agent::new(Config::from_yaml_str(&config.to_string(), "agent.yaml").unwrap()).unwrap()
    }

    pub fn cached(&self) -> Vec<String> {
        let Some(account) = self.accounts.get("dev") else {
            return Vec::new();
        };
        let cache = account.read_cache();
        let Some(kind) = cache.kind("", "v1", "configmaps") else {
            return Vec::new();
        };
        let mut names: Vec<String> = kind
            .objects
            .values()
            .map(|e| e.object())
            .filter(|o| o["metadata"]["namespace"] == "demo")
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    pub fn in_sim(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .sim
            .list("configmaps", Some("demo"))
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    /// A GET through the sidecar's facade, on a blocking thread; returns the
    /// status line and the raw (chunked) body.
    pub fn get(&self, path: &str) -> tokio::task::JoinHandle<(String, String)> {
        let facade = self.facade;
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut s = TcpStream::connect(facade).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            write!(
                s,
                "GET /accounts/dev{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
            (
                head.lines().next().unwrap_or("").to_owned(),
                body.to_owned(),
            )
        })
    }
}

/// A Secret whose name shows in a relayed watch of secrets.
pub fn secret(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "demo"}, "data": {"k": "dg=="}})
}

pub fn configmap(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "demo"}, "data": {"k": name}})
}

pub async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of an agent metric line starting with `prefix`.
pub fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

pub const RELISTS: &str = "spinlink_agent_relists_total{account=\"dev\",kind=\"configmaps\"} ";
pub const MOVES: &str = "spinlink_agent_connection_moves_total ";
pub const WATCHES_RELAYED: &str =
    "spinlink_agent_relays_total{account=\"dev\",verb=\"watch\",outcome=\"relayed\"} ";
