//! Issue 4: the gateway against real proxies, side by side in one run. The
//! same tonic echo backend ([`crate::grpc_echo`]) sits behind the gateway
//! (its agent path: `Hello`, then `Relay`/`Cache` streams carried to the
//! backend standing in as the sidecar), nginx, HAProxy and Envoy
//! ([`crate::grpc_peers`]), and is also hit directly. All fronts use TLS 1.3
//! with a required client certificate and HTTP/2; all reach the backend over
//! h2c. The load ([`crate::grpc_wire`]) is the same for every target.
//!
//! Measures, each bounded by a duration or a count, repeated `runs` times
//! with the targets in rotating order, medians reported:
//! bidi echo messages/s, unary requests/s with 32 in flight, unary latency
//! with 1 in flight, new mTLS connections/s, and RSS per idle connection
//! with one open stream (2,000 connections) with the upstream connections
//! each proxy used for them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use prost::Message as _;
use spinlink_proto::paths;
use spinlink_tls::dev::DevPki;

use crate::chain::Proc;
use crate::grpc_peers::{self as peers, Front, Kind, Peers, path};
use crate::grpc_wire::{Conn, Dialer, frame};
use crate::report::Report;
use crate::stats;

/// What to run and how long.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary (the gateway).
    pub spinlink: PathBuf,
    /// nginx, HAProxy and Envoy binaries.
    pub peers: Peers,
    /// Scratch directory: PKI, configurations, logs.
    pub dir: PathBuf,
    /// Rounds of every throughput/latency measure.
    pub runs: usize,
    /// Length of one throughput measurement.
    pub seconds: f64,
    /// Concurrent bidi streams.
    pub bidi_streams: usize,
    /// Connections the bidi streams are spread over.
    pub bidi_conns: usize,
    /// Payload bytes per message.
    pub payload: usize,
    /// Unary requests in flight for the throughput measure.
    pub unary_inflight: usize,
    /// Connections they are spread over.
    pub unary_conns: usize,
    /// Requests per latency run (1 in flight), after 200 warm-up ones.
    pub latency_requests: usize,
    /// Concurrent connect loops of the handshake measure.
    pub handshake_concurrency: usize,
    /// Idle connections of the memory measure (0 skips it).
    pub idle_conns: usize,
}

/// One thing measured: the backend directly or a proxy in front of it.
struct Target {
    name: &'static str,
    dialer: Dialer,
    /// Processes whose memory and upstream sockets count (none for direct).
    pid: Option<u32>,
}

impl Target {
    fn pids(&self) -> Vec<u32> {
        self.pid.map(peers::process_tree).unwrap_or_default()
    }
}

