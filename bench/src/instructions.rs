//! Instructions each front executes per message, counted by valgrind's
//! callgrind: the counter behind the CPU column of `grpc-proxy run` that
//! these VMs cannot give (`perf stat -e instructions` is `<not
//! supported>`). Callgrind counts every instruction a process runs in user
//! space, the same count for the same binary and load whatever else the
//! machine is doing, so two builds, or two fronts, compare without the
//! spread of CPU time. What it does not count is the kernel's share (the
//! system calls, loopback TCP), which `grpc-proxy run` measures.
//!
//! Each front runs under `valgrind --tool=callgrind` in front of the echo
//! backend, configured as in `grpc-proxy run`. The load opens its
//! connections and streams and echoes once on each (so connections,
//! upstream connections and lazily built state exist), then the front's
//! counters are zeroed (`callgrind_control -z`), a counted number of bidi
//! messages or unary requests goes through, and the counters are dumped
//! (`callgrind_control -d`): the dump's total over the count is the figure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use spinlink_proto::paths;
use spinlink_tls::dev::DevPki;

use crate::chain::Proc;
use crate::grpc_peers::{self as peers, Front, Kind, Peers, path};
use crate::grpc_wire::Dialer;
use crate::report::Report;

/// How long a front under valgrind may take to open its port (Envoy takes
/// the longest).
const START_WAIT: Duration = Duration::from_secs(300);

/// Flags of `grpc-proxy instructions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    peers: Peers,
    /// Counted rounds per front and load (the count is the same in every
    /// round of the same binary; more rounds show that it is).
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// Concurrent bidi streams.
    #[arg(long, default_value_t = 16)]
    bidi_streams: usize,
    /// Messages each bidi stream echoes while counted.
    #[arg(long, default_value_t = 250)]
    bidi_messages: usize,
    /// Unary requests in flight.
    #[arg(long, default_value_t = 16)]
    unary_inflight: usize,
    /// Requests each of them makes while counted.
    #[arg(long, default_value_t = 250)]
    unary_requests: usize,
    /// Connections each load is spread over.
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 200)]
    payload: usize,
    /// New mTLS connections counted per round (0 skips the measure).
    #[arg(long, default_value_t = 200)]
    handshakes: usize,
    /// Concurrent connect loops while they are counted.
    #[arg(long, default_value_t = 4)]
    handshake_concurrency: usize,
    /// The valgrind binary.
    #[arg(long, default_value = "valgrind")]
    valgrind: PathBuf,
}

/// A front running under callgrind.
struct Counted {
    /// Its first process.
    pid: u32,
    /// Where its dumps go: `<prefix>.<pid>.<part>`.
    prefix: PathBuf,
}

impl Counted {
    /// Every process of the front (nginx's workers are forks of its master,
    /// each counted by its own callgrind).
    fn pids(&self) -> Vec<u32> {
        peers::process_tree(self.pid)
    }

    /// Zeroes the counters of every process of the front.
    fn zero(&self) -> anyhow::Result<()> {
        for pid in self.pids() {
            control("-z", pid)?;
        }
        Ok(())
    }

    /// Dumps the counters of every process and returns their summed
    /// instruction count since the last zero.
    fn dump(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for pid in self.pids() {
            control("-d", pid)?;
            total += latest_total(&self.prefix, pid)?;
        }
        Ok(total)
    }
}

