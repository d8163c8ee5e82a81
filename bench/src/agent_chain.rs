//! The agent in a process of its own, for the agent's benchmarks (issue 3):
//! kube-sim seeded with objects over ten kinds (`--seed-objects N`), a
//! sidecar (plaintext tunnel on loopback), a gateway (mTLS towards agents,
//! from a dev PKI) and the agent, four `spinlink` processes as
//! `tests/e2e_chain.rs` starts them, so the agent's memory can be read from
//! `/proc/PID/status` alone. Also the bounded writer that patches objects at
//! a steady rate. Every wait is bounded; processes are killed on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spinlink_tls::dev::{DevPki, dev_agent_identity};

use crate::chain::{Proc, START_WAIT};

/// The account the agent serves.
pub const ACCOUNT: &str = "bench";
/// The annotation the writer sets to its sequence number.
pub const SEQ_ANNOTATION: &str = "bench.spinlink.dev/seq";
/// The kinds kube-sim's `--seed-objects` spreads objects over, as
/// `(group, resource)` (mirrors `spinlink_kube_sim::seed::SEED_KINDS`).
pub const SEED_KINDS: [(&str, &str); 10] = [
    ("", "pods"),
    ("", "configmaps"),
    ("", "secrets"),
    ("", "services"),
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("", "serviceaccounts"),
    ("", "endpoints"),
    ("", "events"),
    ("bench.spinlink.dev", "widgets"),
];

/// Memory figures of one process, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// Resident set size now (`VmRSS`), bytes.
    pub rss: u64,
    /// Peak resident set size (`VmHWM`), bytes.
    pub hwm: u64,
}

/// `VmRSS` and `VmHWM` of process `pid`.
pub fn memory_of(pid: u32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .context("no value")?
            .parse()?;
        Ok(kb * 1024)
    };
    Ok(Memory {
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
    })
}

/// MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// kube-sim, sidecar and gateway running; the agent started by
/// [`AgentChain::start_agent`].
pub struct AgentChain {
    /// kube-sim.
    pub sim: Proc,
    /// The sidecar.
    pub sidecar: Proc,
    /// The gateway.
    pub gateway: Proc,
    /// The agent, once started.
    pub agent: Option<Proc>,
    /// kube-sim's address (plain HTTP, or HTTPS with [`SimTransport::Tls`]).
    pub sim_addr: SocketAddr,
    /// The sidecar's facade and admin API (plain HTTP).
    pub facade_addr: SocketAddr,
    /// How long kube-sim took to seed (process start to listening).
    pub seed_time: Duration,
    agent_config: PathBuf,
    dir: PathBuf,
    agent_spinlink: PathBuf,
}

/// How kube-sim serves the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimTransport {
    /// Plain HTTP: HTTP/1.1 only, one request per connection at a time.
    Plain,
    /// HTTPS offering HTTP/2 and HTTP/1.1 by ALPN, as a real API server.
    Tls,
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 path")
}

impl AgentChain {
    /// Starts kube-sim with `objects` objects over ten kinds, the sidecar and
    /// the gateway in `dir`, and writes the agent's configuration (`extra` is
    /// appended to it: `cache:`/`tasks:` settings under test).
    pub fn start(
        spinlink: &Path,
        dir: &Path,
        objects: usize,
        extra: &str,
    ) -> anyhow::Result<AgentChain> {
        Self::start_with(spinlink, spinlink, dir, objects, extra, SimTransport::Plain)
    }

