//! `spinlink-bench`: runs one benchmark of issue 5 and prints its result as
//! Markdown for `bench/RESULTS.md`. See `bench/README.md`.
#![allow(unsafe_code)] // only for the `#[global_allocator]` item below; see alloc.rs

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use spinlink_bench::report::Report;
use spinlink_bench::{cache_memory, chain, facade_list, machine, selector_latency};

#[global_allocator]
static ALLOC: spinlink_bench::alloc::Counting = spinlink_bench::alloc::Counting;

#[derive(Debug, Parser)]
#[command(name = "spinlink-bench", about = "spinlink's sidecar benchmarks")]
struct Cli {
    /// The `spinlink` binary to measure (default: the one beside this binary).
    #[arg(long, global = true)]
    spinlink: Option<PathBuf>,
    /// Scratch directory (default: a fresh one under the system temp dir,
    /// removed afterwards).
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// `kubectl get pods -A -o json`, facade vs kube-sim.
    FacadeList {
        /// Pods in the cluster.
        #[arg(long, default_value_t = 10_000)]
        pods: usize,
        /// Measured runs per side.
        #[arg(long, default_value_t = 7)]
        runs: usize,
        /// kubectl binary.
        #[arg(long, default_value = "kubectl")]
        kubectl: PathBuf,
    },
    /// Latency of a label-selector LIST, facade (cache) vs kube-sim.
    SelectorLatency {
        /// Pods in the cluster.
        #[arg(long, default_value_t = 100_000)]
        pods: usize,
        /// Measured requests per side.
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        /// Concurrent connections.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
    },
    /// The gateway's spread of accounts over 3 → 4 → 3 sidecars, and how
    /// many move (a computation: nothing is started).
    Spread {
        /// Accounts.
        #[arg(long, default_value_t = 1000)]
        accounts: usize,
        /// Load factor (`upstreamPool.loadFactor`).
        #[arg(long, default_value_t = 1.25)]
        load_factor: f64,
        /// Seed of the arrival order.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Cache memory per object against its JSON size.
    CacheMemory {
        /// Pods to cache.
        #[arg(long, default_value_t = 100_000)]
        pods: usize,
        /// Skip the measurement of the real `spinlink dev` process.
        #[arg(long)]
        in_process_only: bool,
    },
    /// Issue 4: the gateway against nginx, HAProxy and Envoy (gRPC, mTLS).
    #[command(subcommand)]
    GrpcProxy(spinlink_bench::grpc_proxy::Command),
    /// Issue 19: the gateway, nginx, HAProxy and Envoy under the same
    /// floods: peak memory, CPU, and a legitimate client's success.
    Hostile(spinlink_bench::hostile::Args),
    /// Issue 3: the agent's RSS (own process) after sync and churn, at
    /// several object counts over ten kinds.
    AgentMemory {
        /// Object counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [10_000, 100_000])]
        objects: Vec<usize>,
        /// Runs per object count.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Seconds to settle before each reading.
        #[arg(long, default_value_t = 5)]
        settle: u64,
        /// Configmap patches per second during churn.
        #[arg(long, default_value_t = 1000.0)]
        churn_rate: f64,
        /// Seconds of churn.
        #[arg(long, default_value_t = 20)]
        churn: u64,
        /// Extra agent configuration (YAML appended to its file).
        #[arg(long, default_value = "")]
        agent_extra: String,
    },
    /// Issue 3: the agent's initial sync throughput and a change's latency
    /// through the facade WATCH.
    AgentSync {
        /// Objects in the cluster, over ten kinds.
        #[arg(long, default_value_t = 100_000)]
        objects: usize,
        /// Sync runs (the latency is measured on the last one's chain).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Configmap patches per second.
        #[arg(long, default_value_t = 2000.0)]
        rate: f64,
        /// Seconds of writing.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Writer connections.
        #[arg(long, default_value_t = 8)]
        writers: usize,
        /// Extra agent configuration (YAML appended to its file).
        #[arg(long, default_value = "")]
        agent_extra: String,
    },
    /// Issue 20 (finding 9): the agent's TCP connections to the API server
    /// for a default cluster, over HTTPS (HTTP/2 offered) and plain HTTP.
    AgentConnections {
        /// The agent's binary (default: `--spinlink`): an older build, to
        /// compare with.
        #[arg(long)]
        agent_spinlink: Option<PathBuf>,
        /// Readings after the sync, one a second.
        #[arg(long, default_value_t = 5)]
        samples: usize,
        /// Skip the plain-HTTP comparison.
        #[arg(long)]
        tls_only: bool,
    },
    /// Issues 4 and 6: 1,000 simulated agents through a balancer to 2
    /// gateways and 3 sidecars; gateway RSS per agent connection and the
    /// reconnect storm after a gateway restart.
    AgentStorm(spinlink_bench::agent_storm::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let spinlink = cli.spinlink.clone().unwrap_or_else(chain::default_spinlink);
    let (dir, remove) = match &cli.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("spinlink-bench-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    let machine = machine::describe();
    let result = (|| -> anyhow::Result<Report> {
        Ok(match cli.bench {
            Bench::FacadeList {
                pods,
                runs,
                kubectl,
            } => {
                let mut r =
                    Report::new("kubectl get pods -A -o json: facade vs kube-sim", &command);
                let opts = facade_list::Options {
                    spinlink,
                    kubectl,
                    pods,
                    runs,
                    dir: dir.clone(),
                };
                facade_list::run(&opts, &mut r)?;
                r
            }
            Bench::SelectorLatency {
                pods,
                requests,
                concurrency,
            } => {
                let mut r = Report::new("LIST with a label selector: latency", &command);
                let opts = selector_latency::Options {
                    spinlink,
                    pods,
                    requests,
                    concurrency,
                    dir: dir.clone(),
                };
                selector_latency::run(&opts, &mut r)?;
                r
            }
            Bench::Spread {
                accounts,
                load_factor,
                seed,
            } => {
                let mut r = Report::new("Accounts over sidecars, 3 → 4 → 3", &command);
                spinlink_bench::spread::run(
                    &spinlink_bench::spread::Options {
                        accounts,
                        load_factor,
                        seed,
                    },
                    &mut r,
                );
                r
            }
            Bench::CacheMemory {
                pods,
                in_process_only,
            } => {
                let mut r = Report::new("Cache memory per object", &command);
                let opts = cache_memory::Options {
                    spinlink,
                    pods,
                    process: !in_process_only,
                    dir: dir.clone(),
                };
                cache_memory::run(&opts, &mut r)?;
                r
            }
            Bench::GrpcProxy(cmd) => {
                let mut r = Report::new("Gateway vs peers (issue 4)", &command);
                spinlink_bench::grpc_proxy::command(cmd, spinlink, dir.clone(), &mut r)?;
                r
            }
            Bench::Hostile(args) => {
                let mut r = Report::new("Gateway vs peers under floods (issue 19)", &command);
                spinlink_bench::hostile::command(args, spinlink, dir.clone(), &mut r)?;
                r
            }
            Bench::AgentMemory {
                objects,
                runs,
                settle,
                churn_rate,
                churn,
                agent_extra,
            } => {
                let mut r = Report::new("Agent memory (issue 3)", &command);
                let opts = spinlink_bench::agent_memory::Options {
                    spinlink,
                    objects,
                    runs,
                    settle: std::time::Duration::from_secs(settle),
                    churn_rate,
                    churn: std::time::Duration::from_secs(churn),
                    agent_extra: agent_extra.replace("\\n", "\n"),
                    dir: dir.clone(),
                };
                spinlink_bench::agent_memory::run(&opts, &mut r)?;
                r
            }
            Bench::AgentSync {
                objects,
                runs,
                rate,
                seconds,
                writers,
                agent_extra,
            } => {
                let mut r = Report::new("Agent sync and propagation latency (issue 3)", &command);
                let opts = spinlink_bench::agent_sync::Options {
                    spinlink,
                    objects,
                    runs,
                    rate,
                    duration: std::time::Duration::from_secs(seconds),
                    writers,
                    agent_extra: agent_extra.replace("\\n", "\n"),
                    dir: dir.clone(),
                };
                spinlink_bench::agent_sync::run(&opts, &mut r)?;
                r
            }
            Bench::AgentConnections {
                agent_spinlink,
                samples,
                tls_only,
            } => {
                use spinlink_bench::agent_chain::SimTransport;
                let mut r = Report::new(
                    "Agent connections to the API server (issue 20, finding 9)",
                    &command,
                );
                let mut transports = vec![SimTransport::Tls];
                if !tls_only {
                    transports.push(SimTransport::Plain);
                }
                let opts = spinlink_bench::agent_connections::Options {
                    spinlink,
                    agent_spinlink,
                    transports,
                    samples,
                    dir: dir.clone(),
                };
                spinlink_bench::agent_connections::run(&opts, &mut r)?;
                r
            }
            Bench::AgentStorm(args) => {
                let mut r = Report::new("Agent reconnect storm (issues 4 and 6)", &command);
                spinlink_bench::agent_storm::command(args, spinlink, dir.clone(), &mut r)?;
                r
            }
        })
    })();
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("{}", result?.markdown(&machine));
    Ok(())
}
