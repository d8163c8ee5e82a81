//! `spinlink dev`: the whole chain on one machine. It generates a development
//! CA and certificates, starts kube-sim (unless `--kubeconfig` names a real
//! cluster), then a sidecar, a gateway and an agent with mTLS on every hop,
//! all in this process, each built from a configuration file it writes into
//! the state directory so they can be read and reused. Once the account is
//! cached it writes `<state-dir>/kubeconfig` and prints `ready:`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::json;
use spinlink_tls::dev::{DevPki, dev_agent_identity, dev_gateway_identity, dev_sidecar_identity};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The state directory used when none is given.
pub const DEFAULT_STATE_DIR: &str = ".spinlink/dev";
/// The agent id of the development agent.
pub const DEV_AGENT_ID: &str = "dev-agent";
/// Where the sidecar's facade (kubectl's address, and the accounts API
/// `spinlink status` reads) listens by default.
pub const DEFAULT_FACADE_LISTEN: &str = "127.0.0.1:7002";
/// How long to wait for the account to be cached before giving up.
pub const DEFAULT_READY_TIMEOUT_SECS: u64 = 120;

/// Flags of `spinlink dev`.
#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Where certificates, configuration files, the database and the
    /// kubeconfig are written.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Serve this cluster instead of starting the simulated one.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Context of `--kubeconfig` to use (default: its current context).
    #[arg(long, requires = "kubeconfig")]
    context: Option<String>,
    /// Name of the account the cluster is served as.
    #[arg(long, default_value = "dev")]
    account: String,
    /// Address of the gateway's agent listener.
    #[arg(long, default_value = "127.0.0.1:7443")]
    gateway_listen: SocketAddr,
    /// Address of the sidecar's Kubernetes API facade (what kubectl talks to).
    #[arg(long, default_value = DEFAULT_FACADE_LISTEN)]
    facade_listen: SocketAddr,
    /// Address of the simulated cluster, when one is started.
    #[arg(long, default_value = "127.0.0.1:0")]
    kube_sim_listen: SocketAddr,
    /// Seconds to wait for the account to be ready.
    #[arg(long, default_value_t = DEFAULT_READY_TIMEOUT_SECS)]
    ready_timeout: u64,
}