/// Runs everything and reports.
pub fn run(opts: &Options, r: &mut Report) -> anyhow::Result<()> {
    raise_nofile();
    let pki = DevPki::ensure(&opts.dir.join("pki"), &[crate::grpc_wire::AGENT_ID])?;
    let dir = &opts.dir;
    let me = std::env::current_exe()?;
    let mut echo = Proc::start(&me, "echo", dir, &crate::grpc_echo::args(dir, &pki.dir)?)?;
    let echo_h2c: SocketAddr = echo
        .wait_line("listening: echo-h2c ", peers::START_WAIT)?
        .parse()?;
    let echo_tls: SocketAddr = echo
        .wait_line("listening: echo-tls ", peers::START_WAIT)?
        .parse()?;

    let mut targets = vec![Target {
        name: "direct",
        dialer: Dialer::new(&pki, echo_tls, false)?,
        pid: None,
    }];
    // The floor: a process that only copies bytes (no TLS, no HTTP/2) in
    // front of the TLS backend. What it adds is what any proxy pays for the
    // extra hop on this machine before doing any work.
    let mut passthrough = Proc::start(
        &me,
        "passthrough",
        dir,
        &[
            "--dir",
            path(dir)?,
            "grpc-proxy",
            "passthrough",
            "--to",
            &echo_tls.to_string(),
        ],
    )?;
    let passthrough_addr: SocketAddr = passthrough
        .wait_line("listening: passthrough ", peers::START_WAIT)?
        .parse()?;
    targets.push(Target {
        name: "tcp-passthrough",
        dialer: Dialer::new(&pki, passthrough_addr, false)?,
        pid: Some(passthrough.pid()),
    });
    let mut fronts = Vec::new();
    let mut versions = Vec::new();
    let gateway = |listen| peers::gateway_yaml(&pki, listen, echo_h2c, true);
    for (kind, bin) in opts.peers.fronts(&opts.spinlink) {
        let front = Front::start(kind, &bin, &pki, dir, echo_h2c, &gateway)?;
        if kind != Kind::Gateway {
            versions.push(front.version.clone());
        }
        targets.push(Target {
            name: kind.name(),
            dialer: Dialer::new(&pki, front.addr, kind == Kind::Gateway)?,
            pid: Some(front.pid()),
        });
        fronts.push(front);
    }

    // The load generator: its own runtime on both cores, as the proxies have.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let msg = echo_message(opts.payload);

    r.line(format!(
        "- peers: {}; all fronts TLS 1.3 only (the load offers nothing else), client certificate required (dev CA, ECDSA P-256), HTTP/2 by ALPN, no session resumption; h2c to one tonic echo backend (2 tokio workers)",
        versions.join("; ")
    ));
    r.line("- gateway: `spinlink gateway`, release build, its agent path (Hello, then `Relay` bidi / `Cache` unary streams with the channel token, carried to the backend as its sidecar over `upstreamConnections: 2` h2c connections); handshake (global and per client network) and Hello rate limits lifted in its config".to_string());
    r.line(format!(
        "- load: {} s per throughput run, {} runs per measure, targets in rotating order; bidi: {} streams over {} connections, ping-pong, {}-byte payload ({} bytes framed); unary: {} in flight over {} connections; latency: 1 in flight, {} requests per run; handshakes: {} concurrent loops of connect + TLS 1.3 mTLS + HTTP/2 prefaces (until the server's SETTINGS arrive) + close",
        opts.seconds,
        opts.runs,
        opts.bidi_streams,
        opts.bidi_conns,
        opts.payload,
        msg.len(),
        opts.unary_inflight,
        opts.unary_conns,
        opts.latency_requests,
        opts.handshake_concurrency
    ));

    // Check every target echoes before measuring anything.
    for t in &targets {
        rt.block_on(smoke(&t.dialer, msg.clone()))
            .with_context(|| format!("{} does not echo", t.name))?;
    }

    // Memory first, on fresh processes.
    let mut memory = BTreeMap::new();
    if opts.idle_conns > 0 {
        for t in &targets {
            if t.pid.is_none() {
                continue;
            }
            let m = rt.block_on(idle_memory(
                t,
                opts.idle_conns,
                msg.clone(),
                echo_h2c.port(),
            ));
            match m {
                Ok(m) => {
                    eprintln!("  memory {}: {m:?}", t.name);
                    memory.insert(t.name, m);
                }
                Err(e) => r.line(format!("- memory {}: failed: {e:#}", t.name)),
            }
        }
    }

    let secs = Duration::from_secs_f64(opts.seconds);
    let mut bidi: Res = BTreeMap::new();
    let mut unary: Res = BTreeMap::new();
    let mut p50: Res = BTreeMap::new();
    let mut p99: Res = BTreeMap::new();
    let mut hs: Res = BTreeMap::new();
    // Each run visits every target, starting one further along each time so
    // no target is always first (or last) on a warming machine.
    let each = |f: &mut dyn FnMut(&Target)| {
        let n = targets.len();
        for run in 0..opts.runs {
            for i in 0..n {
                f(&targets[(run + i) % n]);
            }
        }
    };
    // The front's own CPU per message: what a dedicated gateway node would
    // spend, whatever the load generator and backend take of the machine.
    let mut bidi_cpu: Res = BTreeMap::new();
    let mut unary_cpu: Res = BTreeMap::new();
    let mut bidi_sys: Res = BTreeMap::new();
    let mut unary_sys: Res = BTreeMap::new();
    // CPU time is sampled at the edges of the measured window only, so the
    // connects and the warm-up are not charged to the counted messages;
    // system calls are counted over the window's 100 ms intervals.
    let cpu_per = |t: &Target, m: &mut Res, sys: &mut Res, v: anyhow::Result<(f64, Used)>| {
        v.map(|(rate, used)| {
            let messages = rate * opts.seconds;
            if t.pid.is_some() && messages > 0.0 {
                m.entry(t.name).or_default().push(used.cpu / messages * 1e6);
                if let Some(per_second) = used.syscalls {
                    sys.entry(t.name).or_default().push(per_second / rate);
                }
            }
            rate
        })
    };
    each(&mut |t| {
        let v = rt.block_on(bidi_rate(
            &t.dialer,
            t.pids(),
            opts.bidi_conns,
            opts.bidi_streams,
            msg.clone(),
            secs,
        ));
        let v = cpu_per(t, &mut bidi_cpu, &mut bidi_sys, v);
        record(&mut bidi, t.name, v, "bidi");
    });
    each(&mut |t| {
        let v = rt.block_on(unary_rate(
            &t.dialer,
            t.pids(),
            opts.unary_conns,
            opts.unary_inflight,
            msg.clone(),
            secs,
        ));
        let v = cpu_per(t, &mut unary_cpu, &mut unary_sys, v);
        record(&mut unary, t.name, v, "unary");
    });
    each(
        &mut |t| match rt.block_on(latency(&t.dialer, opts.latency_requests, msg.clone())) {
            Ok((a, b)) => {
                p50.entry(t.name).or_default().push(a);
                p99.entry(t.name).or_default().push(b);
            }
            Err(e) => eprintln!("  latency {}: {e:#}", t.name),
        },
    );
    each(&mut |t| {
        let v = rt.block_on(handshake_rate(&t.dialer, opts.handshake_concurrency, secs));
        record(&mut hs, t.name, v, "handshakes");
    });
    drop(rt);

    let med = |m: &Res, name: &str| m.get(name).map(|v| median(v));
    let direct_p99 = med(&p99, "direct");
    r.line(String::new());
    r.line("| target | bidi msg/s | unary req/s (32 in flight) | front's CPU µs per bidi msg / unary req | front's syscalls per bidi msg / unary req | unary p50 / p99, 1 in flight (ms) | p99 added over direct (ms) | new mTLS conns/s | RSS per idle conn + stream (KiB) | upstream conns for 2,000 streams |");
    r.line("|---|---|---|---|---|---|---|---|---|---|");
    for t in &targets {
        let f0 = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.0}"));
        let f2 = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
        let added = match (med(&p99, t.name), direct_p99) {
            (Some(a), Some(d)) if t.name != "direct" => format!("{:.2}", a - d),
            _ => "–".into(),
        };
        let (mem, up) = match memory.get(t.name) {
            Some(m) => (format!("{:.1}", m.per_conn_kib), m.upstream.to_string()),
            None => ("–".into(), "–".into()),
        };
        let f1 = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.1}"));
        r.line(format!(
            "| {} | {} | {} | {} / {} | {} / {} | {} / {} | {} | {} | {} | {} |",
            t.name,
            f0(med(&bidi, t.name)),
            f0(med(&unary, t.name)),
            f1(med(&bidi_cpu, t.name)),
            f1(med(&unary_cpu, t.name)),
            f1(med(&bidi_sys, t.name)),
            f1(med(&unary_sys, t.name)),
            f2(med(&p50, t.name)),
            f2(med(&p99, t.name)),
            added,
            f0(med(&hs, t.name)),
            mem,
            up
        ));
    }
    r.line(String::new());
    let list = |m: &Res, name: &str| {
        m.get(name).map_or(String::new(), |v| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
    };
    let list2 = |m: &Res, name: &str| {
        m.get(name).map_or(String::new(), |v| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
    };
    for t in &targets {
        r.line(format!(
            "- {} runs: bidi {}; unary {}; p99 ms {}; conns/s {}",
            t.name,
            list(&bidi, t.name),
            list(&unary, t.name),
            list2(&p99, t.name),
            list(&hs, t.name)
        ));
    }
    for (name, m) in &memory {
        r.line(format!(
            "- memory {name}: RSS {:.1} MiB → {:.1} MiB with {} connections ({} streams open), {:.1} KiB each; {} upstream connections to the backend",
            m.before as f64 / 1048576.0,
            m.after as f64 / 1048576.0,
            m.conns,
            m.conns,
            m.per_conn_kib,
            m.upstream
        ));
    }
    drop(fronts);
    drop(passthrough);
    drop(echo);
    Ok(())
}

/// Runs the pass-through on two workers, as the proxies have, until killed.
fn passthrough(to: SocketAddr) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let b = crate::balancer::Balancer::start(vec![to]).await?;
        println!("listening: passthrough {}", b.addr);
        std::future::pending::<()>().await;
        anyhow::Ok(())
    })
}

