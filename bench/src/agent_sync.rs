//! The agent's initial sync throughput and the end-to-end propagation latency
//! of a change (issue 3: p99 at most 50 ms at 2,000 events/s).
//!
//! - **Sync**: objects per second from the agent's start until the sidecar's
//!   admin API (`/v1/accounts/<account>`) counts every seeded object and
//!   every kind synced.
//! - **Latency**: the bounded writer ([`crate::agent_chain::write`]) patches
//!   configmaps at a steady rate, each patch setting an annotation to its
//!   sequence number; a WATCH through the facade
//!   (`?watch=1&resourceVersion=…`) records when each sequence number
//!   arrives. Latency is arrival minus the moment the patch was sent. The
//!   peer is the same WATCH straight at kube-sim, in the same run. Which path
//!   answered the facade's WATCH (the sidecar's cache, or relayed to the
//!   cluster through the agent) is read from the sidecar's
//!   `spinlink_sidecar_facade_requests_total{verb="watch"}` and reported.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};

use crate::agent_chain::{
    AgentChain, HttpClient, SEQ_ANNOTATION, client, memory_of, mib, request, write,
};
use crate::chain::START_WAIT;
use crate::report::Report;
use crate::stats::{self, ms};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary.
    pub spinlink: PathBuf,
    /// Objects in the cluster (over ten kinds).
    pub objects: usize,
    /// Sync runs (a fresh chain each); the latency is measured on the last.
    pub runs: usize,
    /// Patches per second.
    pub rate: f64,
    /// How long the writer writes.
    pub duration: Duration,
    /// Writer connections.
    pub writers: usize,
    /// Extra agent configuration under test.
    pub agent_extra: String,
    /// Scratch directory.
    pub dir: PathBuf,
}

/// Arrival times by sequence number, shared with a watch task.
type Arrivals = Arc<Mutex<HashMap<usize, Instant>>>;

/// Follows a WATCH at `url` until `stop`, recording when each sequence
/// number first arrives.
async fn follow(
    client: HttpClient,
    url: String,
    arrivals: Arrivals,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let req = http::Request::get(&url)
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::new()))?;
    let resp = client.request(req).await.context("watch request")?;
    if !resp.status().is_success() {
        bail!("{url}: {}", resp.status());
    }
    let _ = ready.send(());
    let mut body = resp.into_body();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.context("watch body")?.into_data() else {
            continue;
        };
        let now = Instant::now();
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let Ok(event) = serde_json::from_slice::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(seq) = event["object"]["metadata"]["annotations"][SEQ_ANNOTATION]
                .as_str()
                .and_then(|s| s.parse().ok())
            {
                arrivals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(seq)
                    .or_insert(now);
            }
        }
    }
    Ok(())
}

/// The list resourceVersion of configmaps at `base`.
async fn list_rv(client: &HttpClient, base: &str) -> anyhow::Result<String> {
    let (status, body) = request(
        client,
        http::Method::GET,
        &format!("{base}/api/v1/configmaps?limit=1"),
        None,
    )
    .await?;
    if status != 200 {
        bail!("LIST configmaps at {base}: {status}");
    }
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    v["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_owned)
        .context("no list resourceVersion")
}

/// The facade's WATCH answers by source, from the sidecar's `/metrics`.
async fn watch_sources(client: &HttpClient, chain: &AgentChain) -> anyhow::Result<String> {
    let url = format!("http://{}/metrics", chain.facade_addr);
    let (_, body) = request(client, http::Method::GET, &url, None).await?;
    let text = String::from_utf8_lossy(&body);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("spinlink_sidecar_facade_requests_total") && l.contains("verb=\"watch\"")
        })
        .collect();
    Ok(if lines.is_empty() {
        "none counted".to_owned()
    } else {
        lines.join("; ")
    })
}

fn percentiles(samples: &[Duration]) -> String {
    let p = |q| stats::percentile(samples, q).map_or("-".into(), ms);
    format!(
        "p50 **{}**, p90 {}, p99 **{}**, max {}",
        p(50.0),
        p(90.0),
        p(99.0),
        p(100.0)
    )
}

