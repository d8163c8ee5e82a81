//! Issues 4 and 6: a reconnect storm. N simulated agents (default 1,000), one
//! account each, in this process; a TCP balancer ([`crate::balancer`]) in
//! front of two `spinlink gateway` processes; three `spinlink sidecar`
//! processes on one store as the gateways' static upstreams. Measured: the
//! gateways' RSS per agent connection, and the time from a gateway's SIGKILL
//! (restarted at once) — and from a SIGTERM drain — until every agent is back
//! online, with the handshake failures and refusals it cost.
//!
//! A simulated agent ([`SimAgent`]) is a tokio task, not the agent crate's
//! `Agent`: it dials with the agent's own [`spinlink_agent::connect`] (TCP,
//! TLS with a client certificate, HTTP/2), says `Hello` for its account,
//! opens `Control` and a `Cache` stream (`open`, a tiny discovery snapshot,
//! a listing of one kind with a few objects, unless the sidecar's
//! `ResumeFrom` says it holds that kind), and then only heartbeats. A broken
//! connection is dialled again after the agent's own [`Backoff`] (full
//! jitter, reset once a connection lasted [`STABLE_CONNECTION`]); a
//! `Reconnect` is followed at once, the old connection kept until the new
//! one is online (make-before-break).
//!
//! "Online" is the agent's `Cache` stream answered by its sidecar, and is
//! confirmed by the sidecars' `spinlink_sidecar_account_state` metric
//! showing every account online. Every wait is bounded; processes are
//! killed on drop.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use spinlink_agent::GatewayConfig;
use spinlink_agent::backoff::Backoff;
use spinlink_agent::connection::connector::ConnectError;
use spinlink_agent::connection::stream_request;
use spinlink_proto::v1::{
    AccountInfo, CacheDown, CacheOpen, CacheUp, ControlEvent, ControlRequest, DiscoverySnapshot,
    Document, Heartbeat, HelloRequest, Kind, SyncEnd, SyncStart, WatchEvent, cache_down, cache_up,
    control_event, watch_event,
};
use spinlink_tls::dev::{DevPki, dev_agent_identity};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::agent_chain::memory_of;
use crate::balancer::Balancer;
use crate::chain::{Proc, START_WAIT};
use crate::report::Report;

/// The agent's default `reconnect.moveSpreadMaxMillis`.
const MOVE_SPREAD_MAX: Duration =
    Duration::from_millis(spinlink_agent::config::DEFAULT_MOVE_SPREAD_MAX_MILLIS);

/// A connection that stayed up this long resets the reconnect backoff (the
/// agent's rule).
pub const STABLE_CONNECTION: Duration = Duration::from_secs(30);
/// How long the fleet may take to come online, or back, before the run fails.
pub const ONLINE_WAIT: Duration = Duration::from_secs(180);
/// How long a `Cache` stream may take to be answered by its sidecar.
pub const STREAM_WAIT: Duration = Duration::from_secs(30);
/// How often the sidecars' metrics are read while waiting.
pub const POLL: Duration = Duration::from_millis(100);
/// Messages queued towards the gateway per simulated cache stream.
const UP_QUEUE: usize = 16;
/// Sidecars, as issue 6 sets them up.
const SIDECARS: usize = 3;
/// Gateways, as issue 6 sets them up.
const GATEWAYS: usize = 2;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary.
    pub spinlink: PathBuf,
    /// Simulated agents (one account each).
    pub agents: usize,
    /// Client certificates the agents share; identity `i` may serve the
    /// accounts `storm-i-*`.
    pub identities: usize,
    /// Objects listed per account (one kind).
    pub objects: usize,
    /// Runs, each on a fresh deployment.
    pub runs: usize,
    /// The agents' first connections are spread over this long.
    pub ramp: Duration,
    /// Pause once all are online, before memory is read.
    pub settle: Duration,
    /// Interval of cache-stream heartbeats.
    pub heartbeat: Duration,
    /// The agents' first reconnect delay cap.
    pub initial_backoff: Duration,
    /// The agents' largest reconnect delay cap.
    pub max_backoff: Duration,
    /// `listener.handshakesPerSecond` of the gateways (`None`: their default).
    pub handshakes_per_second: Option<f64>,
    /// `listener.handshakeBurst` of the gateways (`None`: their default).
    pub handshake_burst: Option<u32>,
    /// `listener.handshakeQueueSeconds` of the gateways (`None`: their default).
    pub handshake_queue_seconds: Option<f64>,
    /// `upstreamPool.loadFactor` of the gateways (`None`: their default).
    pub load_factor: Option<f64>,
    /// `ownership.leaseSeconds` of the sidecars (`None`: their default).
    pub lease_seconds: Option<u64>,
    /// The sidecars' store (`None`: a fresh SQLite file per run).
    pub store_url: Option<String>,
    /// Also drain a gateway (SIGTERM) after the SIGKILL storm.
    pub drain: bool,
    /// Scratch directory.
    pub dir: PathBuf,
}

/// The account agent `k` serves in run `run`, under identity `k mod
/// identities` (runs differ, so a store kept across runs holds no lease of
/// this run's accounts).
pub fn account_of(k: usize, identities: usize, run: usize) -> String {
    format!("storm-{}-r{run}-{k}", k % identities.max(1))
}

/// The dev PKI name of identity `i` (its certificate is `agent-<name>`).
fn identity_name(i: usize) -> String {
    format!("storm-{i}")
}

// ---- the fleet --------------------------------------------------------------

/// Why a connection attempt ended before the agent was online.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// TCP connect to the balancer failed.
    Tcp,
    /// The TLS handshake failed (includes a gateway closing the connection
    /// unhandshaken, as its admission bucket does).
    Tls,
    /// Any other dialling error.
    Connect,
    /// `Hello` failed (e.g. its per-identity rate).
    Hello,
    /// `Hello` answered without a grant for the account.
    Refused,
    /// `Control` or `Cache` could not be opened, or the sidecar did not
    /// answer the cache stream.
    Stream,
}

/// What the agents saw, counted.
#[derive(Debug, Default)]
struct Counts {
    tcp: AtomicU64,
    tls: AtomicU64,
    connect: AtomicU64,
    hello: AtomicU64,
    refused: AtomicU64,
    stream: AtomicU64,
    sessions: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    /// TCP connects that failed.
    pub tcp: u64,
    /// TLS handshakes that failed.
    pub tls: u64,
    /// Other dialling errors.
    pub connect: u64,
    /// `Hello` calls that failed.
    pub hello: u64,
    /// `Hello` answers without the account.
    pub refused: u64,
    /// Streams that could not be opened.
    pub stream: u64,
    /// Sessions that came online.
    pub sessions: u64,
}

impl Failures {
    /// Failed connections: TCP, TLS and other dialling errors (what the
    /// issue's "no handshake failures" counts; a stream refused with a
    /// retryable status while its account changes owner is not one).
    pub fn connections(&self) -> u64 {
        self.tcp + self.tls + self.connect
    }

    /// Every failed attempt.
    pub fn total(&self) -> u64 {
        self.tcp + self.tls + self.connect + self.hello + self.refused + self.stream
    }

    fn since(&self, before: &Failures) -> Failures {
        Failures {
            tcp: self.tcp - before.tcp,
            tls: self.tls - before.tls,
            connect: self.connect - before.connect,
            hello: self.hello - before.hello,
            refused: self.refused - before.refused,
            stream: self.stream - before.stream,
            sessions: self.sessions - before.sessions,
        }
    }
}