    /// [`AgentChain::start`] with kube-sim served over `transport` and the
    /// agent run from `agent_spinlink` (an older build, to compare with).
    pub fn start_with(
        spinlink: &Path,
        agent_spinlink: &Path,
        dir: &Path,
        objects: usize,
        extra: &str,
        transport: SimTransport,
    ) -> anyhow::Result<AgentChain> {
        let p = |path: PathBuf| path.display().to_string();
        let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"])
            .map_err(|e| anyhow::anyhow!("dev PKI: {e}"))?;
        let sim_kubeconfig = dir.join("sim.kubeconfig");
        let t = Instant::now();
        let objects_arg = objects.to_string();
        let sim_pki = dir.join("sim-pki");
        let mut sim_args = vec![
            "kube-sim",
            "--listen",
            "127.0.0.1:0",
            "--empty",
            "--seed-objects",
            &objects_arg,
            "--kubeconfig-out",
            path_str(&sim_kubeconfig)?,
        ];
        if transport == SimTransport::Tls {
            sim_args.extend(["--tls-dir", path_str(&sim_pki)?]);
        }
        let mut sim = Proc::start(spinlink, "kube-sim", dir, &sim_args)?;
        let sim_addr: SocketAddr = sim.wait_line("listening: kube-sim ", START_WAIT)?.parse()?;
        let seed_time = t.elapsed();

        let sidecar_cfg = dir.join("sidecar.yaml");
        std::fs::write(
            &sidecar_cfg,
            format!(
                "instanceId: bench-sidecar\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\n\
                 facade:\n  listen: 127.0.0.1:0\nstore:\n  url: sqlite://{}\n",
                dir.join("sidecar.db").display()
            ),
        )?;
        let mut sidecar = Proc::start(
            spinlink,
            "sidecar",
            dir,
            &["sidecar", "--config", path_str(&sidecar_cfg)?],
        )?;
        let tunnel: SocketAddr = sidecar
            .wait_line("listening: sidecar-tunnel ", START_WAIT)?
            .parse()?;
        let facade_addr: SocketAddr = sidecar
            .wait_line("listening: sidecar-facade ", START_WAIT)?
            .parse()?;

        let gateway_cfg = dir.join("gateway.yaml");
        std::fs::write(
            &gateway_cfg,
            format!(
                "gatewayId: bench-gateway\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
                 policy:\n- identities: [\"{}\"]\n  accounts: [{ACCOUNT}]\nupstreams:\n- url: http://{tunnel}\n",
                p(pki.cert("gateway")),
                p(pki.key("gateway")),
                p(pki.ca_cert()),
                dev_agent_identity("agent-1"),
            ),
        )?;
        let mut gateway = Proc::start(
            spinlink,
            "gateway",
            dir,
            &["gateway", "--config", path_str(&gateway_cfg)?],
        )?;
        let gateway_addr: SocketAddr = gateway
            .wait_line("listening: gateway ", START_WAIT)?
            .parse()?;

        let agent_config = dir.join("agent.yaml");
        std::fs::write(
            &agent_config,
            format!(
                "agentId: agent-1\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
                 kubernetes:\n  accounts:\n  - name: {ACCOUNT}\n    kubeconfigFile: {}\n{extra}",
                gateway_addr.port(),
                p(pki.ca_cert()),
                p(pki.cert("agent-agent-1")),
                p(pki.key("agent-agent-1")),
                sim_kubeconfig.display(),
            ),
        )?;
        Ok(AgentChain {
            sim,
            sidecar,
            gateway,
            agent: None,
            sim_addr,
            facade_addr,
            seed_time,
            agent_config,
            dir: dir.to_owned(),
            agent_spinlink: agent_spinlink.to_owned(),
        })
    }

    /// Starts the agent; returns the moment it was started.
    pub fn start_agent(&mut self) -> anyhow::Result<Instant> {
        let started = Instant::now();
        self.agent = Some(Proc::start(
            &self.agent_spinlink,
            "agent",
            &self.dir,
            &["agent", "--config", path_str(&self.agent_config)?],
        )?);
        Ok(started)
    }

    /// The agent's process id.
    pub fn agent_pid(&self) -> anyhow::Result<u32> {
        Ok(self.agent.as_ref().context("agent not started")?.pid())
    }

    /// Base URL of the account's API through the facade.
    pub fn facade_url(&self) -> String {
        format!("http://{}/accounts/{ACCOUNT}", self.facade_addr)
    }

    /// Objects of the seeded kinds the sidecar caches (from `/v1/accounts`),
    /// and whether every kind finished its listing.
    pub async fn cached(&self) -> anyhow::Result<(u64, bool)> {
        let url = format!("http://{}/v1/accounts/{ACCOUNT}", self.facade_addr);
        let (status, body) = request(&client(), http::Method::GET, &url, None).await?;
        if status != 200 {
            return Ok((0, false));
        }
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        let mut held = 0;
        for k in v["kinds"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let gr = (
                k["group"].as_str().unwrap_or_default(),
                k["resource"].as_str().unwrap_or_default(),
            );
            if SEED_KINDS.contains(&gr) {
                held += k["objects"].as_u64().unwrap_or(0);
            }
        }
        let synced = v["kindsTotal"].as_u64().unwrap_or(0) > 0
            && v["kindsSynced"] == v["kindsTotal"]
            && v["online"] == true;
        Ok((held, synced))
    }

    /// Polls every `poll` until the sidecar holds `objects` seeded objects
    /// and every kind is synced; at most `wait`. Calls `sample` on each poll
    /// (the memory benchmark reads the agent's RSS there).
    pub async fn wait_cached(
        &self,
        objects: u64,
        poll: Duration,
        wait: Duration,
        mut sample: impl FnMut(),
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + wait;
        loop {
            sample();
            let (held, synced) = self.cached().await.unwrap_or((0, false));
            if held >= objects && synced {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the sidecar caches {held} of {objects} objects (synced: {synced}) after {wait:?}"
                );
            }
            tokio::time::sleep(poll).await;
        }
    }
}