/// `callgrind_control <flag> <pid>`.
fn control(flag: &str, pid: u32) -> anyhow::Result<()> {
    let out = Command::new("callgrind_control")
        .args([flag, &pid.to_string()])
        .output()
        .context("running callgrind_control")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("OK.") {
        bail!(
            "callgrind_control {flag} {pid}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The instruction total of `pid`'s newest dump (`<prefix>.<pid>.<part>`).
fn latest_total(prefix: &Path, pid: u32) -> anyhow::Result<u64> {
    let dir = prefix.parent().context("dump prefix without a directory")?;
    let stem = format!(
        "{}.{pid}.",
        prefix
            .file_name()
            .and_then(|n| n.to_str())
            .context("dump prefix")?
    );
    let newest = std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let part: u32 = name.strip_prefix(&stem)?.parse().ok()?;
            Some((part, e.path()))
        })
        .max_by_key(|(part, _)| *part)
        .with_context(|| format!("no callgrind dump of process {pid}"))?;
    totals(&std::fs::read_to_string(&newest.1)?)
        .with_context(|| format!("{}: no totals line", newest.1.display()))
}

/// The first event count of a callgrind dump's `totals:` (or, failing
/// that, `summary:`) line: instructions executed.
fn totals(text: &str) -> Option<u64> {
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    line("totals:").or_else(|| line("summary:"))
}

/// Runs `grpc-proxy instructions`.
pub fn run(args: Args, spinlink: PathBuf, dir: PathBuf, r: &mut Report) -> anyhow::Result<()> {
    crate::grpc_proxy::raise_nofile();
    let pki = DevPki::ensure(&dir.join("pki"), &[crate::grpc_wire::AGENT_ID])?;
    let me = std::env::current_exe()?;
    let mut echo = Proc::start(&me, "echo", &dir, &crate::grpc_echo::args(&dir, &pki.dir)?)?;
    let echo_h2c: std::net::SocketAddr = echo
        .wait_line("listening: echo-h2c ", peers::START_WAIT)?
        .parse()?;
    let valgrind = path(&args.valgrind)?.to_owned();
    let version = peers::version(&args.valgrind, &["--version"]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let msg = crate::grpc_proxy::echo_message(args.payload);
    let gateway = |listen| peers::gateway_yaml(&pki, listen, echo_h2c, true);
    let runs = args.runs.max(1);
    let conns = args.conns.max(1);
    let bidi_count = (args.bidi_streams * args.bidi_messages).max(1);
    let unary_count = (args.unary_inflight * args.unary_requests).max(1);
    // Per front, in the order measured: bidi per message, unary per
    // request and per new connection, one entry per round.
    let mut per: Vec<Counts> = Vec::new();
    let mut versions = Vec::new();
    for (kind, bin) in args.peers.fronts(&spinlink) {
        let name = kind.name();
        let prefix = dir.join(format!("callgrind.{name}"));
        let under = vec![
            valgrind.clone(),
            "--tool=callgrind".into(),
            "--trace-children=yes".into(),
            format!("--callgrind-out-file={}.%p", path(&prefix)?),
        ];
        eprintln!("{name}: starting under callgrind");
        let front = Front::start_under(
            kind, &bin, &pki, &dir, echo_h2c, &gateway, &under, START_WAIT,
        )
        .with_context(|| format!("starting {name} under callgrind"))?;
        if kind != Kind::Gateway {
            versions.push(front.version.clone());
        }
        let counted = Counted {
            pid: front.pid(),
            prefix,
        };
        let dialer = Dialer::new(&pki, front.addr, kind == Kind::Gateway)?;
        let (mut bidis, mut unaries, mut conns_new) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..runs {
            let b = rt
                .block_on(bidi(
                    &dialer,
                    &counted,
                    conns,
                    args.bidi_streams,
                    args.bidi_messages,
                    msg.clone(),
                ))
                .with_context(|| format!("{name}: bidi"))?;
            let b = b as f64 / bidi_count as f64;
            let u = rt
                .block_on(unary(
                    &dialer,
                    &counted,
                    conns,
                    args.unary_inflight,
                    args.unary_requests,
                    msg.clone(),
                ))
                .with_context(|| format!("{name}: unary"))?;
            let u = u as f64 / unary_count as f64;
            let h = handshakes_counted(&rt, &dialer, &counted, &args)
                .with_context(|| format!("{name}: handshakes"))?;
            eprintln!(
                "  round {round}: {name} {b:.0} per bidi msg, {u:.0} per unary req, {} per new connection",
                h.map_or("–".into(), |h| format!("{h:.0}"))
            );
            bidis.push(b);
            unaries.push(u);
            conns_new.extend(h);
        }
        per.push(Counts {
            name,
            bidi: bidis,
            unary: unaries,
            handshake: conns_new,
        });
    }
    drop(echo);
    if args.handshakes > 0 {
        // The backend itself, as `grpc-proxy run`'s `direct`: a hyper server
        // on tokio-rustls with the same certificates, whose handshakes the
        // gateway's are held against.
        per.push(direct(&args, &rt, &me, &pki, &dir, &valgrind, runs)?);
    }

    r.line(format!(
        "- counter: {version}, `--tool=callgrind` (instructions executed in user space, every thread and process of the front; the kernel's share is not in it)"
    ));
    r.line(format!(
        "- peers: {}; configured as in `grpc-proxy run` (TLS 1.3, client certificate required, HTTP/2 by ALPN, h2c to the echo backend)",
        versions.join("; ")
    ));
    r.line(format!(
        "- load: connections and streams opened and echoed once before counting; counted: {} bidi streams × {} messages, {} unary callers × {} requests, over {conns} connections, {}-byte payload; {runs} rounds per front, every front measured in this run",
        args.bidi_streams, args.bidi_messages, args.unary_inflight, args.unary_requests, args.payload
    ));
    r.line("");
    if args.handshakes > 0 {
        r.line(format!(
            "- new connections: {} counted per round, {} concurrent loops of connect + TLS 1.3 mTLS + HTTP/2 prefaces (until the server's SETTINGS arrive) + close, as `grpc-proxy run`'s handshake measure; `direct` is the echo backend's own TLS port (hyper on tokio-rustls), counted the same way",
            args.handshakes,
            args.handshake_concurrency.max(1)
        ));
    }
    r.line("");
    r.line(
        "| front | instructions per bidi msg | per unary req | per new mTLS conn | ×HAProxy bidi | ×HAProxy unary | ×direct new conn | spread between rounds |",
    );
    r.line("|---|---|---|---|---|---|---|---|");
    let med = |v: &[f64]| (!v.is_empty()).then(|| crate::grpc_proxy::median(v));
    let haproxy = per.iter().find(|c| c.name == Kind::Haproxy.name());
    let direct = per.iter().find(|c| c.name == DIRECT);
    let ratio = |x: Option<f64>, of: Option<f64>| match (x, of) {
        (Some(x), Some(of)) if of > 0.0 => format!("{:.2}", x / of),
        _ => "–".into(),
    };
    let count = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.0}"));
    for c in &per {
        let (b, u, h) = (med(&c.bidi), med(&c.unary), med(&c.handshake));
        r.line(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} % / {:.1} % / {:.1} % |",
            c.name,
            count(b),
            count(u),
            count(h),
            ratio(b, haproxy.and_then(|p| med(&p.bidi))),
            ratio(u, haproxy.and_then(|p| med(&p.unary))),
            ratio(h, direct.and_then(|p| med(&p.handshake))),
            spread(&c.bidi),
            spread(&c.unary),
            spread(&c.handshake),
        ));
    }
    Ok(())
}