/// One agent's state as the bench reads it.
#[derive(Debug, Default)]
struct AgentCell {
    /// Sessions online now (two during a make-before-break move).
    live: AtomicUsize,
    /// When the latest session came online, ms since the fleet's epoch.
    online_at: AtomicU64,
    /// The gateway (1-based index from its id; 0: none) of the latest session.
    gateway: AtomicUsize,
    /// Attempts to come online that failed, all told.
    failed: AtomicU64,
}

/// Every simulated agent's state and the counts.
#[derive(Debug)]
struct Fleet {
    epoch: Instant,
    agents: Vec<AgentCell>,
    counts: Counts,
    /// The latest error of each kind of failure (no secrets: statuses and
    /// dialling errors only).
    last: std::sync::Mutex<BTreeMap<String, String>>,
}

impl Fleet {
    fn new(n: usize) -> Arc<Fleet> {
        Arc::new(Fleet {
            epoch: Instant::now(),
            agents: (0..n).map(|_| AgentCell::default()).collect(),
            counts: Counts::default(),
            last: std::sync::Mutex::default(),
        })
    }

    fn ms(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    fn count(&self, f: Failure, why: String) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(format!("{f:?}").to_lowercase(), why);
        let c = &self.counts;
        match f {
            Failure::Tcp => &c.tcp,
            Failure::Tls => &c.tls,
            Failure::Connect => &c.connect,
            Failure::Hello => &c.hello,
            Failure::Refused => &c.refused,
            Failure::Stream => &c.stream,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    fn failures(&self) -> Failures {
        let c = &self.counts;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Failures {
            tcp: g(&c.tcp),
            tls: g(&c.tls),
            connect: g(&c.connect),
            hello: g(&c.hello),
            refused: g(&c.refused),
            stream: g(&c.stream),
            sessions: g(&c.sessions),
        }
    }

    /// Agents with a session online.
    fn online(&self) -> usize {
        self.agents
            .iter()
            .filter(|a| a.live.load(Ordering::Relaxed) > 0)
            .count()
    }

    /// Agents online on a session that came up after `t` (`of`: only those).
    fn back_since(&self, t: Instant, of: &[usize]) -> usize {
        let t = self.ms(t);
        of.iter()
            .filter(|&&k| {
                let a = &self.agents[k];
                a.live.load(Ordering::Relaxed) > 0 && a.online_at.load(Ordering::Relaxed) >= t
            })
            .count()
    }

    /// The latest time one of `of` came online.
    fn last_online(&self, of: &[usize]) -> Instant {
        let ms = of
            .iter()
            .map(|&k| self.agents[k].online_at.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        self.epoch + Duration::from_millis(ms)
    }

    /// Agents whose latest session is on gateway `g` (1-based).
    fn on_gateway(&self, g: usize) -> Vec<usize> {
        (0..self.agents.len())
            .filter(|&k| self.agents[k].gateway.load(Ordering::Relaxed) == g)
            .collect()
    }
}

/// Marks its agent online while it lives.
struct OnlineGuard {
    fleet: Arc<Fleet>,
    k: usize,
}

impl OnlineGuard {
    fn new(fleet: &Arc<Fleet>, k: usize, gateway: usize) -> OnlineGuard {
        let a = &fleet.agents[k];
        a.gateway.store(gateway, Ordering::Relaxed);
        a.online_at
            .store(fleet.ms(Instant::now()), Ordering::Relaxed);
        a.live.fetch_add(1, Ordering::Relaxed);
        fleet.counts.sessions.fetch_add(1, Ordering::Relaxed);
        OnlineGuard {
            fleet: fleet.clone(),
            k,
        }
    }
}

impl Drop for OnlineGuard {
    fn drop(&mut self) {
        self.fleet.agents[self.k]
            .live
            .fetch_sub(1, Ordering::Relaxed);
    }
}

// ---- one simulated agent ----------------------------------------------------

/// What every simulated agent shares.
#[derive(Debug)]
pub struct FleetSpec {
    /// The run (1-based), part of every account name.
    pub run: usize,
    /// The balancer's port on localhost.
    pub port: u16,
    /// The dev PKI.
    pub pki: DevPki,
    /// Identities in use.
    pub identities: usize,
    /// Objects listed per account.
    pub objects: usize,
    /// Cache-stream heartbeat interval.
    pub heartbeat: Duration,
    /// First reconnect delay cap.
    pub initial_backoff: Duration,
    /// Largest reconnect delay cap.
    pub max_backoff: Duration,
}

/// One simulated agent: agent `k` of the fleet.
pub struct SimAgent {
    k: usize,
    agent_id: String,
    account: String,
    gateway: GatewayConfig,
    spec: Arc<FleetSpec>,
    fleet: Arc<Fleet>,
    /// The agent's TLS sessions (tickets), kept across its reconnects.
    sessions: Arc<dyn rustls::client::ClientSessionStore>,
    /// The cache stream's sequence number, increasing across streams.
    seq: u64,
    /// The resourceVersion of the agent's one kind, bumped per listing.
    rv: u64,
}

/// One online session: the connection and its streams.
struct Live {
    control: Option<tonic::Streaming<ControlEvent>>,
    up: mpsc::Sender<CacheUp>,
    down: tonic::Streaming<CacheDown>,
    since: Instant,
    _online: OnlineGuard,
}

/// How a session ended.
enum Ended {
    /// The connection or its cache stream broke.
    Broken(Instant),
    /// The gateway asked to move, within the grace given (the old session
    /// is kept until the new one is online).
    Reconnect(Box<Live>, Duration),
    /// The bench is done.
    Stopped,
}

/// The one kind each simulated account lists.
fn kind() -> Kind {
    Kind {
        group: String::new(),
        version: "v1".into(),
        resource: "configmaps".into(),
        kind: "ConfigMap".into(),
        namespaced: true,
    }
}

/// Discovery for [`kind`] only: the core group and its resource list.
fn discovery() -> DiscoverySnapshot {
    let doc = |path: &str, body: &str| Document {
        path: path.into(),
        content_type: "application/json".into(),
        body: body.as_bytes().to_vec(),
    };
    DiscoverySnapshot {
        documents: vec![
            doc("/api", r#"{"kind":"APIVersions","versions":["v1"]}"#),
            doc(
                "/api/v1",
                r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["get","list","watch"]}]}"#,
            ),
        ],
    }
}

impl SimAgent {
    /// Agent `k` of `spec`'s fleet.
    fn new(k: usize, spec: Arc<FleetSpec>, fleet: Arc<Fleet>) -> SimAgent {
        let identity = identity_name(k % spec.identities.max(1));
        let cert = format!("agent-{identity}");
        let gateway = GatewayConfig {
            // An IP literal: no resolver thread per dial in a storm.
            url: format!("https://127.0.0.1:{}", spec.port),
            ca_file: Some(spec.pki.ca_cert()),
            cert_file: Some(spec.pki.cert(&cert)),
            key_file: Some(spec.pki.key(&cert)),
            ..GatewayConfig::default()
        };
        SimAgent {
            k,
            agent_id: format!("storm-agent-{k}"),
            account: account_of(k, spec.identities, spec.run),
            gateway,
            spec,
            fleet,
            // Each simulated agent keeps its own tickets, as each real agent
            // (a process of its own) does.
            sessions: Arc::new(rustls::client::ClientSessionMemoryCache::new(4)),
            seq: 0,
            rv: 0,
        }
    }

    fn up(&mut self, msg: cache_up::Msg) -> CacheUp {
        self.seq += 1;
        CacheUp {
            seq: self.seq,
            msg: Some(msg),
        }
    }

