//! Benchmark 3: the sidecar cache's memory per object against the object's
//! JSON size. Measured two ways in one run:
//!
//! - **in process** (exact): N seeded pods, serialised as the agent sends
//!   them, are applied to a [`Cache`] as one listing; the live bytes of the
//!   counting allocator ([`crate::alloc`]) before and after, divided by the
//!   JSON bytes applied. (RSS is no use here: the allocator reuses what
//!   generating the pods freed.)
//! - **real sidecar** (whole process): `spinlink dev` in front of a cluster
//!   with 0 seeded pods, then with N; the dev process's RSS delta against the
//!   delta of its `/metrics` gauge `spinlink_sidecar_cache_bytes`. This is an
//!   upper bound: the process also holds the agent's and the allocator's
//!   leftovers from the listing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use spinlink_proto::v1;
use spinlink_sidecar::cache::Cache;

use crate::alloc::{live_bytes, rss_of};
use crate::chain::{self, Chain};
use crate::report::Report;

/// Settings of the benchmark.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary.
    pub spinlink: PathBuf,
    /// Pods to cache.
    pub pods: usize,
    /// Also measure the real `spinlink dev` process.
    pub process: bool,
    /// Scratch directory.
    pub dir: PathBuf,
}

/// What the in-process measurement found.
#[derive(Debug, Clone, Copy)]
pub struct InProcess {
    /// JSON bytes applied.
    pub json_bytes: usize,
    /// Live heap bytes the cache added.
    pub heap_bytes: usize,
}

fn pods_kind() -> v1::Kind {
    v1::Kind {
        group: String::new(),
        version: "v1".into(),
        resource: "pods".into(),
        kind: "Pod".into(),
        namespaced: true,
    }
}

/// Applies `pods` seeded pods to a fresh cache and measures what it holds.
/// Needs [`crate::alloc::Counting`] as the global allocator.
pub fn in_process(pods: usize) -> anyhow::Result<InProcess> {
    let events: Vec<v1::WatchEvent> = {
        let sim = spinlink_kube_sim::Sim::new();
        sim.seed_pods(pods)
            .map_err(|s| anyhow::anyhow!("seeding: {}", s.message))?;
        sim.list("pods", None)
            .iter()
            .map(|o| {
                Ok(v1::WatchEvent {
                    r#type: v1::watch_event::Type::Added as i32,
                    kind: Some(pods_kind()),
                    resource_version: o["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    object: serde_json::to_vec(o)?,
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let json_bytes: usize = events.iter().map(|e| e.object.len()).sum();
    let heap0 = live_bytes();
    let mut cache = Cache::default();
    cache.sync_start(&pods_kind());
    for e in &events {
        cache.apply(e).context("applying a seeded pod")?;
    }
    cache.sync_end(&pods_kind(), "");
    let heap1 = live_bytes();
    anyhow::ensure!(
        cache.counts().2 == pods,
        "cache holds {} objects",
        cache.counts().2
    );
    drop(cache);
    Ok(InProcess {
        json_bytes,
        heap_bytes: heap1.saturating_sub(heap0),
    })
}

/// RSS of the dev process and its `spinlink_sidecar_cache_bytes`, once settled.
fn process_figures(opts: &Options, pods: usize) -> anyhow::Result<(u64, u64)> {
    let dir = opts.dir.join(format!("pods-{pods}"));
    std::fs::create_dir_all(&dir)?;
    let chain = Chain::start(&opts.spinlink, &dir, pods)?;
    // Acks and the last pages settle; nothing is waited on but time here, and
    // only the reading after it is used.
    std::thread::sleep(Duration::from_secs(3));
    let cache_bytes = chain::gauge(chain.facade_addr, "spinlink_sidecar_cache_bytes")?;
    let rss = rss_of(&chain.dev.pid().to_string()).context("reading the dev process's RSS")?;
    Ok((rss, cache_bytes))
}

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / 1024.0 / 1024.0)
}

/// Runs the benchmark.
pub fn run(opts: &Options, report: &mut Report) -> anyhow::Result<()> {
    let m = in_process(opts.pods)?;
    report.line(format!(
        "- in process, {} pods: JSON {} ({} bytes per pod); cache heap {} ({} bytes per pod) → **{:.2}× the JSON size**",
        opts.pods,
        mib(m.json_bytes as f64),
        m.json_bytes / opts.pods.max(1),
        mib(m.heap_bytes as f64),
        m.heap_bytes / opts.pods.max(1),
        m.heap_bytes as f64 / m.json_bytes.max(1) as f64,
    ));
    if opts.process {
        let (rss0, bytes0) = process_figures(opts, 0)?;
        let (rss1, bytes1) = process_figures(opts, opts.pods)?;
        let (d_rss, d_bytes) = (rss1 as f64 - rss0 as f64, bytes1 as f64 - bytes0 as f64);
        report.line(format!(
            "- real `spinlink dev` process (agent+gateway+sidecar), 0 vs {} pods: RSS {} → {}, cache_bytes gauge {} → {}; RSS delta / gauge delta = **{:.2}×** (upper bound: includes the agent's and allocator's leftovers from the listing)",
            opts.pods,
            mib(rss0 as f64),
            mib(rss1 as f64),
            mib(bytes0 as f64),
            mib(bytes1 as f64),
            d_rss / d_bytes.max(1.0)
        ));
    }
    Ok(())
}