/// A plain HTTP/1.1 client with TCP_NODELAY.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client for loopback requests.
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build(connector)
}

/// One request; returns status and body.
pub async fn request(
    client: &HttpClient,
    method: http::Method,
    url: &str,
    merge_patch: Option<String>,
) -> anyhow::Result<(u16, Bytes)> {
    let mut req = http::Request::builder()
        .method(method)
        .uri(url)
        .header(http::header::ACCEPT, "application/json");
    if merge_patch.is_some() {
        req = req.header(http::header::CONTENT_TYPE, "application/merge-patch+json");
    }
    let req = req.body(Full::new(Bytes::from(merge_patch.unwrap_or_default())))?;
    let resp = client.request(req).await.context("sending")?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading")?
        .to_bytes();
    Ok((status, body))
}

/// The path of seeded configmap number `n` (of `objects / 10`): kube-sim's
/// `seed_objects` makes object `i = 10 n + 1` a ConfigMap `config-<i>` in
/// namespace `seed-<n mod 10>`.
pub fn configmap_path(n: usize) -> String {
    let i = n * 10 + 1;
    format!(
        "/api/v1/namespaces/seed-{}/configmaps/config-{i:07}",
        n % 10
    )
}

/// What the writer did.
#[derive(Debug)]
pub struct Written {
    /// When each patch was sent, by sequence number (`None`: failed).
    pub sent: Vec<Option<Instant>>,
    /// From the first scheduled send to the last answer.
    pub wall: Duration,
    /// Patches that failed.
    pub failed: usize,
}

/// Patches `count` seeded configmaps (cycling over `configmaps` of them)
/// straight at kube-sim at a steady `rate` per second, from `workers`
/// kept-alive connections: patch `s` is sent no earlier than `s / rate`
/// seconds after the start and sets [`SEQ_ANNOTATION`] to `s`. Bounded by
/// `count`; when the server cannot keep up, the rate achieved is lower.
pub async fn write(
    sim: SocketAddr,
    configmaps: usize,
    count: usize,
    rate: f64,
    workers: usize,
) -> anyhow::Result<Written> {
    let client = client();
    let next = Arc::new(AtomicUsize::new(0));
    let start = tokio::time::Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (client, next) = (client.clone(), next.clone());
        tasks.spawn(async move {
            let mut sent = Vec::new();
            let mut failed = 0;
            loop {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                if seq >= count {
                    break;
                }
                tokio::time::sleep_until(start + interval * u32::try_from(seq).unwrap_or(u32::MAX))
                    .await;
                let url = format!("http://{sim}{}", configmap_path(seq % configmaps.max(1)));
                let body = format!(
                    "{{\"metadata\":{{\"annotations\":{{\"{SEQ_ANNOTATION}\":\"{seq}\"}}}}}}"
                );
                let t = Instant::now();
                match request(&client, http::Method::PATCH, &url, Some(body)).await {
                    Ok((200, _)) => sent.push((seq, t)),
                    _ => failed += 1,
                }
            }
            (sent, failed)
        });
    }
    let mut sent = vec![None; count];
    let mut failed = 0;
    while let Some(done) = tasks.join_next().await {
        let (s, f) = done?;
        failed += f;
        for (seq, t) in s {
            sent[seq] = Some(t);
        }
    }
    Ok(Written {
        sent,
        wall: start.elapsed(),
        failed,
    })
}