/// Runs the development chain until `shutdown` is cancelled.
pub async fn run(args: DevArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let dir = absolute(&args.state_dir)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pki = DevPki::ensure(&dir.join("pki"), &[DEV_AGENT_ID])
        .context("generating the development PKI")?;
    let mut tasks = JoinSet::new();

    // The cluster: the one given, or a simulated one with a demo workload.
    let (cluster_kubeconfig, context) = match &args.kubeconfig {
        Some(path) => (absolute(path)?, args.context.clone()),
        None => {
            // Over TLS, as a real API server: the agent then speaks HTTP/2
            // to it and carries every watch on one connection.
            let (tls, ca_pem) = super::sim::kube_sim_tls(&dir.join("pki"))?;
            let server = spinlink_kube_sim::Server::bind(
                spinlink_kube_sim::Sim::with_demo_workload(),
                args.kube_sim_listen,
                Some(std::sync::Arc::new(tls)),
            )
            .await
            .with_context(|| format!("binding kube-sim to {}", args.kube_sim_listen))?;
            let path = dir.join("kube-sim.kubeconfig");
            spinlink_kube_sim::write_kubeconfig(&path, &server.url(), "kube-sim", Some(&ca_pem))
                .with_context(|| format!("writing {}", path.display()))?;
            super::announce("kube-sim", server.local_addr());
            let stop = shutdown.clone();
            tasks.spawn(async move { server.run(stop).await.context("kube-sim") });
            (path, None)
        }
    };

    // Sidecar: mTLS tunnel on an ephemeral port serving only the gateway's
    // certificate, facade where kubectl expects it.
    let sidecar_yaml = json!({
        "instanceId": "dev-sidecar",
        "tunnel": {
            "listen": "127.0.0.1:0",
            "tls": {
                "certFile": pki.cert("sidecar"),
                "keyFile": pki.key("sidecar"),
                "clientCaFile": pki.ca_cert(),
                // The agent's certificate chains to the same CA: only the
                // gateway's identity is served.
                "gatewayIdentities": [dev_gateway_identity()],
            },
        },
        "facade": { "listen": args.facade_listen.to_string() },
        "store": { "url": format!("sqlite://{}", dir.join("sidecar.db").display()) },
        // As deployed: another sidecar of this store would forward to, and
        // take accounts over from, this one here, over mutual TLS.
        "peer": {
            "listen": "127.0.0.1:0",
            "tls": {
                "certFile": pki.cert("sidecar-peer"),
                "keyFile": pki.key("sidecar-peer"),
                "caFile": pki.ca_cert(),
                "peerIdentities": [dev_sidecar_identity()],
            },
        },
    });
    let sidecar_cfg =
        spinlink_sidecar::Config::from_file(&write_yaml(&dir, "sidecar.yaml", &sidecar_yaml)?)?;
    let sidecar = spinlink_sidecar::Sidecar::bind(sidecar_cfg)
        .await
        .context("starting the sidecar")?;
    let facade = sidecar.facade_addr();
    let tunnel = sidecar.tunnel_addr();
    let accounts = sidecar.accounts();
    super::announce("sidecar-tunnel", tunnel);
    super::announce("sidecar-facade", facade);
    let stop = shutdown.clone();
    tasks.spawn(async move { sidecar.run(stop).await.context("sidecar") });

    // Gateway: the development agent may serve exactly the dev account.
    let gateway_yaml = json!({
        "gatewayId": "dev-gateway",
        "listen": args.gateway_listen.to_string(),
        "tls": {
            "certFile": pki.cert("gateway"),
            "keyFile": pki.key("gateway"),
            "clientCaFile": pki.ca_cert(),
        },
        "policy": [{
            "identities": [dev_agent_identity(DEV_AGENT_ID)],
            "accounts": [args.account],
        }],
        "upstreams": [{ "url": format!("https://localhost:{}", tunnel.port()) }],
        "upstreamTls": {
            "caFile": pki.ca_cert(),
            "certFile": pki.cert("gateway"),
            "keyFile": pki.key("gateway"),
        },
    });
    let gateway_cfg =
        spinlink_gateway::Config::from_file(&write_yaml(&dir, "gateway.yaml", &gateway_yaml)?)?;
    let gateway = spinlink_gateway::Gateway::bind(gateway_cfg)
        .await
        .context("starting the gateway")?;
    let gateway_addr = gateway.local_addr();
    super::announce("gateway", gateway_addr);
    let stop = shutdown.clone();
    tasks.spawn(async move { gateway.run(stop).await.context("gateway") });

    // Agent: dials the gateway by name so the certificate check is real.
    let mut account = json!({ "name": args.account, "kubeconfigFile": cluster_kubeconfig });
    if let Some(context) = &context {
        account["context"] = json!(context);
    }
    let agent_name = format!("agent-{DEV_AGENT_ID}");
    let agent_yaml = json!({
        "agentId": DEV_AGENT_ID,
        "gateway": {
            "url": format!("https://localhost:{}", gateway_addr.port()),
            "caFile": pki.ca_cert(),
            "certFile": pki.cert(&agent_name),
            "keyFile": pki.key(&agent_name),
        },
        "kubernetes": { "accounts": [account] },
        "admin": { "listen": "127.0.0.1:0" },
    });
    let agent_cfg =
        spinlink_agent::Config::from_file(&write_yaml(&dir, "agent.yaml", &agent_yaml)?)?;
    let agent = spinlink_agent::Agent::new(agent_cfg).context("starting the agent")?;
    if let Some(admin) = agent.admin_addr() {
        super::announce("agent-admin", admin);
    }
    let stop = shutdown.clone();
    tasks.spawn(async move { agent.run(stop).await.context("agent") });

    // Ready once the account's cache is complete and its relay is attached;
    // meanwhile, the initial listing's progress once a second when it moved.
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(args.ready_timeout);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut progress = Progress::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(ended) = tasks.join_next() => {
                shutdown.cancel();
                return match ended {
                    Ok(Ok(())) => bail!("a component stopped before the chain was ready"),
                    Ok(Err(e)) => Err(e),
                    Err(e) => Err(e).context("a component panicked"),
                };
            }
            () = shutdown.cancelled() => return wait_all(tasks).await,
        }
        let status = accounts.status(&args.account);
        if let Some(status) = status.as_ref().filter(|s| s.ready()) {
            println!(
                "synced: {}: {} kinds, {} objects in {:.1}s",
                args.account,
                status.kinds_total,
                status.objects,
                started.elapsed().as_secs_f64()
            );
            break;
        }
        if let Some(line) = status.and_then(|s| progress.line(&args.account, &s)) {
            println!("{line}");
        }
        if tokio::time::Instant::now() >= deadline {
            shutdown.cancel();
            let _ = wait_all(tasks).await;
            bail!(
                "account {:?} was not ready within {}s; see the log above",
                args.account,
                args.ready_timeout
            );
        }
    }
    let kubeconfig = dir.join("kubeconfig");
    write_facade_kubeconfig(&kubeconfig, facade, &[args.account.as_str()])?;
    println!(
        "ready: {} (try: kubectl --kubeconfig {} get pods -A)",
        kubeconfig.display(),
        kubeconfig.display()
    );

    shutdown.cancelled().await;
    wait_all(tasks).await
}

