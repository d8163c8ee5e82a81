//! `spinlink`: the one binary. Each subcommand parses its configuration,
//! builds its component from the libraries, runs it, and drains it on SIGTERM
//! or Ctrl-C. All logic lives in the component crates; start with [`dev`] to
//! see how they fit together.
#![forbid(unsafe_code)]

#[cfg(feature = "dev")]
mod dev;
mod signal;
#[cfg(feature = "dev")]
mod sim;
mod status;

use std::io::IsTerminal as _;
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
    #[cfg(feature = "dev")]
    KubeSim(sim::KubeSimArgs),
    /// Run kube-sim, sidecar, gateway and agent together with mTLS on, and
    /// write a kubeconfig that reaches the cluster through the whole chain.
    #[cfg(feature = "dev")]
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
    // Colours only for a person at a terminal: a log collector stores the
    // escape codes as they are, and writing them costs time per line.
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
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
            if let Some(admin) = agent.admin_addr() {
                announce("agent-admin", admin);
            }
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
            if let Some(admin) = gateway.admin_addr() {
                announce("gateway-admin", admin);
            }
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
        #[cfg(feature = "dev")]
        Command::KubeSim(args) => sim::run(args, shutdown).await,
        #[cfg(feature = "dev")]
        Command::Dev(args) => dev::run(args, shutdown).await,
        Command::Status(_) => unreachable!("handled in main"),
        Command::Nginx(NginxCommand::Convert { file, lenient }) => {
            print!("{}", nginx_to_gateway_yaml(&file, lenient)?);
            Ok(())
        }
    }
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