type Res = BTreeMap<&'static str, Vec<f64>>;

fn record(m: &mut Res, name: &'static str, v: anyhow::Result<f64>, what: &str) {
    match v {
        Ok(v) => {
            eprintln!("  {what} {name}: {v:.0}");
            m.entry(name).or_default().push(v);
        }
        Err(e) => eprintln!("  {what} {name}: failed: {e:#}"),
    }
}

/// The framed echo message every load sends: `payload` bytes of `x`.
pub(crate) fn echo_message(payload: usize) -> Bytes {
    frame(
        &crate::grpc_echo::pb::EchoMessage {
            payload: vec![b'x'; payload],
        }
        .encode_to_vec(),
    )
}

/// The median of `v` (the lower one of an even count).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[(s.len() - 1) / 2]
}

/// Lifts the soft open-files limit to the hard one (2,000 connections hold
/// 2,000 descriptors here and as many in the proxy; children inherit it).
pub fn raise_nofile() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    let _ = setrlimit(Resource::Nofile, l);
}

/// One unary call and a short bidi exchange.
async fn smoke(d: &Dialer, msg: Bytes) -> anyhow::Result<()> {
    let within = Duration::from_secs(10);
    tokio::time::timeout(within, async {
        let mut c = d.connect().await?;
        let a = c.unary(paths::CACHE, msg.clone()).await?;
        anyhow::ensure!(a.len() + 5 == msg.len(), "unary echo of the wrong size");
        let mut b = c.bidi(paths::RELAY, msg.clone()).await?;
        for _ in 0..3 {
            let m = b.next().await?.context("bidi ended early")?;
            anyhow::ensure!(m.len() + 5 == msg.len(), "bidi echo of the wrong size");
            b.send(msg.clone()).await?;
        }
        Ok(())
    })
    .await
    .context("timed out")?
}