/// The row name of the backend counted on its own.
const DIRECT: &str = "direct";

/// One front's counts, one entry per round (empty: not measured).
struct Counts {
    name: &'static str,
    bidi: Vec<f64>,
    unary: Vec<f64>,
    handshake: Vec<f64>,
}

/// Instructions per new connection on `front` (`None` when the measure is
/// off).
fn handshakes_counted(
    rt: &tokio::runtime::Runtime,
    dialer: &Dialer,
    front: &Counted,
    args: &Args,
) -> anyhow::Result<Option<f64>> {
    if args.handshakes == 0 {
        return Ok(None);
    }
    let total = rt.block_on(handshakes(
        dialer,
        front,
        args.handshakes,
        args.handshake_concurrency.max(1),
    ))?;
    Ok(Some(total as f64 / args.handshakes as f64))
}

/// Counts the echo backend's own TLS port under callgrind: handshakes only
/// (its bidi and unary work is the backend's, not a front's).
fn direct(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    me: &Path,
    pki: &DevPki,
    dir: &Path,
    valgrind: &str,
    runs: usize,
) -> anyhow::Result<Counts> {
    let prefix = dir.join(format!("callgrind.{DIRECT}"));
    let out_file = format!("--callgrind-out-file={}.%p", path(&prefix)?);
    eprintln!("{DIRECT}: starting under callgrind");
    let mut command = vec!["--tool=callgrind", &out_file, path(me)?];
    command.extend(crate::grpc_echo::args(dir, &pki.dir)?);
    let mut echo = Proc::start(Path::new(valgrind), DIRECT, dir, &command)?;
    let tls: std::net::SocketAddr = echo
        .wait_line("listening: echo-tls ", START_WAIT)?
        .parse()?;
    let counted = Counted {
        pid: echo.pid(),
        prefix,
    };
    let dialer = Dialer::new(pki, tls, false)?;
    let mut handshake = Vec::with_capacity(runs);
    for round in 0..runs {
        let h = handshakes_counted(rt, &dialer, &counted, args)?.context("handshakes measured")?;
        eprintln!("  round {round}: {DIRECT} {h:.0} per new connection");
        handshake.push(h);
    }
    drop(echo);
    Ok(Counts {
        name: DIRECT,
        bidi: Vec::new(),
        unary: Vec::new(),
        handshake,
    })
}

