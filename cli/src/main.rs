//! `spinlink`: the one binary. Each subcommand parses its configuration,
//! builds its component from the libraries, runs it, and drains it on SIGTERM
//! or Ctrl-C. All logic lives in the component crates; start with [`dev`] to
//! see how they fit together.
#![forbid(unsafe_code)]

mod dev;
mod signal;
mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

/// How long a component may take to drain after a shutdown signal.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Parser)]
#[command(
    name = "spinlink",
    version,
    about = "Connects Spinnaker to private Kubernetes clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: watch clusters and dial out to a gateway.
    Agent(AgentArgs),
    /// Run the gateway: the mTLS edge agents dial (and, with an ingress, the
    /// front door for Spinnaker's UI and API).
    Gateway {
        /// Gateway configuration file (YAML).
        #[arg(
            long,
            short,
            required_unless_present = "nginx_config",
            conflicts_with = "nginx_config"
        )]
        config: Option<PathBuf>,
        /// Run from an nginx configuration file instead (docs/ingress.md).
        #[arg(long)]
        nginx_config: Option<PathBuf>,
        /// With `--nginx-config`: directives outside the subset are warnings
        /// and skipped rather than errors.
        #[arg(long, requires = "nginx_config")]
        lenient: bool,
        /// Load and validate the configuration, then exit.
        #[arg(long)]
        check_config: bool,
    },
    /// nginx configuration tools.
    #[command(subcommand)]
    Nginx(NginxCommand),
    /// Run the sidecar: cache clusters and serve them to Clouddriver and kubectl.
    Sidecar {
        /// Sidecar configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
        /// The URL the other sidecars of the store reach this one's peer
        /// port at, replacing `peer.advertiseUrl`: per pod, so not in the
        /// ConfigMap the pods share (the chart passes
        /// `https://$(POD_IP):7011`, the downward API's `status.podIP`).
        #[arg(long, env = "SPINLINK_PEER_ADVERTISE_URL")]
        peer_advertise_url: Option<String>,
        /// Names this sidecar, replacing `instanceId`: unique among the
        /// sidecars sharing a store, so per pod (the chart sets
        /// `SPINLINK_INSTANCE_ID` from the downward API's `metadata.name`).
        #[arg(long, env = "SPINLINK_INSTANCE_ID")]
        instance_id: Option<String>,
        /// Load and validate the configuration, then exit.
        #[arg(long)]
        check_config: bool,
    },
    /// Run the simulated Kubernetes API server.
    KubeSim(KubeSimArgs),
    /// Run kube-sim, sidecar, gateway and agent together with mTLS on, and
    /// write a kubeconfig that reaches the cluster through the whole chain.
    Dev(dev::DevArgs),
    /// Show every account and agent a sidecar knows, kubectl-style; exits
    /// non-zero when any account is unhealthy.
    Status(status::StatusArgs),
}

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct AgentArgs {
    #[command(subcommand)]
    command: Option<AgentCommand>,
    /// Agent configuration file (YAML): spinlink's, or an Armory Scale
    /// Agent's `armory-agent.yml` as it is (its `armory-agent-local.yaml`
    /// beside it is read on top).
    #[arg(long, short, required = true)]
    config: Option<PathBuf>,
    /// Load and validate the configuration, then exit.
    #[arg(long)]
    check_config: bool,
}

