//! Benchmark 1: `kubectl get pods -A -o json` over N pods, through the facade
//! (served from the sidecar's cache) and straight at kube-sim, in the same
//! run, alternating sides so drift in the machine's load hits both alike.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::chain::Chain;
use crate::load;
use crate::report::Report;
use crate::stats::{median, ms};

/// Settings of the benchmark.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary.
    pub spinlink: PathBuf,
    /// The kubectl to run.
    pub kubectl: PathBuf,
    /// Pods in the cluster.
    pub pods: usize,
    /// Measured runs per side (after one warm-up each).
    pub runs: usize,
    /// Scratch directory (kubeconfigs, logs, kubectl homes).
    pub dir: PathBuf,
}

/// One kubectl run: its time, the items it printed and the bytes.
fn kubectl_get(
    kubectl: &Path,
    home: &Path,
    kubeconfig: &Path,
) -> anyhow::Result<(Duration, usize, usize)> {
    let t = Instant::now();
    let out = Command::new(kubectl)
        .env("HOME", home)
        .env("KUBECACHEDIR", home.join("cache"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "pods", "-A", "-o", "json"])
        .output()
        .with_context(|| format!("running {}", kubectl.display()))?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("kubectl failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("kubectl printed no JSON")?;
    let items = v["items"].as_array().map_or(0, Vec::len);
    Ok((took, items, out.stdout.len()))
}

/// Runs the benchmark.
pub fn run(opts: &Options, report: &mut Report) -> anyhow::Result<()> {
    let chain = Chain::start(&opts.spinlink, &opts.dir, opts.pods)?;
    report.line(format!(
        "- setup: kube-sim seeded {} pods in {:.1} s; `spinlink dev` cached them in {:.1} s",
        opts.pods,
        chain.seed_time.as_secs_f64(),
        chain.sync_time.as_secs_f64()
    ));
    let sides = [
        ("facade", chain.facade_kubeconfig.clone()),
        ("direct", chain.sim_kubeconfig.clone()),
    ];
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut sizes = [0usize; 2];
    for round in 0..=opts.runs {
        for (i, (side, kubeconfig)) in sides.iter().enumerate() {
            let home = opts.dir.join(format!("home-{side}"));
            std::fs::create_dir_all(&home)?;
            let (took, items, bytes) = kubectl_get(&opts.kubectl, &home, kubeconfig)?;
            if items != opts.pods {
                bail!(
                    "{side}: kubectl listed {items} pods, expected {}",
                    opts.pods
                );
            }
            sizes[i] = bytes;
            // Round 0 warms kubectl's discovery cache and the servers.
            if round > 0 {
                times[i].push(took);
            }
        }
    }
    let (f, d) = (
        median(&times[0]).unwrap_or_default(),
        median(&times[1]).unwrap_or_default(),
    );
    let list = |v: &[Duration]| v.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ");
    report.line(format!(
        "- through the facade: median **{}** over {} runs ({}); output {} bytes",
        ms(f),
        times[0].len(),
        list(&times[0]),
        sizes[0]
    ));
    report.line(format!(
        "- directly against kube-sim (peer, same run): median **{}** over {} runs ({}); output {} bytes",
        ms(d),
        times[1].len(),
        list(&times[1]),
        sizes[1]
    ));
    report.line(format!(
        "- ratio facade / direct: **{:.2}**",
        f.as_secs_f64() / d.as_secs_f64().max(1e-9)
    ));
    // The same LIST without kubectl, whose decoding and printing dominate
    // the times above: what the servers themselves take, paged as kubectl
    // pages (`limit=500`; the facade answers everything at once from the
    // cache, kube-sim page by page).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut medians = Vec::new();
    for (side, base) in [("facade", chain.facade_url()), ("direct", chain.sim_url())] {
        let url = format!("{base}/api/v1/pods");
        let mut times = Vec::new();
        let (mut pages, mut bytes) = (0, 0);
        for round in 0..=opts.runs {
            let (took, p, b) = rt.block_on(load::list_all(&url, 500, 10_000))?;
            (pages, bytes) = (p, b);
            if round > 0 {
                times.push(took);
            }
        }
        let m = median(&times).unwrap_or_default();
        medians.push(m);
        report.line(format!(
            "- `GET /api/v1/pods?limit=500` and its continues, no kubectl, {side}: median {} over {} runs ({pages} requests, {bytes} bytes)",
            ms(m),
            times.len()
        ));
    }
    report.line(format!(
        "- ratio facade / direct without kubectl: {:.2}",
        medians[0].as_secs_f64() / medians[1].as_secs_f64().max(1e-9)
    ));
    Ok(())
}
