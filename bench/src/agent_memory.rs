//! The agent's memory at 10,000 and 100,000 objects (issue 3: at most 64 MiB
//! steady, flat in the number of objects). The agent runs in its own process
//! ([`crate::agent_chain`]); its `VmRSS` is read after the initial sync has
//! completed and settled, again after a period of churn (the bounded writer
//! patching configmaps), and `VmHWM` gives the peak. The agent keeps no copy
//! of the cluster, so the figures should depend on its budgets, page size and
//! unacked window, not on the number of objects.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::agent_chain::{AgentChain, Memory, memory_of, mib, write};
use crate::chain::START_WAIT;
use crate::report::Report;
use crate::stats;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary.
    pub spinlink: PathBuf,
    /// Object counts to measure at.
    pub objects: Vec<usize>,
    /// Runs per object count (a fresh chain each).
    pub runs: usize,
    /// How long to let the agent settle after the sync and after churn.
    pub settle: Duration,
    /// Patches per second during the churn period.
    pub churn_rate: f64,
    /// Length of the churn period.
    pub churn: Duration,
    /// Extra agent configuration (`cache:`/`tasks:` YAML) under test.
    pub agent_extra: String,
    /// Scratch directory.
    pub dir: PathBuf,
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Agent start until the sidecar held every object.
    pub sync: Duration,
    /// RSS once synced and settled.
    pub after_sync: u64,
    /// RSS after churn, settled.
    pub after_churn: u64,
    /// Peak RSS (`VmHWM`) over the whole run.
    pub peak: u64,
    /// Patches the churn writer made.
    pub churn_events: usize,
}

/// One run at `objects` objects.
pub fn run_once(opts: &Options, objects: usize, index: usize) -> anyhow::Result<Run> {
    let dir = opts.dir.join(format!("agent-memory-{objects}-{index}"));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut chain = AgentChain::start(&opts.spinlink, &dir, objects, &opts.agent_extra)?;
    let started = chain.start_agent()?;
    let pid = chain.agent_pid()?;
    rt.block_on(chain.wait_cached(
        objects as u64,
        Duration::from_millis(100),
        START_WAIT,
        || {},
    ))?;
    let sync = started.elapsed();
    std::thread::sleep(opts.settle);
    let after_sync = memory_of(pid)?.rss;
    let count = (opts.churn_rate * opts.churn.as_secs_f64()) as usize;
    let written = rt.block_on(write(
        chain.sim_addr,
        objects / 10,
        count,
        opts.churn_rate,
        4,
    ))?;
    // Let the events reach the sidecar, then settle.
    std::thread::sleep(opts.settle);
    let Memory { rss, hwm } = memory_of(pid)?;
    drop(chain);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Run {
        sync,
        after_sync,
        after_churn: rss,
        peak: hwm,
        churn_events: count - written.failed,
    })
}

fn median_u64(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// Runs every object count `runs` times and reports medians.
pub fn run(opts: &Options, report: &mut Report) -> anyhow::Result<()> {
    report.line(format!(
        "- agent settings under test: {}",
        if opts.agent_extra.trim().is_empty() {
            "defaults".to_owned()
        } else {
            format!("`{}`", opts.agent_extra.trim().replace('\n', " "))
        }
    ));
    report.line(format!(
        "- churn: {:.0} configmap patches/s for {:?} straight at kube-sim; settle {:?} before each reading",
        opts.churn_rate, opts.churn, opts.settle
    ));
    report.line(String::new());
    report.line("| objects (10 kinds) | initial sync (median) | RSS after sync | RSS after churn | peak RSS (VmHWM) | runs |");
    report.line("|---|---|---|---|---|---|");
    for &objects in &opts.objects {
        let mut runs = Vec::new();
        for i in 0..opts.runs.max(1) {
            let t = Instant::now();
            let r = run_once(opts, objects, i)?;
            eprintln!(
                "  {objects} objects, run {i}: sync {:.1} s, after sync {}, after churn {} ({} patches), peak {} ({:.0} s)",
                r.sync.as_secs_f64(),
                mib(r.after_sync),
                mib(r.after_churn),
                r.churn_events,
                mib(r.peak),
                t.elapsed().as_secs_f64()
            );
            runs.push(r);
        }
        let syncs: Vec<Duration> = runs.iter().map(|r| r.sync).collect();
        let each = |f: fn(&Run) -> u64| -> String {
            let v: Vec<u64> = runs.iter().map(f).collect();
            format!(
                "**{}** ({})",
                mib(median_u64(&v)),
                v.iter().map(|b| mib(*b)).collect::<Vec<_>>().join(", ")
            )
        };
        report.line(format!(
            "| {objects} | {:.1} s | {} | {} | {} | {} |",
            stats::median(&syncs).unwrap_or_default().as_secs_f64(),
            each(|r| r.after_sync),
            each(|r| r.after_churn),
            each(|r| r.peak),
            runs.len()
        ));
    }
    Ok(())
}