#[derive(Debug, Subcommand)]
enum AgentCommand {
    /// Print the native configuration equivalent to an Armory Scale Agent
    /// file (with its local override); what it drops goes to stderr.
    MigrateConfig {
        /// The Armory agent's configuration file.
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum NginxCommand {
    /// Print the gateway configuration (YAML) that serves an nginx config.
    Convert {
        /// The nginx configuration file.
        file: PathBuf,
        /// Directives outside the subset are warnings and skipped.
        #[arg(long)]
        lenient: bool,
    },
}

#[derive(Debug, clap::Args)]
struct KubeSimArgs {
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

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // `status` says how things stand with its exit code, not an error.
    if let Command::Status(args) = cli.command {
        return Ok(runtime.block_on(status::run(args)));
    }
    runtime.block_on(run(cli.command))?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SPINLINK_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(command: Command) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    signal::cancel_on_signal(shutdown.clone());
    match command {
        Command::Agent(AgentArgs {
            command: Some(AgentCommand::MigrateConfig { file }),
            ..
        }) => {
            print!("{}", migrate_agent_config(&file)?);
            Ok(())
        }
        Command::Agent(AgentArgs {
            command: None,
            config,
            check_config,
        }) => {
            let config = config.context("--config is required")?;
            let loaded = spinlink_agent::Config::load(&config)?;
            for warning in &loaded.warnings {
                if check_config {
                    eprintln!("warning: {warning}");
                } else {
                    tracing::warn!("{warning}");
                }
            }
            if check_config {
                println!("ok: {}", loaded.config.origin);
                return Ok(());
            }
            let agent = spinlink_agent::Agent::new(loaded.config)?;
            drain(agent.run(shutdown.clone()), &shutdown).await
        }
        Command::Gateway {
            config,
            nginx_config,
            lenient,
            check_config,
        } => {
            let (cfg, origin) = match (config, nginx_config) {
                (Some(config), _) => (
                    spinlink_gateway::Config::from_file(&config)?,
                    config.display().to_string(),
                ),
                (None, Some(file)) => {
                    let yaml = nginx_to_gateway_yaml(&file, lenient)?;
                    let origin = file.display().to_string();
                    (
                        spinlink_gateway::Config::from_yaml_str(&yaml, &origin)?,
                        origin,
                    )
                }
                (None, None) => anyhow::bail!("--config or --nginx-config is required"),
            };
            spinlink_gateway::Gateway::check(&cfg)?;
            if check_config {
                println!("ok: {origin}");
                return Ok(());
            }
            let gateway = spinlink_gateway::Gateway::bind(cfg).await?;
            announce("gateway", gateway.local_addr());
            drain(gateway.run(shutdown.clone()), &shutdown).await
        }
        Command::Sidecar {
            config,
            peer_advertise_url,
            instance_id,
            check_config,
        } => {
            let cfg = spinlink_sidecar::Config::from_file_with(
                &config,
                &spinlink_sidecar::config::Overrides {
                    peer_advertise_url,
                    instance_id,
                },
            )?;
            cfg.validate()?;
            if check_config {
                println!("ok: {}", config.display());
                return Ok(());
            }
            let sidecar = spinlink_sidecar::Sidecar::bind(cfg).await?;
            announce("sidecar-tunnel", sidecar.tunnel_addr());
            announce("sidecar-facade", sidecar.facade_addr());
            if let Some(peer) = sidecar.peer_addr() {
                announce("sidecar-peer", peer);
            }
            if let Some(metrics) = sidecar.metrics_addr() {
                announce("sidecar-metrics", metrics);
            }
            drain(sidecar.run(shutdown.clone()), &shutdown).await
        }
        Command::KubeSim(args) => {
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
                spinlink_kube_sim::write_kubeconfig(
                    path,
                    &server.url(),
                    "kube-sim",
                    ca_pem.as_deref(),
                )
                .with_context(|| format!("writing {}", path.display()))?;
            }
            announce("kube-sim", server.local_addr());
            drain(server.run(shutdown.clone()), &shutdown).await
        }
        Command::Dev(args) => dev::run(args, shutdown).await,
        Command::Status(_) => unreachable!("handled in main"),
        Command::Nginx(NginxCommand::Convert { file, lenient }) => {
            print!("{}", nginx_to_gateway_yaml(&file, lenient)?);
            Ok(())
        }
    }
}

/// kube-sim's TLS configuration from the development CA in `dir` (a
/// `kube-sim` certificate for `localhost`, `127.0.0.1` and `::1`, issued when
/// missing), and the CA's PEM for the kubeconfig. No ALPN here: kube-sim
/// offers HTTP/2 and HTTP/1.1 as the real server does.
fn kube_sim_tls(dir: &std::path::Path) -> anyhow::Result<(rustls::ServerConfig, String)> {
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

/// Reads an nginx configuration and returns the gateway configuration that
/// serves it; warnings go to stderr.
fn nginx_to_gateway_yaml(file: &std::path::Path, lenient: bool) -> anyhow::Result<String> {
    let options = spinlink_nginx_compat::Options::new().lenient(lenient);
    let parsed = spinlink_nginx_compat::load(file, &options)?;
    for w in &parsed.warnings {
        eprintln!("warning: {w}");
    }
    // nginx's conf prefix: the main file's directory.
    let dir = std::path::absolute(file)?
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    spinlink_gateway::ingress::from_nginx::config_yaml(&parsed.ingress, &dir)
        .map_err(|e| anyhow::anyhow!("{}: ingress.{e}", file.display()))
}

/// The native agent configuration equivalent to an Armory agent's file, as
/// YAML; what it drops is said on stderr.
fn migrate_agent_config(file: &std::path::Path) -> anyhow::Result<String> {
    let sources = spinlink_agent::config::Sources::read(file)?;
    let converted = sources.armory_to_native()?.with_context(|| {
        format!(
            "{}: already a spinlink agent configuration (it has native keys)",
            file.display()
        )
    })?;
    for warning in &converted.warnings {
        eprintln!("dropped: {warning}");
    }
    if let Some(id) = converted.native.get("agentId").and_then(|v| v.as_str()) {
        eprintln!(
            "note: agentId is {id:?} (HOSTNAME, as when the agent runs the Armory file); \
             give each agent its own"
        );
    }
    Ok(serde_norway::to_string(&converted.native)?)
}

/// Prints the line tests and scripts read to find a listener.
fn announce(what: &str, addr: SocketAddr) {
    println!("listening: {what} {addr}");
}

/// Runs a component until it ends; once shutdown is signalled, gives it
/// [`DEFAULT_DRAIN_GRACE`] to finish.
async fn drain<F, E>(component: F, shutdown: &CancellationToken) -> anyhow::Result<()>
where
    F: std::future::Future<Output = Result<(), E>>,
    E: Into<anyhow::Error>,
{
    tokio::pin!(component);
    tokio::select! {
        result = &mut component => return result.map_err(Into::into),
        () = shutdown.cancelled() => {}
    }
    match tokio::time::timeout(DEFAULT_DRAIN_GRACE, component).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => anyhow::bail!("did not drain within {DEFAULT_DRAIN_GRACE:?}"),
    }
}