/// (max − min) / min of `v`, in percent (0 for none).
fn spread(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    if min > 0.0 {
        (max - min) / min * 100.0
    } else {
        0.0
    }
}

/// Opens `streams` bidi streams over `conns` connections and echoes once on
/// each, then counts the front's instructions while each stream echoes
/// `messages` more.
async fn bidi(
    d: &Dialer,
    front: &Counted,
    conns: usize,
    streams: usize,
    messages: usize,
    msg: Bytes,
) -> anyhow::Result<u64> {
    let mut cs = Vec::with_capacity(conns);
    for _ in 0..conns {
        cs.push(d.connect().await?);
    }
    let mut open = Vec::with_capacity(streams);
    for i in 0..streams {
        let mut b = cs[i % conns].bidi(paths::RELAY, msg.clone()).await?;
        b.next()
            .await?
            .context("stream ended before its first echo")?;
        open.push(b);
    }
    tokio::task::block_in_place(|| front.zero())?;
    let mut tasks = Vec::with_capacity(streams);
    for mut b in open {
        let msg = msg.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..messages {
                b.send(msg.clone()).await?;
                b.next().await?.context("stream ended")?;
            }
            anyhow::Ok(b)
        }));
    }
    let mut done = Vec::with_capacity(streams);
    for t in tasks {
        done.push(t.await??);
    }
    // Streams and connections close after the dump: their teardown is not
    // a message's cost.
    let total = tokio::task::block_in_place(|| front.dump())?;
    drop(done);
    drop(cs);
    Ok(total)
}

/// Opens a few connections first (so lazily built state exists), then
/// counts the front's instructions over `count` new connections made by
/// `concurrency` loops, each closed once the server's SETTINGS arrive.
async fn handshakes(
    d: &Dialer,
    front: &Counted,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<u64> {
    for _ in 0..concurrency {
        d.handshake().await?;
    }
    tokio::task::block_in_place(|| front.zero())?;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (d, next) = (d.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < count {
                d.handshake().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    tokio::task::block_in_place(|| front.dump())
}

/// Opens `conns` connections and makes one request on each, then counts the
/// front's instructions while `inflight` callers make `requests` each.
async fn unary(
    d: &Dialer,
    front: &Counted,
    conns: usize,
    inflight: usize,
    requests: usize,
    msg: Bytes,
) -> anyhow::Result<u64> {
    let mut cs = Vec::with_capacity(conns);
    for _ in 0..conns {
        let mut c = d.connect().await?;
        c.unary(paths::CACHE, msg.clone()).await?;
        cs.push(c);
    }
    tokio::task::block_in_place(|| front.zero())?;
    let mut tasks = Vec::with_capacity(inflight);
    for i in 0..inflight {
        let mut c = cs[i % conns].clone();
        let msg = msg.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..requests {
                c.unary(paths::CACHE, msg.clone()).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    // Connections close after the dump, as in `bidi`.
    let total = tokio::task::block_in_place(|| front.dump())?;
    drop(cs);
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_read_from_a_callgrind_dump() {
        let dump = "# callgrind format\nversion: 1\npid: 8768\npart: 1\n\nevents: Ir\nsummary: 12\n\nfn=(1) main\n3 5\n\ntotals: 123456 7\n";
        assert_eq!(totals(dump), Some(123_456));
        assert_eq!(totals("events: Ir\nsummary: 99\n"), Some(99));
        assert_eq!(totals("events: Ir\n"), None);
    }

    #[test]
    fn the_newest_part_of_a_process_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("callgrind.gateway");
        for (name, total) in [
            ("callgrind.gateway.41", 1),
            ("callgrind.gateway.41.2", 20),
            ("callgrind.gateway.41.10", 100),
            ("callgrind.gateway.411.12", 5),
        ] {
            std::fs::write(dir.path().join(name), format!("totals: {total}\n")).unwrap();
        }
        assert_eq!(latest_total(&prefix, 41).unwrap(), 100);
        assert!(latest_total(&prefix, 7).is_err());
    }
}