/// Sync runs, then the latency on the last run's chain.
pub fn run(opts: &Options, report: &mut Report) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut syncs = Vec::new();
    let mut chain = None;
    for i in 0..opts.runs.max(1) {
        let dir = opts.dir.join(format!("agent-sync-{i}"));
        std::fs::create_dir_all(&dir)?;
        drop(chain.take()); // the previous run's processes go first
        let mut c = AgentChain::start(&opts.spinlink, &dir, opts.objects, &opts.agent_extra)?;
        let started = c.start_agent()?;
        rt.block_on(c.wait_cached(
            opts.objects as u64,
            Duration::from_millis(20),
            START_WAIT,
            || {},
        ))?;
        let took = started.elapsed();
        eprintln!(
            "  run {i}: {} objects in {:.2} s ({:.0}/s), seeding took {:.1} s",
            opts.objects,
            took.as_secs_f64(),
            opts.objects as f64 / took.as_secs_f64(),
            c.seed_time.as_secs_f64()
        );
        syncs.push(took);
        chain = Some(c);
    }
    let chain = chain.context("no run")?;
    let median = stats::median(&syncs).unwrap_or_default();
    report.line(format!(
        "- initial sync of {} objects over 10 kinds (agent start → the sidecar counts all, every kind synced): median **{:.2} s** = **{:.0} objects/s** over {} runs ({})",
        opts.objects,
        median.as_secs_f64(),
        opts.objects as f64 / median.as_secs_f64(),
        syncs.len(),
        syncs
            .iter()
            .map(|d| format!("{:.2} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    ));

    // Latency on the last chain.
    let count = (opts.rate * opts.duration.as_secs_f64()) as usize;
    let (facade, direct, written, sources) = rt.block_on(async {
        let client = client();
        let facade_base = chain.facade_url();
        let sim_base = format!("http://{}", chain.sim_addr);
        let mut arrivals = Vec::new();
        let mut watches = Vec::new();
        for base in [&facade_base, &sim_base] {
            let rv = list_rv(&client, base).await?;
            let url = format!("{base}/api/v1/configmaps?watch=1&resourceVersion={rv}");
            let seen: Arrivals = Arc::default();
            let (tx, rx) = tokio::sync::oneshot::channel();
            watches.push(tokio::spawn(follow(client.clone(), url, seen.clone(), tx)));
            tokio::time::timeout(Duration::from_secs(30), rx)
                .await
                .context("watch did not start")?
                .context("watch failed to start")?;
            arrivals.push(seen);
        }
        let written = write(
            chain.sim_addr,
            opts.objects / 10,
            count,
            opts.rate,
            opts.writers,
        )
        .await?;
        // Bounded wait for the stragglers.
        let deadline = Instant::now() + Duration::from_secs(15);
        let sent = written.sent.iter().filter(|s| s.is_some()).count();
        while Instant::now() < deadline
            && arrivals
                .iter()
                .any(|a| a.lock().unwrap_or_else(|p| p.into_inner()).len() < sent)
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for w in &watches {
            w.abort();
        }
        let sources = watch_sources(&client, &chain).await?;
        let latencies = |a: &Arrivals| -> (Vec<Duration>, usize) {
            let a = a.lock().unwrap_or_else(|p| p.into_inner());
            let mut out = Vec::new();
            let mut missing = 0;
            for (seq, sent) in written.sent.iter().enumerate() {
                if let Some(sent) = sent {
                    match a.get(&seq) {
                        Some(at) => out.push(at.saturating_duration_since(*sent)),
                        None => missing += 1,
                    }
                }
            }
            (out, missing)
        };
        let facade = latencies(&arrivals[0]);
        let direct = latencies(&arrivals[1]);
        anyhow::Ok((facade, direct, written, sources))
    })?;
    let agent = memory_of(chain.agent_pid()?)?;
    let achieved = (count - written.failed) as f64 / written.wall.as_secs_f64();
    report.line(format!(
        "- writer: {count} configmap patches (merge patch of an annotation carrying the sequence number) straight at kube-sim over {} connections, asked {:.0}/s, achieved **{achieved:.0}/s** ({} failed)",
        opts.writers, opts.rate, written.failed
    ));
    report.line(format!(
        "- facade WATCH `/accounts/bench/api/v1/configmaps?watch=1&resourceVersion=…`: {} ({} of {} changes seen, {} missing)",
        percentiles(&facade.0),
        facade.0.len(),
        facade.0.len() + facade.1,
        facade.1
    ));
    report.line(format!(
        "- peer, same WATCH straight at kube-sim, same run: {} ({} missing)",
        percentiles(&direct.0),
        direct.1
    ));
    report.line(format!(
        "- which path answered the facade WATCH (sidecar `/metrics`): `{sources}`"
    ));
    report.line(format!(
        "- agent RSS after this: {} (peak {})",
        mib(agent.rss),
        mib(agent.hwm)
    ));
    Ok(())
}