    /// A full listing of the kind: `SyncStart`, the objects, `SyncEnd`.
    async fn list(&mut self, up: &mpsc::Sender<CacheUp>) -> bool {
        self.rv += 1;
        let mut msgs = vec![cache_up::Msg::SyncStart(SyncStart { kind: Some(kind()) })];
        for i in 0..self.spec.objects {
            let object = format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}","namespace":"storm","uid":"{}-{i}","resourceVersion":"{}"}},"data":{{"k":"v"}}}}"#,
                self.account, self.rv
            );
            msgs.push(cache_up::Msg::Event(WatchEvent {
                r#type: watch_event::Type::Added.into(),
                kind: Some(kind()),
                resource_version: self.rv.to_string(),
                object: object.into_bytes(),
            }));
        }
        msgs.push(cache_up::Msg::SyncEnd(SyncEnd {
            kind: Some(kind()),
            resource_version: self.rv.to_string(),
        }));
        for m in msgs {
            let m = self.up(m);
            if up.send(m).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Dials, says `Hello`, opens `Control` and `Cache`; online once the
    /// sidecar answered the cache stream.
    async fn open(&mut self) -> Result<Live, (Failure, String)> {
        let stream = |what: &str, s: tonic::Status| {
            (
                Failure::Stream,
                format!("{what}: {:?}: {}", s.code(), s.message()),
            )
        };
        let mut client = match spinlink_agent::connection::connect_with_sessions(
            &self.gateway,
            Some(self.sessions.clone()),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => return Err((classify(&e), chain_of(&e))),
        };
        let hello = client
            .hello(HelloRequest {
                agent_id: self.agent_id.clone(),
                agent_version: "storm".into(),
                accounts: vec![AccountInfo {
                    name: self.account.clone(),
                    kinds: vec!["/v1/configmaps".into()],
                    kubernetes_version: "v1.30.0".into(),
                    ..AccountInfo::default()
                }],
            })
            .await
            .map_err(|s| (Failure::Hello, format!("{:?}: {}", s.code(), s.message())))?
            .into_inner();
        let Some(grant) = hello.granted.iter().find(|g| g.account == self.account) else {
            let reason = hello
                .refused
                .first()
                .map(|r| r.reason.clone())
                .unwrap_or_default();
            return Err((Failure::Refused, reason));
        };
        let gateway = gateway_index(&hello.gateway_id);
        let control = client
            .control(ControlRequest {
                agent_id: self.agent_id.clone(),
            })
            .await
            .map_err(|s| stream("Control", s))?
            .into_inner();
        let (up, rx) = mpsc::channel(UP_QUEUE);
        // The first message goes at once: the gateway opens the upstream
        // stream when it arrives.
        let open = self.up(cache_up::Msg::Open(CacheOpen {
            account: self.account.clone(),
            agent_id: self.agent_id.clone(),
            ..CacheOpen::default()
        }));
        let snapshot = self.up(cache_up::Msg::Discovery(discovery()));
        for m in [open, snapshot] {
            up.send(m)
                .await
                .map_err(|_| (Failure::Stream, "Cache: queue closed".to_owned()))?;
        }
        let request = stream_request(ReceiverStream::new(rx), &self.account, &grant.token)
            .map_err(|e| (Failure::Stream, format!("Cache metadata: {e}")))?;
        let mut down = client
            .cache(request)
            .await
            .map_err(|s| stream("Cache", s))?
            .into_inner();
        // The sidecar's first word is `ResumeFrom`: the stream reached it.
        let first = tokio::time::timeout(STREAM_WAIT, down.message())
            .await
            .map_err(|_| {
                (
                    Failure::Stream,
                    "Cache: no answer from the sidecar".to_owned(),
                )
            })?
            .map_err(|s| stream("Cache", s))?
            .ok_or((Failure::Stream, "Cache: ended unanswered".to_owned()))?;
        let resumed = match first.msg {
            Some(cache_down::Msg::Resume(r)) => r.kinds.iter().any(|kv| {
                kv.kind.as_ref().is_some_and(|k| k.resource == "configmaps")
                    && kv.resource_version == self.rv.to_string()
            }),
            _ => false,
        };
        if !resumed && !self.list(&up).await {
            return Err((Failure::Stream, "Cache: closed while listing".to_owned()));
        }
        Ok(Live {
            control: Some(control),
            up,
            down,
            since: Instant::now(),
            _online: OnlineGuard::new(&self.fleet, self.k, gateway),
        })
    }

    /// Heartbeats until the session breaks, is asked to move, or the bench
    /// stops.
    async fn serve(&mut self, mut live: Live, stop: &mut watch::Receiver<bool>) -> Ended {
        let period = self.spec.heartbeat;
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                _ = stop.changed() => return Ended::Stopped,
                _ = beat.tick() => {
                    let unix_millis = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
                    let m = self.up(cache_up::Msg::Heartbeat(Heartbeat {
                unix_millis,
                ..Default::default()
            }));
                    if live.up.send(m).await.is_err() {
                        return Ended::Broken(live.since);
                    }
                }
                event = next_control(&mut live.control) => match event {
                    Ok(Some(ControlEvent { event: Some(control_event::Event::Reconnect(r)) })) => {
                        let grace = Duration::from_millis(u64::from(r.deadline_millis));
                        return Ended::Reconnect(Box::new(live), grace);
                    }
                    Ok(Some(_)) => {}
                    // The cache stream tells whether the connection is gone.
                    Ok(None) | Err(_) => live.control = None,
                },
                m = live.down.message() => match m {
                    Ok(Some(CacheDown { msg: Some(cache_down::Msg::Resync(_)) })) => {
                        let up = live.up.clone();
                        if !self.list(&up).await {
                            return Ended::Broken(live.since);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return Ended::Broken(live.since),
                },
            }
        }
    }

    /// Runs until `stop`: online, and back online after every break.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(self.spec.initial_backoff, self.spec.max_backoff);
        // The session a `Reconnect` asked to leave, until the new one is up.
        let mut old: Option<Box<Live>> = None;
        loop {
            if *stop.borrow() {
                return;
            }
            let delay = match self.open().await {
                Ok(live) => {
                    old = None;
                    match self.serve(live, &mut stop).await {
                        Ended::Stopped => return,
                        Ended::Reconnect(live, grace) => {
                            // Make-before-break, after the agent's spread
                            // (`move_spread`): keep the old one meanwhile.
                            old = Some(live);
                            tokio::select! {
                                _ = stop.changed() => return,
                                () = tokio::time::sleep(spinlink_agent::backoff::move_spread(grace, MOVE_SPREAD_MAX)) => {}
                            }
                            continue;
                        }
                        Ended::Broken(since) => {
                            if since.elapsed() >= STABLE_CONNECTION {
                                backoff.reset();
                            }
                            backoff.next_delay()
                        }
                    }
                }
                Err((f, why)) => {
                    self.fleet.agents[self.k]
                        .failed
                        .fetch_add(1, Ordering::Relaxed);
                    self.fleet.count(f, why);
                    backoff.next_delay()
                }
            };
            tokio::select! {
                _ = stop.changed() => return,
                () = tokio::time::sleep(delay) => {}
            }
            // A held session that broke meanwhile is no use to keep.
            if old.as_mut().is_some_and(|o| o.up.is_closed()) {
                old = None;
            }
        }
    }
}

/// The next message of the `Control` stream; pending once it has ended.
async fn next_control(
    control: &mut Option<tonic::Streaming<ControlEvent>>,
) -> Result<Option<ControlEvent>, tonic::Status> {
    match control.as_mut() {
        Some(c) => c.message().await,
        None => std::future::pending().await,
    }
}

/// Which step of dialling failed.
fn classify(e: &spinlink_agent::Error) -> Failure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<ConnectError>() {
            return match c {
                ConnectError::Tcp { .. } => Failure::Tcp,
                ConnectError::Tls { .. } => Failure::Tls,
                _ => Failure::Connect,
            };
        }
        source = s.source();
    }
    Failure::Connect
}