async fn connect_all(d: &Dialer, n: usize) -> anyhow::Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(d.connect().await?);
    }
    Ok(conns)
}

/// Messages/s echoed by `streams` ping-pong bidi streams over `conns`
/// connections in `secs` (after a 1 s warm-up), and the CPU seconds `pids`
/// used in those `secs`.
async fn bidi_rate(
    d: &Dialer,
    pids: Vec<u32>,
    conns: usize,
    streams: usize,
    msg: Bytes,
    secs: Duration,
) -> anyhow::Result<(f64, Used)> {
    let cs = connect_all(d, conns).await?;
    let start = Instant::now() + Duration::from_secs(1);
    let end = start + secs;
    let cpu = cpu_between(pids, start, end);
    let mut tasks = Vec::new();
    for i in 0..streams {
        let mut c = cs[i % cs.len()].clone();
        let msg = msg.clone();
        tasks.push(tokio::spawn(async move {
            let mut b = c.bidi(paths::RELAY, msg.clone()).await?;
            let mut n = 0u64;
            loop {
                b.next().await?.context("stream ended")?;
                let now = Instant::now();
                if now >= end {
                    break;
                }
                if now >= start {
                    n += 1;
                }
                b.send(msg.clone()).await?;
            }
            anyhow::Ok(n)
        }));
    }
    let rate = join_counts(tasks, end, secs).await?;
    Ok((rate, cpu.await?))
}

/// What a front used while its messages were counted.
#[derive(Debug, Clone, Copy)]
struct Used {
    /// CPU seconds (user and system).
    cpu: f64,
    /// System calls per second, when `perf` could count them.
    syscalls: Option<f64>,
}