/// Waits for every component to end, within the drain grace.
async fn wait_all(mut tasks: JoinSet<anyhow::Result<()>>) -> anyhow::Result<()> {
    let drained = tokio::time::timeout(super::DEFAULT_DRAIN_GRACE, async {
        let mut first_error = None;
        while let Some(ended) = tasks.join_next().await {
            let result = ended.map_err(anyhow::Error::from).and_then(|r| r);
            if let Err(e) = result {
                tracing::error!("{e:#}");
                first_error.get_or_insert(e);
            }
        }
        first_error
    })
    .await;
    match drained {
        Ok(None) => Ok(()),
        Ok(Some(e)) => Err(e),
        Err(_) => bail!(
            "components did not drain within {:?}",
            super::DEFAULT_DRAIN_GRACE
        ),
    }
}

/// Writes a kubeconfig with one context per account, each pointing at the
/// sidecar's facade for that account.
pub fn write_facade_kubeconfig(
    path: &Path,
    facade: SocketAddr,
    accounts: &[&str],
) -> anyhow::Result<()> {
    let clusters: Vec<_> = accounts
        .iter()
        .map(|a| {
            json!({
                "name": format!("spinlink-{a}"),
                "cluster": { "server": format!("http://{facade}/accounts/{a}") },
            })
        })
        .collect();
    let contexts: Vec<_> = accounts
        .iter()
        .map(|a| json!({ "name": a, "context": { "cluster": format!("spinlink-{a}"), "user": "spinlink" } }))
        .collect();
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "contexts": contexts,
        "current-context": accounts.first().copied().unwrap_or_default(),
        "users": [{ "name": "spinlink", "user": {} }],
        "preferences": {},
    });
    let text = serde_norway::to_string(&config)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn write_yaml(dir: &Path, name: &str, value: &serde_json::Value) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    let text = format!(
        "# Written by `spinlink dev`; rewritten on every start.\n{}",
        serde_norway::to_string(value)?
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

/// The initial listing's progress, said at most once a second and only
/// when it moved: a large cluster takes a while to list, and a newcomer
/// should see it going.
#[derive(Debug, Default)]
struct Progress {
    last: Option<(usize, usize, usize)>,
    said: Option<tokio::time::Instant>,
}

impl Progress {
    fn line(
        &mut self,
        account: &str,
        s: &spinlink_sidecar::accounts::AccountStatus,
    ) -> Option<String> {
        let now = tokio::time::Instant::now();
        let counts = (s.kinds_synced, s.kinds_total, s.objects);
        if self.last == Some(counts) || self.said.is_some_and(|t| now - t < Duration::from_secs(1))
        {
            return None;
        }
        self.last = Some(counts);
        self.said = Some(now);
        Some(format!(
            "syncing: {account}: {}/{} kinds listed, {} objects{}",
            s.kinds_synced,
            s.kinds_total,
            s.objects,
            if s.agent_synced {
                ""
            } else {
                ", more kinds to start"
            }
        ))
    }
}
