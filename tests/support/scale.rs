//! A scaled-out deployment for the end-to-end tests: sidecars sharing one
//! store, gateways behind a [`Balancer`](super::balancer::Balancer), agents —
//! each a separate `spinlink` process that can be drained (SIGTERM), killed
//! (SIGKILL) and started again on the same addresses, as a pod restarted
//! behind a Service would be.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spinlink_tls::dev::{DevPki, dev_agent_identity};

use super::{Proc, try_http};

fn write(dir: &Path, name: &str, text: &str) -> String {
    super::write_file(dir, name, text)
}

fn p(path: PathBuf) -> String {
    path.display().to_string()
}

/// One sidecar instance: a fixed id and, after its first start, fixed
/// tunnel and facade addresses, so the gateways' upstream list and the
/// facade balancer keep reaching it across restarts.
pub struct Sidecar {
    /// Instance id (`instanceId`).
    pub id: String,
    /// The running process, if any.
    pub proc: Option<Proc>,
    /// The tunnel address gateways dial.
    pub tunnel: SocketAddr,
    /// The facade address kubectl reaches.
    pub facade: SocketAddr,
    dir: PathBuf,
    store_url: String,
    lease_seconds: u64,
    starts: usize,
}

impl Sidecar {
    /// Starts instance `id` on ephemeral ports with the store at `store_url`.
    pub fn start(dir: &Path, id: &str, store_url: &str, lease_seconds: u64) -> Sidecar {
        let unbound: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut s = Sidecar {
            id: id.to_owned(),
            proc: None,
            tunnel: unbound,
            facade: unbound,
            dir: dir.to_owned(),
            store_url: store_url.to_owned(),
            lease_seconds,
            starts: 0,
        };
        s.restart();
        s
    }

    fn yaml(&self) -> String {
        format!(
            "instanceId: {}\ntunnel:\n  listen: {}\n  insecure: true\nfacade:\n  listen: {}\n\
             store:\n  url: \"{}\"\nownership:\n  leaseSeconds: {}\n{}",
            self.id,
            self.tunnel,
            self.facade,
            self.store_url,
            self.lease_seconds,
            peer_yaml(&self.dir),
        )
    }

    /// Starts the process again on the same addresses (the previous one must
    /// have exited). A port the kernel has not let go of yet is retried, a
    /// bounded number of times.
    pub fn restart(&mut self) {
        assert!(
            self.proc.as_mut().is_none_or(|p| !p.running()),
            "{} is still running",
            self.id
        );
        for _ in 0..20 {
            self.starts += 1;
            let cfg = write(&self.dir, &format!("{}.yaml", self.id), &self.yaml());
            let name = format!("{}.{}", self.id, self.starts);
            let mut proc = Proc::start(&name, &self.dir, &["sidecar", "--config", &cfg]);
            let (Some(tunnel), Some(facade)) = (
                proc.try_listening("sidecar-tunnel"),
                proc.try_listening("sidecar-facade"),
            ) else {
                eprintln!("{name} did not start; retrying\n{}", proc.log_tail());
                std::thread::sleep(Duration::from_millis(250));
                continue;
            };
            self.tunnel = tunnel;
            self.facade = facade;
            self.proc = Some(proc);
            return;
        }
        panic!("sidecar {} did not start on {}", self.id, self.tunnel);
    }

    /// Whether its process runs.
    pub fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Proc::running)
    }

    /// SIGTERM and wait: the sidecar drains.
    pub fn terminate(&mut self) {
        if let Some(proc) = self.proc.as_mut() {
            let status = proc.terminate();
            eprintln!("{} drained and exited: {status}", proc.name);
        }
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(proc) = self.proc.as_mut() {
            proc.kill();
        }
    }

    /// The logs of every start so far.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                std::fs::read_to_string(self.dir.join(format!("{}.{i}.log", self.id)))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The `peer:` section of sidecars sharing a store in `dir`: mutual TLS
/// with the sidecar identity of a development CA of the sidecars' own
/// (`dir/peer-pki`, made once), on loopback (`allowLoopback`: every sidecar
/// of the store runs on this host).
pub fn peer_yaml(dir: &Path) -> String {
    let dir = dir.join("peer-pki");
    std::fs::create_dir_all(&dir).unwrap();
    let pki = DevPki::ensure(&dir, &[]).unwrap();
    format!(
        "peer:\n  listen: 127.0.0.1:0\n  allowLoopback: true\n  tls:\n    certFile: {}\n    \
         keyFile: {}\n    caFile: {}\n    peerIdentities: [\"{}\"]\n",
        p(pki.cert("sidecar-peer")),
        p(pki.key("sidecar-peer")),
        p(pki.ca_cert()),
        spinlink_tls::dev::dev_sidecar_identity(),
    )
}

