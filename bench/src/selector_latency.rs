//! Benchmark 2: latency of a LIST with a label selector over N cached pods,
//! through the facade (answered from the sidecar's cache) and the same LIST
//! straight at kube-sim, in the same run, with the bounded load loop of
//! [`crate::load`]. The selector `app=app-7` matches N/1000 pods.

use std::path::PathBuf;
use std::time::Duration;

use crate::chain::Chain;
use crate::load;
use crate::report::Report;
use crate::stats::{ms, percentile};

/// Settings of the benchmark.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary.
    pub spinlink: PathBuf,
    /// Pods in the cluster (all cached by the sidecar).
    pub pods: usize,
    /// Measured requests per side.
    pub requests: usize,
    /// Concurrent connections per side.
    pub concurrency: usize,
    /// Scratch directory.
    pub dir: PathBuf,
}

/// The path of the measured LIST.
pub const PATH: &str = "/api/v1/pods?labelSelector=app%3Dapp-7";

/// Runs the benchmark.
pub fn run(opts: &Options, report: &mut Report) -> anyhow::Result<()> {
    let chain = Chain::start(&opts.spinlink, &opts.dir, opts.pods)?;
    report.line(format!(
        "- setup: kube-sim seeded {} pods in {:.1} s; `spinlink dev` cached them in {:.1} s",
        opts.pods,
        chain.seed_time.as_secs_f64(),
        chain.sync_time.as_secs_f64()
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let sides = [
        (
            "facade (sidecar cache)",
            format!("{}{PATH}", chain.facade_url()),
        ),
        (
            "direct kube-sim (peer, same run)",
            format!("{}{PATH}", chain.sim_url()),
        ),
    ];
    report.line(format!(
        "- request: `GET {PATH}` ({} matching pods), {} requests per side after 10 warm-up, {} connection(s), HTTP/1.1 keep-alive",
        opts.pods / spinlink_kube_sim::seed::SEED_APPS,
        opts.requests,
        opts.concurrency
    ));
    for (side, url) in &sides {
        let r = rt.block_on(load::run(url, opts.requests, opts.concurrency, 10))?;
        let p = |q| percentile(&r.latencies, q).unwrap_or(Duration::ZERO);
        report.line(format!(
            "- {side}: p50 **{}**, p90 {}, p99 **{}**, max {}; {:.0} req/s; {} bytes per answer",
            ms(p(50.0)),
            ms(p(90.0)),
            ms(p(99.0)),
            ms(p(100.0)),
            r.latencies.len() as f64 / r.wall.as_secs_f64().max(1e-9),
            r.body_bytes
        ));
    }
    Ok(())
}
