//! `spinlink kube-sim`: the simulated Kubernetes API server, on its own
//! (benchmarks, end-to-end tests) or inside `spinlink dev`. Development only:
//! it and its embedded fixtures are in the binary with the `dev` feature
//! (the default for `cargo run`), and left out of the production build.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::{announce, drain};

/// Flags of `spinlink kube-sim`.
#[derive(Debug, clap::Args)]
pub struct KubeSimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write a kubeconfig pointing at the simulator to this file.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Serve HTTPS, as a real API server does (HTTP/2 and HTTP/1.1 offered by
    /// ALPN), with a certificate from the development CA kept in this
    /// directory (made when missing); the kubeconfig written trusts the CA.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Start with an empty cluster instead of the demo workload.
    #[arg(long)]
    empty: bool,
    /// Also create this many pods (namespaces `seed-0`…`seed-9`, labels
    /// `app=app-<i mod 1000>`), for benchmarks.
    #[arg(long, default_value_t = 0)]
    seed_pods: usize,
    /// Also create this many objects spread over ten kinds (pods, configmaps,
    /// secrets, services, deployments, replicasets, serviceaccounts,
    /// endpoints, events and a custom resource), for the agent's benchmarks.
    #[arg(long, default_value_t = 0)]
    seed_objects: usize,
    /// Churn configmaps (create, update, delete) in namespace `churn`, one
    /// write every this many milliseconds; 0 is no churn.
    #[arg(long, default_value_t = 0)]
    churn_interval_millis: u64,
    /// Seed of the churn's random choices.
    #[arg(long, default_value_t = 1)]
    churn_seed: u64,
    /// At most this many churned configmaps exist at once.
    #[arg(long, default_value_t = spinlink_kube_sim::config::DEFAULT_CHURN_MAX_OBJECTS)]
    churn_max_objects: usize,
    /// Churn stops for good once this file exists (tests stop it before
    /// comparing caches with the cluster).
    #[arg(long)]
    churn_stop_file: Option<PathBuf>,
    /// Write events kept for watches to resume from; a watch from an older
    /// resourceVersion gets 410 Expired, as past a real API server's watch
    /// cache window.
    #[arg(long, default_value_t = spinlink_kube_sim::config::DEFAULT_HISTORY)]
    watch_history: usize,
}

/// Runs the simulator until `shutdown`.
pub async fn run(args: KubeSimArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let sim = spinlink_kube_sim::Sim::with_config(
        spinlink_kube_sim::SimConfig::default().history(args.watch_history),
    );
    if !args.empty {
        sim.add_demo_workload();
    }
    if args.seed_pods > 0 {
        sim.seed_pods(args.seed_pods)
            .map_err(|s| anyhow::anyhow!("seeding pods: {}", s.message))?;
    }
    if args.seed_objects > 0 {
        sim.seed_objects(args.seed_objects)
            .map_err(|s| anyhow::anyhow!("seeding objects: {}", s.message))?;
    }
    if args.churn_interval_millis > 0 {
        let config = spinlink_kube_sim::ChurnConfig {
            interval: Duration::from_millis(args.churn_interval_millis),
            seed: args.churn_seed,
            max_objects: args.churn_max_objects,
            ..Default::default()
        };
        let churning = shutdown.child_token();
        sim.spawn_churn(config, churning.clone());
        if let Some(file) = args.churn_stop_file.clone() {
            tokio::spawn(async move {
                while !churning.is_cancelled() && !file.exists() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                churning.cancel();
                println!("churn: stopped");
            });
        }
    }
    let (tls, ca_pem) = match &args.tls_dir {
        Some(dir) => {
            let (config, ca_pem) = kube_sim_tls(dir)?;
            (Some(std::sync::Arc::new(config)), Some(ca_pem))
        }
        None => (None, None),
    };
    let server = spinlink_kube_sim::Server::bind(sim, args.listen, tls)
        .await
        .with_context(|| format!("binding kube-sim to {}", args.listen))?;
    if let Some(path) = &args.kubeconfig_out {
        spinlink_kube_sim::write_kubeconfig(path, &server.url(), "kube-sim", ca_pem.as_deref())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    announce("kube-sim", server.local_addr());
    drain(server.run(shutdown.clone()), &shutdown).await
}

/// kube-sim's TLS configuration from the development CA in `dir` (a
/// `kube-sim` certificate for `localhost`, `127.0.0.1` and `::1`, issued when
/// missing), and the CA's PEM for the kubeconfig. No ALPN here: kube-sim
/// offers HTTP/2 and HTTP/1.1 as the real server does.
pub fn kube_sim_tls(dir: &std::path::Path) -> anyhow::Result<(rustls::ServerConfig, String)> {
    use spinlink_tls::dev::{DevCa, DevPki, Leaf};
    let pki = DevPki::ensure(dir, &[])
        .with_context(|| format!("development PKI in {}", dir.display()))?;
    if !pki.cert("kube-sim").exists() {
        let leaf = Leaf::server("kube-sim")
            .with_dns("localhost")
            .with_ip(std::net::Ipv4Addr::LOCALHOST.into())
            .with_ip(std::net::Ipv6Addr::LOCALHOST.into());
        DevCa::load(dir)
            .and_then(|ca| ca.issue(&leaf))
            .and_then(|issued| issued.write(dir, "kube-sim"))
            .with_context(|| format!("issuing kube-sim's certificate in {}", dir.display()))?;
    }
    let config = spinlink_tls::config::server_config(
        spinlink_tls::config::ServerFiles {
            cert: &pki.cert("kube-sim"),
            key: &pki.key("kube-sim"),
            client_ca: None,
        },
        spinlink_tls::config::ClientAuth::Off,
        &[],
    )
    .context("kube-sim's TLS configuration")?;
    let ca_pem = std::fs::read_to_string(pki.ca_cert())
        .with_context(|| format!("reading {}", pki.ca_cert().display()))?;
    Ok((config, ca_pem))
}