/// Sidecars `ids` on `store`, with `lease_seconds` leases.
pub fn start_sidecars(
    dir: &Path,
    store: &super::store::SharedStore,
    ids: &[&str],
    lease_seconds: u64,
) -> Vec<Sidecar> {
    ids.iter()
        .map(|id| Sidecar::start(dir, id, &store.url(id), lease_seconds))
        .collect()
}

/// Who may serve what, for the gateways' policy: (agent name, accounts).
pub type Policy = Vec<(String, Vec<String>)>;

/// A gateway's configuration: dev PKI, `policy`, every sidecar tunnel as a
/// static upstream health-checked every second, and a short drain.
pub fn gateway_yaml(id: &str, pki: &DevPki, policy: &Policy, tunnels: &[SocketAddr]) -> String {
    let mut text = format!(
        "gatewayId: {id}\nlisten: 127.0.0.1:0\nshutdownGraceSeconds: 8\n\
         tls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\npolicy:\n",
        p(pki.cert("gateway")),
        p(pki.key("gateway")),
        p(pki.ca_cert()),
    );
    for (agent, accounts) in policy {
        text.push_str(&format!(
            "- identities: [\"{}\"]\n  accounts: [{}]\n",
            dev_agent_identity(agent),
            accounts.join(", ")
        ));
    }
    text.push_str("upstreams:\n");
    for t in tunnels {
        text.push_str(&format!("- url: http://{t}\n"));
    }
    // Health checks bring instances back; outlier ejection (streams a cut
    // hop broke eject an instance, longer each time) is kept short so that
    // it never outlasts a wait.
    text.push_str(
        "upstreamPool:\n  healthCheck:\n    intervalSeconds: 1\n    unhealthyThreshold: 1\n  \
         outlier:\n    ejectionSeconds: 5\n",
    );
    text
}

/// Starts gateway `name` (a new process name per start) from `yaml`.
pub fn start_gateway(dir: &Path, name: &str, yaml: &str) -> (Proc, SocketAddr) {
    let cfg = write(dir, &format!("{name}.yaml"), yaml);
    let mut proc = Proc::start(name, dir, &["gateway", "--config", &cfg]);
    let addr = proc.listening("gateway");
    (proc, addr)
}

/// An agent's configuration: it dials `gateway_port` on localhost (the
/// balancer) and serves `accounts` (name, kubeconfig).
pub fn agent_yaml(
    agent: &str,
    pki: &DevPki,
    gateway_port: u16,
    accounts: &[(&str, &Path)],
) -> String {
    let mut text = format!(
        "agentId: {agent}\ngateway:\n  url: https://localhost:{gateway_port}\n  caFile: {}\n  \
         certFile: {}\n  keyFile: {}\n\
         reconnect:\n  initialBackoffMillis: 100\n  maxBackoffMillis: 1000\n\
         kubernetes:\n  accounts:\n",
        p(pki.ca_cert()),
        p(pki.cert(&format!("agent-{agent}"))),
        p(pki.key(&format!("agent-{agent}"))),
    );
    for (name, kubeconfig) in accounts {
        text.push_str(&format!(
            "  - name: {name}\n    kubeconfigFile: {}\n",
            kubeconfig.display()
        ));
    }
    text
}

/// Starts agent `name` (a new process name per start) from `yaml`.
pub fn start_agent(dir: &Path, name: &str, yaml: &str) -> Proc {
    let cfg = write(dir, &format!("{name}.yaml"), yaml);
    Proc::start(name, dir, &["agent", "--config", &cfg])
}

/// The sidecar admin API's view of `account` at `facade`, if it answers.
pub fn account(facade: SocketAddr, account: &str) -> Option<serde_json::Value> {
    let (status, body) = try_http(facade, "GET", &format!("/v1/accounts/{account}"), &[])?;
    (status == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

/// Whether `account` is online at `facade` with its relay attached and every
/// kind listed: LISTs of it there are answered from that sidecar's cache.
pub fn ready_at(facade: SocketAddr, name: &str) -> bool {
    account(facade, name).is_some_and(|v| {
        v["online"] == true
            && v["relay"] == true
            && v["agentSynced"] == true
            && v["kindsTotal"].as_u64().unwrap_or(0) > 0
            && v["kindsSynced"] == v["kindsTotal"]
    })
}