/// What `pids` use between `start` and `end`.
fn cpu_between(pids: Vec<u32>, start: Instant, end: Instant) -> tokio::task::JoinHandle<Used> {
    tokio::spawn(async move {
        // Started early enough to be attached when the window opens.
        tokio::time::sleep_until(
            start
                .checked_sub(Duration::from_millis(500))
                .unwrap_or(start)
                .into(),
        )
        .await;
        let counter = crate::syscalls::Counter::start(&pids);
        tokio::time::sleep_until(start.into()).await;
        let before = peers::cpu_seconds(&pids);
        tokio::time::sleep_until(end.into()).await;
        let cpu = peers::cpu_seconds(&pids) - before;
        // Every interval that ended inside the window is in perf's output,
        // which it flushes when told to stop.
        let syscalls = counter.and_then(|c| c.stop(start, end));
        Used { cpu, syscalls }
    })
}

async fn join_counts(
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<u64>>>,
    end: Instant,
    secs: Duration,
) -> anyhow::Result<f64> {
    let mut total = 0;
    let deadline = tokio::time::Instant::from_std(end + Duration::from_secs(30));
    for t in tasks {
        total += tokio::time::timeout_at(deadline, t)
            .await
            .context("a load task hung")???;
    }
    Ok(total as f64 / secs.as_secs_f64())
}

/// Unary requests/s with `inflight` callers over `conns` connections, and
/// the CPU seconds `pids` used while they were counted.
async fn unary_rate(
    d: &Dialer,
    pids: Vec<u32>,
    conns: usize,
    inflight: usize,
    msg: Bytes,
    secs: Duration,
) -> anyhow::Result<(f64, Used)> {
    let cs = connect_all(d, conns).await?;
    let start = Instant::now() + Duration::from_secs(1);
    let end = start + secs;
    let cpu = cpu_between(pids, start, end);
    let mut tasks = Vec::new();
    for i in 0..inflight {
        let mut c = cs[i % cs.len()].clone();
        let msg = msg.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                c.unary(paths::CACHE, msg.clone()).await?;
                let now = Instant::now();
                if now >= end {
                    break;
                }
                if now >= start {
                    n += 1;
                }
            }
            anyhow::Ok(n)
        }));
    }
    let rate = join_counts(tasks, end, secs).await?;
    Ok((rate, cpu.await?))
}

/// p50 and p99 (ms) of `requests` unary calls one after another.
async fn latency(d: &Dialer, requests: usize, msg: Bytes) -> anyhow::Result<(f64, f64)> {
    let mut c = d.connect().await?;
    let within = Duration::from_secs(120);
    tokio::time::timeout(within, async {
        for _ in 0..200 {
            c.unary(paths::CACHE, msg.clone()).await?;
        }
        let mut samples = Vec::with_capacity(requests);
        for _ in 0..requests {
            let t = Instant::now();
            c.unary(paths::CACHE, msg.clone()).await?;
            samples.push(t.elapsed());
        }
        let ms = |p| {
            stats::percentile(&samples, p).map_or(f64::NAN, |d: Duration| d.as_secs_f64() * 1e3)
        };
        anyhow::Ok((ms(50.0), ms(99.0)))
    })
    .await
    .context("latency run timed out")?
}