/// An error with its sources, `a: b: c` (dialling errors name no secrets).
fn chain_of(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

/// `gw-<n>` → n; anything else 0.
fn gateway_index(id: &str) -> usize {
    id.strip_prefix("gw-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

// ---- metrics ----------------------------------------------------------------

/// The value of every sample of `family` in a Prometheus text exposition,
/// keyed by its label set (`{...}`, empty when none).
pub fn samples(text: &str, family: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(family) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once("} ") {
                Some((l, v)) => (l.to_owned(), v),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(v) => (String::new(), v),
                None => continue,
            },
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            out.insert(labels, v);
        }
    }
    out
}

/// The value of label `name` in a label set as [`samples`] keys it.
pub fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// Accounts the sidecars' metrics show online.
pub fn online_accounts(texts: &[String]) -> HashSet<String> {
    let mut online = HashSet::new();
    for text in texts {
        for (labels, v) in samples(text, "spinlink_sidecar_account_state") {
            if v >= 1.0
                && label(&labels, "state") == Some("online")
                && let Some(a) = label(&labels, "account")
            {
                online.insert(a.to_owned());
            }
        }
    }
    online
}

/// What a gateway counted that makes a handshake fail: refusals by reason,
/// failed handshakes, and authentication failures at the handshake.
#[derive(Debug, Default, Clone)]
pub struct GatewayCounts {
    /// `spinlink_gateway_refusals_total` by reason.
    pub refusals: BTreeMap<String, u64>,
    /// `spinlink_gateway_handshakes_total{result="failed"}` plus
    /// `spinlink_gateway_auth_failures_total{reason="handshake"}`.
    pub handshake_failures: u64,
    /// `spinlink_gateway_connections_open`.
    pub connections_open: u64,
}

impl GatewayCounts {
    /// Parses a gateway's `/metrics`.
    pub fn parse(text: &str) -> GatewayCounts {
        let mut c = GatewayCounts::default();
        for (labels, v) in samples(text, "spinlink_gateway_refusals_total") {
            if let Some(reason) = label(&labels, "reason") {
                *c.refusals.entry(reason.to_owned()).or_default() += v as u64;
            }
        }
        for (labels, v) in samples(text, "spinlink_gateway_handshakes_total") {
            if label(&labels, "result") == Some("failed") {
                c.handshake_failures += v as u64;
            }
        }
        for (labels, v) in samples(text, "spinlink_gateway_auth_failures_total") {
            if label(&labels, "reason") == Some("handshake") {
                c.handshake_failures += v as u64;
            }
        }
        c.connections_open = samples(text, "spinlink_gateway_connections_open")
            .values()
            .sum::<f64>() as u64;
        c
    }

    /// Every refusal and handshake failure.
    pub fn total(&self) -> u64 {
        self.refusals.values().sum::<u64>() + self.handshake_failures
    }

    /// What was counted after `before` (a counter that went back means a
    /// new process: all of it is new).
    pub fn since(&self, before: &GatewayCounts) -> GatewayCounts {
        if self.total() < before.total() {
            return self.clone();
        }
        let mut refusals = self.refusals.clone();
        for (k, v) in refusals.iter_mut() {
            *v -= before.refusals.get(k).copied().unwrap_or(0).min(*v);
        }
        refusals.retain(|_, v| *v > 0);
        GatewayCounts {
            refusals,
            handshake_failures: self.handshake_failures
                - before.handshake_failures.min(self.handshake_failures),
            connections_open: self.connections_open,
        }
    }

    /// `reason n, reason n` or `none`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .refusals
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        if self.handshake_failures > 0 {
            parts.push(format!("handshake failed {}", self.handshake_failures));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

async fn metrics_text(addr: SocketAddr) -> anyhow::Result<String> {
    let body = crate::load::fetch(&format!("http://{addr}/metrics")).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

// ---- the deployment ---------------------------------------------------------

/// One gateway: fixed agent and admin addresses, so a restart comes back
/// where the balancer sends agents.
struct Gateway {
    id: String,
    listen: SocketAddr,
    admin: SocketAddr,
    config: PathBuf,
    proc: Option<Proc>,
    starts: usize,
}

impl Gateway {
    /// Starts (or restarts) the process; a port the kernel still holds is
    /// retried a bounded number of times.
    fn start(&mut self, spinlink: &Path, dir: &Path) -> anyhow::Result<()> {
        let config = self.config.to_str().context("non-UTF-8 path")?.to_owned();
        let mut last = None;
        for _ in 0..20 {
            self.starts += 1;
            let name = format!("{}.{}", self.id, self.starts);
            let mut proc = Proc::start(spinlink, &name, dir, &["gateway", "--config", &config])?;
            match proc.wait_line("listening: gateway ", START_WAIT) {
                Ok(_) => {
                    self.proc = Some(proc);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("{} did not start", self.id)))
    }

    fn pid(&self) -> anyhow::Result<u32> {
        Ok(self.proc.as_ref().context("gateway not running")?.pid())
    }
}

/// Sidecars, gateways and the balancer, running.
struct Deployment {
    _sidecars: Vec<Proc>,
    facades: Vec<SocketAddr>,
    gateways: Vec<Gateway>,
    balancer: Balancer,
    pki: DevPki,
}

fn free_port() -> anyhow::Result<SocketAddr> {
    crate::grpc_peers::free_port()
}

/// The gateway configuration: dev PKI, the policy (identity `i` serves
/// `storm-i-*`), the sidecars as static upstreams, and the listener limits.
fn gateway_yaml(
    id: &str,
    listen: SocketAddr,
    admin: SocketAddr,
    pki: &DevPki,
    tunnels: &[SocketAddr],
    opts: &Options,
) -> String {
    use spinlink_gateway::config::{DEFAULT_HELLO_BURST, DEFAULT_HELLO_PER_SECOND};
    let p = |path: PathBuf| path.display().to_string();
    // The `Hello` bucket is per identity; an identity here stands for this
    // many agents, each of which would have its own bucket in a real fleet.
    let per_identity = opts.agents.div_ceil(opts.identities.max(1)).max(1);
    let mut text = format!(
        "gatewayId: {id}\nlisten: {listen}\nshutdownGraceSeconds: 10\nadmin:\n  listen: {admin}\n\
         tls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
         listener:\n  proxyProtocol: true\n  trustedProxies: ['127.0.0.1']\n\
         \x20 helloPerSecond: {}\n  helloBurst: {}\n",
        p(pki.cert("gateway")),
        p(pki.key("gateway")),
        p(pki.ca_cert()),
        DEFAULT_HELLO_PER_SECOND * per_identity as f64,
        u64::from(DEFAULT_HELLO_BURST) * per_identity as u64,
    );
    if let Some(rate) = opts.handshakes_per_second {
        text.push_str(&format!("  handshakesPerSecond: {rate}\n"));
    }
    if let Some(burst) = opts.handshake_burst {
        text.push_str(&format!("  handshakeBurst: {burst}\n"));
    }
    if let Some(queue) = opts.handshake_queue_seconds {
        text.push_str(&format!("  handshakeQueueSeconds: {queue}\n"));
    }
    if let Some(factor) = opts.load_factor {
        text.push_str(&format!("upstreamPool:\n  loadFactor: {factor}\n"));
    }
    text.push_str("policy:\n");
    for i in 0..opts.identities {
        text.push_str(&format!(
            "- identities: [\"{}\"]\n  accounts: [\"storm-{i}-*\"]\n",
            dev_agent_identity(&identity_name(i))
        ));
    }
    text.push_str("upstreams:\n");
    for t in tunnels {
        text.push_str(&format!("- url: http://{t}\n"));
    }
    text
}

impl Deployment {
    async fn start(opts: &Options, dir: &Path, run: usize) -> anyhow::Result<Deployment> {
        let names: Vec<String> = (0..opts.identities).map(identity_name).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let pki =
            DevPki::ensure(&dir.join("pki"), &refs).map_err(|e| anyhow::anyhow!("dev PKI: {e}"))?;
        let store = opts
            .store_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", dir.join("store.db").display()));
        let lease = opts
            .lease_seconds
            .map(|s| format!("ownership:\n  leaseSeconds: {s}\n"))
            .unwrap_or_default();
        // The sidecars forward to, and take accounts over from, each other
        // as deployed: mutual TLS with the development sidecar identity, on
        // this host's loopback.
        let peer = format!(
            "peer:\n  listen: 127.0.0.1:0\n  allowLoopback: true\n  tls:\n    certFile: {:?}\n    \
             keyFile: {:?}\n    caFile: {:?}\n    peerIdentities: [{:?}]\n",
            pki.cert("sidecar-peer").display().to_string(),
            pki.key("sidecar-peer").display().to_string(),
            pki.ca_cert().display().to_string(),
            spinlink_tls::dev::dev_sidecar_identity(),
        );
        let mut sidecars = Vec::new();
        let (mut tunnels, mut facades) = (Vec::new(), Vec::new());
        for i in 1..=SIDECARS {
            let cfg = dir.join(format!("sidecar-{i}.yaml"));
            std::fs::write(
                &cfg,
                format!(
                    "instanceId: sidecar-r{run}-{i}\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\n\
                     facade:\n  listen: 127.0.0.1:0\nstore:\n  url: \"{store}\"\n{lease}{peer}"
                ),
            )?;
            let cfg = cfg.to_str().context("non-UTF-8 path")?.to_owned();
            let mut s = Proc::start(
                &opts.spinlink,
                &format!("sidecar-{i}"),
                dir,
                &["sidecar", "--config", &cfg],
            )?;
            tunnels.push(
                s.wait_line("listening: sidecar-tunnel ", START_WAIT)?
                    .parse::<SocketAddr>()?,
            );
            facades.push(
                s.wait_line("listening: sidecar-facade ", START_WAIT)?
                    .parse::<SocketAddr>()?,
            );
            sidecars.push(s);
        }
        let mut gateways = Vec::new();
        for i in 1..=GATEWAYS {
            let id = format!("gw-{i}");
            let (listen, admin) = (free_port()?, free_port()?);
            let config = dir.join(format!("{id}.yaml"));
            std::fs::write(
                &config,
                gateway_yaml(&id, listen, admin, &pki, &tunnels, opts),
            )?;
            let mut g = Gateway {
                id,
                listen,
                admin,
                config,
                proc: None,
                starts: 0,
            };
            g.start(&opts.spinlink, dir)?;
            gateways.push(g);
        }
        // PROXY v2 as an NLB sends it, each connection from a network of its
        // own: the gateways' per-network budgets see a fleet, not one host.
        let balancer =
            Balancer::start_with(gateways.iter().map(|g| g.listen).collect(), true).await?;
        Ok(Deployment {
            _sidecars: sidecars,
            facades,
            gateways,
            balancer,
            pki,
        })
    }

    /// Accounts online on the sidecars (a sidecar that does not answer
    /// counts none).
    async fn online(&self) -> HashSet<String> {
        let mut texts = Vec::new();
        for f in &self.facades {
            if let Ok(t) = metrics_text(*f).await {
                texts.push(t);
            }
        }
        online_accounts(&texts)
    }

    async fn gateway_counts(&self, i: usize) -> GatewayCounts {
        metrics_text(self.gateways[i].admin)
            .await
            .map(|t| GatewayCounts::parse(&t))
            .unwrap_or_default()
    }

    /// Each gateway's `spinlink_gateway_handshakes_resumed_total`.
    async fn resumed(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for g in &self.gateways {
            let text = metrics_text(g.admin).await.unwrap_or_default();
            let n: f64 = samples(&text, "spinlink_gateway_handshakes_resumed_total")
                .values()
                .sum();
            out.push(n as u64);
        }
        out
    }

    fn rss(&self, i: usize) -> anyhow::Result<u64> {
        Ok(memory_of(self.gateways[i].pid()?)?.rss)
    }
}

// ---- measuring --------------------------------------------------------------

/// What one storm cost.
#[derive(Debug, Clone)]
pub struct Storm {
    /// Agents that had to come back.
    pub affected: usize,
    /// From the fault until the sidecars showed every account online again
    /// (and every affected agent had a new session).
    pub back: Duration,
    /// From the fault until the last affected agent's new session was online
    /// (the agents' own view).
    pub agents_back: Duration,
    /// What the agents counted meanwhile.
    pub failures: Failures,
    /// The most failed attempts one affected agent made before it was back.
    pub most_failed: u64,
    /// TLS handshakes the gateways resumed from a session ticket meanwhile.
    pub resumed: u64,
    /// What the gateways counted meanwhile.
    pub gateway: GatewayCounts,
    /// The latest error of each kind the agents met meanwhile.
    pub last_errors: BTreeMap<String, String>,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// From the first agent's start until all were online.
    pub connect_all: Duration,
    /// Failures while the fleet first connected.
    pub startup_failures: Failures,
    /// Agent connections per gateway once all were online.
    pub connections: Vec<u64>,
    /// RSS added per agent connection, per gateway, bytes.
    pub rss_per_conn: Vec<f64>,
    /// RSS added over both gateways divided by all agent connections, bytes.
    pub rss_per_conn_all: f64,
    /// RSS of each gateway before the agents and with all of them, bytes.
    pub rss: Vec<(u64, u64)>,
    /// The SIGKILL storm.
    pub kill: Storm,
    /// The SIGTERM drain, when asked for.
    pub drain: Option<Storm>,
}

/// Waits until every account is online on the sidecars and every agent in
/// `of` has a session newer than `since`; returns when that was first seen.
async fn wait_back(
    d: &Deployment,
    fleet: &Fleet,
    n: usize,
    since: Instant,
    of: &[usize],
    wait: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + wait;
    loop {
        let agents = fleet.back_since(since, of);
        if agents == of.len() && fleet.online() == n {
            let online = d.online().await.len();
            if online >= n {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("the sidecars show {online} of {n} accounts online after {wait:?}");
            }
        } else if Instant::now() > deadline {
            bail!(
                "{agents} of {} agents back, {} of {n} online, after {wait:?}",
                of.len(),
                fleet.online()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The gateway (0-based) with the most agents now, and those agents.
fn busiest(fleet: &Fleet) -> (usize, Vec<usize>) {
    (0..GATEWAYS)
        .map(|i| (i, fleet.on_gateway(i + 1)))
        .max_by_key(|(_, of)| of.len())
        .unwrap_or_default()
}

async fn run_once(opts: &Options, dir: &Path, run: usize) -> anyhow::Result<RunResult> {
    let n = opts.agents;
    let mut d = Deployment::start(opts, dir, run).await?;
    // The gateways idle before any agent: the baseline.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<u64> = (0..GATEWAYS)
        .map(|i| d.rss(i))
        .collect::<anyhow::Result<_>>()?;

    let spec = Arc::new(FleetSpec {
        run,
        port: d.balancer.addr.port(),
        pki: d.pki.clone(),
        identities: opts.identities.max(1),
        objects: opts.objects,
        heartbeat: opts.heartbeat,
        initial_backoff: opts.initial_backoff,
        max_backoff: opts.max_backoff,
    });
    let fleet = Fleet::new(n);
    let (stop_tx, stop) = watch::channel(false);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (spec, fleet, stop) = (spec.clone(), fleet.clone(), stop.clone());
        let ramp = opts.ramp;
        // Starting the agents is itself spread over the ramp.
        tasks.spawn(async move {
            let mut inner = tokio::task::JoinSet::new();
            for k in 0..n {
                let at = started + ramp.mul_f64(k as f64 / n.max(1) as f64);
                tokio::time::sleep_until(at.into()).await;
                let agent = SimAgent::new(k, spec.clone(), fleet.clone());
                inner.spawn(agent.run(stop.clone()));
            }
            while inner.join_next().await.is_some() {}
        });
    }
    let everyone: Vec<usize> = (0..n).collect();
    let all_online = wait_back(&d, &fleet, n, started, &everyone, opts.ramp + ONLINE_WAIT)
        .await
        .context("bringing the fleet online")?;
    let connect_all = all_online - started;
    let startup_failures = fleet.failures();
    eprintln!(
        "  {n} agents online in {:.2} s ({} failed attempts)",
        connect_all.as_secs_f64(),
        startup_failures.total()
    );
    tokio::time::sleep(opts.settle).await;
    let mut rss = Vec::new();
    let mut connections = Vec::new();
    let mut rss_per_conn = Vec::new();
    for (i, b) in before.iter().enumerate() {
        let now = d.rss(i)?;
        let conns = d.gateway_counts(i).await.connections_open;
        rss.push((*b, now));
        connections.push(conns);
        rss_per_conn.push(now.saturating_sub(*b) as f64 / conns.max(1) as f64);
    }
    let added: u64 = rss.iter().map(|(b, a)| a.saturating_sub(*b)).sum();
    let rss_per_conn_all = added as f64 / connections.iter().sum::<u64>().max(1) as f64;

    let kill = storm(opts, dir, &mut d, &fleet, n, Fault::Kill).await?;
    let drain = if opts.drain {
        Some(storm(opts, dir, &mut d, &fleet, n, Fault::Drain).await?)
    } else {
        None
    };
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(RunResult {
        connect_all,
        startup_failures,
        connections,
        rss_per_conn,
        rss_per_conn_all,
        rss,
        kill,
        drain,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, restarted at once.
    Kill,
    /// SIGTERM: the gateway drains (`Reconnect{draining}`); restarted once
    /// it exited.
    Drain,
}

/// Faults the busiest gateway and measures until every agent it carried is
/// back and the sidecars show every account online.
async fn storm(
    opts: &Options,
    dir: &Path,
    d: &mut Deployment,
    fleet: &Fleet,
    n: usize,
    fault: Fault,
) -> anyhow::Result<Storm> {
    // Steady first: everyone online on the sidecars.
    wait_back(d, fleet, n, fleet.epoch, &[], ONLINE_WAIT).await?;
    let (g, affected) = busiest(fleet);
    let other = (g + 1) % GATEWAYS;
    let before_agents = fleet.failures();
    let failed = |k: usize| fleet.agents[k].failed.load(Ordering::Relaxed);
    let failed_before: Vec<u64> = affected.iter().map(|&k| failed(k)).collect();
    let resumed_before = d.resumed().await;
    fleet.last.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let before_other = d.gateway_counts(other).await;
    let before_this = d.gateway_counts(g).await;
    let t0 = Instant::now();
    match fault {
        Fault::Kill => {
            // Dropping the process kills it (SIGKILL) and reaps it; the new
            // one binds the same addresses.
            drop(d.gateways[g].proc.take());
            // Blocking waits, off the runtime's workers, which the agents need.
            tokio::task::block_in_place(|| d.gateways[g].start(&opts.spinlink, dir))?;
        }
        Fault::Drain => signal_term(d.gateways[g].pid()?)?,
    }
    let back = wait_back(d, fleet, n, t0, &affected, ONLINE_WAIT)
        .await
        .with_context(|| format!("{fault:?} storm"))?;
    let agents_back = fleet.last_online(&affected).saturating_duration_since(t0);
    let failures = fleet.failures().since(&before_agents);
    let most_failed = affected
        .iter()
        .zip(&failed_before)
        .map(|(&k, b)| failed(k) - b)
        .max()
        .unwrap_or(0);
    let resumed: u64 = d
        .resumed()
        .await
        .iter()
        .zip(&resumed_before)
        .enumerate()
        .map(|(i, (after, before))| match fault {
            // A killed gateway's new process counts from zero.
            Fault::Kill if i == g => *after,
            _ => after.saturating_sub(*before),
        })
        .sum();
    let last_errors = std::mem::take(&mut *fleet.last.lock().unwrap_or_else(|e| e.into_inner()));
    let mut gateway = d.gateway_counts(other).await.since(&before_other);
    let this = match fault {
        // A new process: everything it counted is from the storm.
        Fault::Kill => d.gateway_counts(g).await,
        Fault::Drain => d.gateway_counts(g).await.since(&before_this),
    };
    for (k, v) in this.refusals {
        *gateway.refusals.entry(k).or_default() += v;
    }
    gateway.handshake_failures += this.handshake_failures;
    if fault == Fault::Drain {
        // Once it has drained, the gateway comes back (not measured).
        tokio::task::block_in_place(|| {
            if let Some(p) = d.gateways[g].proc.as_mut() {
                p.wait_exit(Duration::from_secs(30));
            }
            drop(d.gateways[g].proc.take());
            d.gateways[g].start(&opts.spinlink, dir)
        })?;
    }
    Ok(Storm {
        affected: affected.len(),
        back: back - t0,
        agents_back,
        failures,
        most_failed,
        resumed,
        gateway,
        last_errors,
    })
}

/// Sends SIGTERM to `pid`.
fn signal_term(pid: u32) -> anyhow::Result<()> {
    use rustix::process::{Pid, Signal, kill_process};
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .context("bad pid")?;
    kill_process(pid, Signal::TERM).context("SIGTERM")?;
    Ok(())
}

/// The `agent-storm` subcommand's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Simulated agents, one account each.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Client identities the agents share.
    #[arg(long, default_value_t = 10)]
    pub identities: usize,
    /// Objects listed per account.
    #[arg(long, default_value_t = 3)]
    pub objects: usize,
    /// Runs, each on a fresh deployment.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Seconds over which the agents' first connections are spread.
    #[arg(long, default_value_t = 10.0)]
    pub ramp: f64,
    /// Seconds to settle once all are online, before memory is read.
    #[arg(long, default_value_t = 3.0)]
    pub settle: f64,
    /// Seconds between cache-stream heartbeats (the agent's default).
    #[arg(long, default_value_t = spinlink_agent::config::DEFAULT_HEARTBEAT_SECONDS)]
    pub heartbeat: u64,
    /// The agents' first reconnect delay cap, ms (the agent's default).
    #[arg(long, default_value_t = spinlink_agent::config::DEFAULT_INITIAL_BACKOFF_MILLIS)]
    pub initial_backoff_ms: u64,
    /// The agents' largest reconnect delay cap, ms (the agent's default).
    #[arg(long, default_value_t = spinlink_agent::config::DEFAULT_MAX_BACKOFF_MILLIS)]
    pub max_backoff_ms: u64,
    /// The gateways' `listener.handshakesPerSecond` (default: theirs).
    #[arg(long)]
    pub handshakes_per_second: Option<f64>,
    /// The gateways' `listener.handshakeBurst` (default: theirs).
    #[arg(long)]
    pub handshake_burst: Option<u32>,
    /// The gateways' `listener.handshakeQueueSeconds` (default: theirs).
    #[arg(long)]
    pub handshake_queue_seconds: Option<f64>,
    /// The gateways' `upstreamPool.loadFactor` (default: theirs).
    #[arg(long)]
    pub load_factor: Option<f64>,
    /// The sidecars' `ownership.leaseSeconds` (default: theirs).
    #[arg(long)]
    pub lease_seconds: Option<u64>,
    /// The sidecars' `store.url`, e.g. a PostgreSQL database (default: a
    /// fresh SQLite file per run).
    #[arg(long)]
    pub store_url: Option<String>,
    /// Skip the SIGTERM drain after the SIGKILL storm.
    #[arg(long)]
    pub no_drain: bool,
}

/// Runs `agent-storm` with `args`.
pub fn command(args: Args, spinlink: PathBuf, dir: PathBuf, r: &mut Report) -> anyhow::Result<()> {
    let seconds = |s: f64, key: &str| {
        Duration::try_from_secs_f64(s).map_err(|_| anyhow::anyhow!("--{key}: not a duration: {s}"))
    };
    let opts = Options {
        spinlink,
        agents: args.agents,
        identities: args.identities,
        objects: args.objects,
        runs: args.runs,
        ramp: seconds(args.ramp, "ramp")?,
        settle: seconds(args.settle, "settle")?,
        heartbeat: Duration::from_secs(args.heartbeat.max(1)),
        initial_backoff: Duration::from_millis(args.initial_backoff_ms),
        max_backoff: Duration::from_millis(args.max_backoff_ms),
        handshakes_per_second: args.handshakes_per_second,
        handshake_burst: args.handshake_burst,
        handshake_queue_seconds: args.handshake_queue_seconds,
        load_factor: args.load_factor,
        lease_seconds: args.lease_seconds,
        store_url: args.store_url,
        drain: !args.no_drain,
        dir,
    };
    run(&opts, r)
}

/// KiB with one decimal.
fn kib(bytes: f64) -> String {
    format!("{:.1}", bytes / 1024.0)
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn median_f64(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

fn median_u64(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// Runs the benchmark `opts.runs` times, each on a fresh deployment, and
/// reports every run and the medians.
pub fn run(opts: &Options, r: &mut Report) -> anyhow::Result<()> {
    use spinlink_gateway::config::{
        DEFAULT_HANDSHAKE_BURST, DEFAULT_HANDSHAKE_QUEUE_SECONDS, DEFAULT_HANDSHAKES_PER_SECOND,
    };
    anyhow::ensure!(
        opts.agents > 0 && opts.identities > 0,
        "--agents and --identities must be at least 1"
    );
    anyhow::ensure!(opts.runs > 0, "--runs must be at least 1");
    crate::grpc_proxy::raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let per_identity = opts.agents.div_ceil(opts.identities);
    let n = opts.agents;
    r.line(format!(
        "- {n} simulated agents (tokio tasks in the bench process), one account each, over {} client identities; \
         2 gateways behind a TCP balancer in the bench process; 3 sidecars on one {} store; \
         {} objects listed per account; cache heartbeats every {} s; agents' first connections spread over {} s",
        opts.identities,
        match &opts.store_url {
            Some(u) if u.starts_with("postgres") => "PostgreSQL",
            Some(_) => "given",
            None => "SQLite",
        },
        opts.objects,
        opts.heartbeat.as_secs(),
        opts.ramp.as_secs_f64(),
    ));
    r.line(format!(
        "- gateway admission per gateway: handshakesPerSecond {}, handshakeBurst {}, handshakeQueueSeconds {}{}; \
         handshakeReservedPercent {} (for agents returning with a TLS 1.3 ticket), \
         handshakesPerSecondPerSource {} (the balancer names each connection's client by PROXY v2 in a /24 of its own); \
         helloPerSecond and helloBurst × {per_identity} (an identity here stands for {per_identity} agents, each of \
         which would have its own bucket); upstreamPool.loadFactor {}; sidecars' ownership.leaseSeconds {}",
        opts.handshakes_per_second.unwrap_or(DEFAULT_HANDSHAKES_PER_SECOND),
        opts.handshake_burst.unwrap_or(DEFAULT_HANDSHAKE_BURST),
        opts.handshake_queue_seconds.unwrap_or(DEFAULT_HANDSHAKE_QUEUE_SECONDS),
        if opts.handshakes_per_second.is_none()
            && opts.handshake_burst.is_none()
            && opts.handshake_queue_seconds.is_none()
        {
            " (the defaults)"
        } else {
            ""
        },
        spinlink_gateway::config::DEFAULT_HANDSHAKE_RESERVED_PERCENT,
        spinlink_gateway::config::DEFAULT_HANDSHAKES_PER_SECOND_PER_SOURCE,
        opts.load_factor.unwrap_or(spinlink_gateway::config::upstreams::DEFAULT_LOAD_FACTOR),
        opts.lease_seconds.unwrap_or(spinlink_sidecar::config::DEFAULT_LEASE_SECS),
    ));
    r.line(format!(
        "- agents' reconnect backoff: full jitter, first cap {} ms, largest {} s",
        opts.initial_backoff.as_millis(),
        opts.max_backoff.as_secs_f64(),
    ));
    r.line(String::new());
    r.line(format!(
        "| run | all {n} online (s) | failed attempts at start | gateway RSS per agent connection (KiB) | SIGKILL + restart: agents cut | back, sidecars (s) | back, agents' view (s) | failed attempts (agents) | gateway refusals |{}",
        if opts.drain { " SIGTERM drain: agents moved | moved (s) | failed attempts | gateway refusals |" } else { "" }
    ));
    r.line(format!(
        "|---|---|---|---|---|---|---|---|---|{}",
        if opts.drain { "---|---|---|---|" } else { "" }
    ));
    let mut results = Vec::new();
    for i in 0..opts.runs {
        let dir = opts.dir.join(format!("storm-{i}"));
        std::fs::create_dir_all(&dir)?;
        let res = rt
            .block_on(run_once(opts, &dir, i + 1))
            .with_context(|| format!("run {}", i + 1))?;
        let mut row = format!(
            "| {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} |",
            i + 1,
            secs(res.connect_all),
            res.startup_failures.total(),
            kib(res.rss_per_conn_all),
            res.rss_per_conn
                .iter()
                .zip(&res.connections)
                .map(|(b, c)| format!("{} over {c}", kib(*b)))
                .collect::<Vec<_>>()
                .join(", "),
            res.kill.affected,
            secs(res.kill.back),
            secs(res.kill.agents_back),
            describe_failures(&res.kill.failures),
            res.kill.gateway.describe(),
        );
        if let Some(dr) = &res.drain {
            row.push_str(&format!(
                " {} | {} | {} | {} |",
                dr.affected,
                secs(dr.back),
                describe_failures(&dr.failures),
                dr.gateway.describe()
            ));
        }
        r.line(row);
        results.push(res);
    }
    for (i, res) in results.iter().enumerate() {
        let storms = [
            ("SIGKILL", Some(&res.kill)),
            ("SIGTERM", res.drain.as_ref()),
        ];
        for (what, storm) in storms {
            if let Some(st) = storm {
                r.line(format!(
                    "- run {}, {what}: {} of {} agents moved; most failed attempts by one agent: {}; \
                     handshakes resumed from a ticket: {}",
                    i + 1,
                    st.affected,
                    st.affected,
                    st.most_failed,
                    st.resumed
                ));
            }
            for (kind, why) in storm.map(|s| &s.last_errors).into_iter().flatten() {
                r.line(format!(
                    "- run {}, {what}: latest {kind} failure: {why}",
                    i + 1
                ));
            }
        }
    }
    let durations =
        |f: &dyn Fn(&RunResult) -> Duration| -> Vec<Duration> { results.iter().map(f).collect() };
    let med = |v: Vec<Duration>| crate::stats::median(&v).unwrap_or_default();
    r.line(String::new());
    r.line(format!(
        "Medians of {} run(s): all {n} online in {} s; gateway RSS per agent connection {} KiB \
         (each gateway: {} MiB idle → {} MiB with its agents); SIGKILL + restart: back in {} s \
         (agents' view {} s), {} failed attempts at the agents, {} gateway refusals/handshake failures{}",
        results.len(),
        secs(med(durations(&|r| r.connect_all))),
        kib(median_f64(&results.iter().map(|r| r.rss_per_conn_all).collect::<Vec<_>>())),
        crate::agent_chain::mib(median_u64(&results.iter().flat_map(|r| r.rss.iter().map(|x| x.0)).collect::<Vec<_>>())).trim_end_matches(" MiB"),
        crate::agent_chain::mib(median_u64(&results.iter().flat_map(|r| r.rss.iter().map(|x| x.1)).collect::<Vec<_>>())).trim_end_matches(" MiB"),
        secs(med(durations(&|r| r.kill.back))),
        secs(med(durations(&|r| r.kill.agents_back))),
        median_u64(&results.iter().map(|r| r.kill.failures.total()).collect::<Vec<_>>()),
        median_u64(&results.iter().map(|r| r.kill.gateway.total()).collect::<Vec<_>>()),
        if opts.drain {
            let drains: Vec<&Storm> = results.iter().filter_map(|r| r.drain.as_ref()).collect();
            format!(
                "; SIGTERM drain: moved in {} s, {} failed attempts, {} gateway refusals",
                secs(crate::stats::median(&drains.iter().map(|s| s.back).collect::<Vec<_>>()).unwrap_or_default()),
                median_u64(&drains.iter().map(|s| s.failures.total()).collect::<Vec<_>>()),
                median_u64(&drains.iter().map(|s| s.gateway.total()).collect::<Vec<_>>()),
            )
        } else {
            String::new()
        }
    ));
    let goal = results.iter().all(|r| {
        r.kill.back <= Duration::from_secs(10)
            && r.kill.failures.connections() == 0
            && r.kill.gateway.total() == 0
    });
    r.line(format!(
        "Goal (issue 6: all back ≤ 10 s after a gateway restart, no handshake failures): {}",
        if goal {
            "met in every run"
        } else {
            "missed in at least one run"
        }
    ));
    Ok(())
}

/// `0`, or the total with its parts.
fn describe_failures(f: &Failures) -> String {
    if f.total() == 0 {
        return "0".into();
    }
    let parts: Vec<String> = [
        ("tcp", f.tcp),
        ("tls", f.tls),
        ("dial", f.connect),
        ("hello", f.hello),
        ("refused", f.refused),
        ("stream", f.stream),
    ]
    .iter()
    .filter(|(_, v)| *v > 0)
    .map(|(k, v)| format!("{k} {v}"))
    .collect();
    format!("{} ({})", f.total(), parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY: &str = "# HELP spinlink_gateway_refusals Connections refused\n\
spinlink_gateway_refusals_total{reason=\"handshake_rate\"} 7\n\
spinlink_gateway_refusals_total{reason=\"hello_rate\"} 2\n\
spinlink_gateway_handshakes_total{result=\"ok\"} 500\n\
spinlink_gateway_handshakes_total{result=\"failed\"} 1\n\
spinlink_gateway_auth_failures_total{reason=\"handshake\"} 3\n\
spinlink_gateway_auth_failures_total{reason=\"token_missing\"} 9\n\
spinlink_gateway_connections_open 498\n\
spinlink_gateway_connections_total 510\n";

    #[test]
    fn gateway_counts_parse_and_subtract() {
        let c = GatewayCounts::parse(GATEWAY);
        assert_eq!(c.refusals.get("handshake_rate"), Some(&7));
        assert_eq!(c.refusals.get("hello_rate"), Some(&2));
        assert_eq!(c.handshake_failures, 4);
        assert_eq!(c.connections_open, 498);
        assert_eq!(c.total(), 13);
        let later = GatewayCounts::parse(&GATEWAY.replace("} 7", "} 10"));
        let d = later.since(&c);
        assert_eq!(d.refusals.get("handshake_rate"), Some(&3));
        assert_eq!(d.refusals.get("hello_rate"), None);
        assert_eq!(d.describe(), "handshake_rate 3");
        // A restarted process counts from zero: all of it is new.
        let fresh =
            GatewayCounts::parse("spinlink_gateway_refusals_total{reason=\"handshake_rate\"} 1\n");
        assert_eq!(fresh.since(&c).total(), 1);
        assert_eq!(GatewayCounts::default().describe(), "none");
    }

    #[test]
    fn online_accounts_across_sidecars() {
        let a = "spinlink_sidecar_account_state{account=\"storm-0-0\",state=\"online\"} 1\n\
spinlink_sidecar_account_state{account=\"storm-0-0\",state=\"stale\"} 0\n\
spinlink_sidecar_account_state{account=\"storm-1-1\",state=\"online\"} 0\n\
spinlink_sidecar_account_state{account=\"storm-1-1\",state=\"stale\"} 1\n";
        let b = "spinlink_sidecar_account_state{account=\"storm-0-2\",state=\"online\"} 1\n\
spinlink_sidecar_account_state_other{account=\"x\",state=\"online\"} 1\n";
        let online = online_accounts(&[a.to_owned(), b.to_owned()]);
        let mut v: Vec<_> = online.into_iter().collect();
        v.sort();
        assert_eq!(v, ["storm-0-0", "storm-0-2"]);
    }

    #[test]
    fn accounts_follow_identities() {
        assert_eq!(account_of(0, 10, 1), "storm-0-r1-0");
        assert_eq!(account_of(13, 10, 2), "storm-3-r2-13");
        assert_eq!(gateway_index("gw-2"), 2);
        assert_eq!(gateway_index("spinlink-gateway"), 0);
    }

    #[test]
    fn policy_grants_identity_i_its_accounts_only() {
        let pki = DevPki {
            dir: PathBuf::from("/pki"),
        };
        let opts = Options {
            spinlink: PathBuf::new(),
            agents: 100,
            identities: 10,
            objects: 0,
            runs: 1,
            ramp: Duration::ZERO,
            settle: Duration::ZERO,
            heartbeat: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            handshakes_per_second: None,
            handshake_burst: Some(400),
            handshake_queue_seconds: None,
            load_factor: Some(2.0),
            lease_seconds: None,
            store_url: None,
            drain: false,
            dir: PathBuf::new(),
        };
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let yaml = gateway_yaml("gw-1", addr, addr, &pki, &[addr, addr], &opts);
        let config = spinlink_gateway::Config::from_yaml_str(&yaml, "gw-1.yaml").unwrap();
        let policy = spinlink_gateway::identity::Policy::compile(&config.policy).unwrap();
        let id = |i: usize| dev_agent_identity(&identity_name(i));
        assert!(policy.allows(&id(1), &account_of(11, 10, 1)));
        assert!(!policy.allows(&id(1), &account_of(10, 10, 1)));
        // `storm-1-*` must not reach identity 10's accounts.
        assert!(!policy.allows(&id(1), "storm-10-10"));
        // Ten agents per identity: ten times the per-identity Hello budget.
        assert_eq!(
            config.listener.hello_burst,
            10 * spinlink_gateway::config::DEFAULT_HELLO_BURST
        );
        assert_eq!(config.listener.handshake_burst, 400);
        assert_eq!(config.upstreams.len(), 2);
        assert_eq!(config.upstream_pool.load_factor, 2.0);
    }
}