/// New mTLS connections/s with `concurrency` connect loops.
async fn handshake_rate(d: &Dialer, concurrency: usize, secs: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let end = start + secs;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                d.handshake().await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    let deadline = tokio::time::Instant::from_std(end + Duration::from_secs(30));
    for t in tasks {
        total += tokio::time::timeout_at(deadline, t)
            .await
            .context("a handshake loop hung")???;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// What the idle-connection measure found.
#[derive(Debug)]
struct Memory {
    before: u64,
    after: u64,
    conns: usize,
    per_conn_kib: f64,
    upstream: usize,
}

/// RSS added by `n` idle connections with one open (echoed once) bidi
/// stream each, and the upstream connections the target holds meanwhile.
async fn idle_memory(t: &Target, n: usize, msg: Bytes, echo_port: u16) -> anyhow::Result<Memory> {
    // One warm-up connection, so one-time allocations are not counted.
    smoke(&t.dialer, msg.clone()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = peers::rss(&t.pids());
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let d = t.dialer.clone();
        let msg = msg.clone();
        let permit = sem.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let r = tokio::time::timeout(Duration::from_secs(30), async {
                let mut c = d.connect().await?;
                let mut b = c.bidi(paths::RELAY, msg).await?;
                b.next().await?.context("no echo")?;
                anyhow::Ok((c, b))
            })
            .await;
            drop(permit);
            r.context("timed out")?
        }));
    }
    let mut held = Vec::with_capacity(n);
    for task in tasks {
        held.push(task.await??);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pids = t.pids();
    let after = peers::rss(&pids);
    let upstream = peers::connections_to(&pids, echo_port);
    drop(held);
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(Memory {
        before,
        after,
        conns: n,
        per_conn_kib: after.saturating_sub(before) as f64 / n as f64 / 1024.0,
        upstream,
    })
}

/// `spinlink-bench grpc-proxy …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Measure the gateway, nginx, HAProxy and Envoy in front of the echo
    /// backend, and the backend directly.
    Run(RunArgs),
    /// Count the instructions each front executes per bidi message and
    /// per unary request, under valgrind's callgrind.
    Instructions(crate::instructions::Args),
    /// A byte-copying TCP pass-through (started by `run`, the floor every
    /// front is compared with; prints its address).
    Passthrough {
        /// Where to pass connections.
        #[arg(long)]
        to: SocketAddr,
    },
    /// The echo backend (started by `run`; prints its addresses).
    Echo {
        /// Dev PKI directory (`DevPki::ensure` layout).
        #[arg(long)]
        pki: PathBuf,
        /// h2c listen address.
        #[arg(long, default_value = "127.0.0.1:0")]
        h2c: SocketAddr,
        /// TLS 1.3 mTLS listen address.
        #[arg(long, default_value = "127.0.0.1:0")]
        tls: SocketAddr,
    },
}

/// Flags of `grpc-proxy run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    peers: Peers,
    /// Rounds of each measure.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Concurrent bidi streams.
    #[arg(long, default_value_t = 200)]
    bidi_streams: usize,
    /// Connections for the bidi streams.
    #[arg(long, default_value_t = 4)]
    bidi_conns: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 200)]
    payload: usize,
    /// Unary requests in flight.
    #[arg(long, default_value_t = 32)]
    unary_inflight: usize,
    /// Connections for them.
    #[arg(long, default_value_t = 4)]
    unary_conns: usize,
    /// Requests per latency run (1 in flight).
    #[arg(long, default_value_t = 3000)]
    latency_requests: usize,
    /// Concurrent connect loops for the handshake rate.
    #[arg(long, default_value_t = 8)]
    handshake_concurrency: usize,
    /// Idle connections for the memory measure (0 skips it).
    #[arg(long, default_value_t = 2000)]
    idle_conns: usize,
}

/// Runs `cmd`; `echo` serves until the process is killed.
pub fn command(
    cmd: Command,
    spinlink: PathBuf,
    dir: PathBuf,
    r: &mut Report,
) -> anyhow::Result<()> {
    match cmd {
        Command::Echo { pki, h2c, tls } => crate::grpc_echo::run(&pki, h2c, tls),
        Command::Passthrough { to } => passthrough(to),
        Command::Instructions(a) => crate::instructions::run(a, spinlink, dir, r),
        Command::Run(a) => run(
            &Options {
                spinlink,
                peers: a.peers,
                dir,
                runs: a.runs.max(1),
                seconds: a.seconds,
                bidi_streams: a.bidi_streams,
                bidi_conns: a.bidi_conns.max(1),
                payload: a.payload,
                unary_inflight: a.unary_inflight,
                unary_conns: a.unary_conns.max(1),
                latency_requests: a.latency_requests.max(1),
                handshake_concurrency: a.handshake_concurrency.max(1),
                idle_conns: a.idle_conns,
            },
            r,
        ),
    }
}
