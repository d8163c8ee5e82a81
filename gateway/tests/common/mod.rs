//! Shared fixtures for the gateway's integration tests: the development PKI,
//! a fake sidecar (a tonic `Tunnel` server over h2c or mTLS that records what
//! reaches it), a gateway started from YAML, and agent channels over one
//! dedicated TLS connection each; the process's log lines captured in memory
//! ([`capture_logs`]).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use http::HeaderMap;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use spinlink_gateway::stats::Stats;
use spinlink_gateway::{Config, Gateway};
use spinlink_proto::headers;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::tunnel_server::{Tunnel, TunnelServer};
use spinlink_proto::v1::{
    AccountInfo, Ack, CacheDown, CacheUp, HelloRequest, HelloResponse, RelayDown, RelayUp,
    cache_down, relay_down,
};
use spinlink_tls::config::{
    ALPN_H2, ClientAuth, ClientFiles, ServerFiles, client_config, server_config,
};
use spinlink_tls::dev::DevPki;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

/// Upper bound for anything a test waits for; a hang fails instead of blocking.
pub const WAIT: Duration = Duration::from_secs(20);

pub const A1: &str = "spiffe://spinlink.dev/agent/a1";

/// A development PKI in a temporary directory.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub pki: DevPki,
}

pub fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::ensure(dir.path(), &["a1", "a2"]).unwrap();
    Pki { dir, pki }
}

/// One stream as the fake sidecar saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: &'static str,
    pub headers: HeaderMap,
}

/// What the fake sidecar recorded.
#[derive(Debug, Default)]
pub struct Record {
    pub streams: Vec<Seen>,
    pub messages: usize,
    /// Identity of the client certificate of each TLS connection.
    pub tls_peers: Vec<String>,
    pub connections: usize,
}

#[derive(Clone)]
struct FakeTunnel {
    record: Arc<Mutex<Record>>,
    /// `Cache` streams of this account are never read (a stalled sidecar).
    stall: Option<&'static str>,
    /// `Cache` streams of these accounts get [`FLOOD_BYTES`] sent down at
    /// once, however slowly the agent reads.
    flood: &'static [&'static str],
}

/// What a flooding sidecar sends down each flooded `Cache` stream.
pub const FLOOD_BYTES: usize = 4 << 20;

type DownStream<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl Tunnel for FakeTunnel {
    type ControlStream = DownStream<spinlink_proto::v1::ControlEvent>;

    async fn control(
        &self,
        _request: Request<spinlink_proto::v1::ControlRequest>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        Err(Status::unimplemented("Control is answered by the gateway"))
    }

    async fn hello(&self, _r: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        Err(Status::internal("the sidecar never answers Hello"))
    }

    type CacheStream = DownStream<CacheDown>;

    async fn cache(
        &self,
        request: Request<Streaming<CacheUp>>,
    ) -> Result<Response<Self::CacheStream>, Status> {
        self.record.lock().unwrap().streams.push(Seen {
            method: "Cache",
            headers: request.metadata().clone().into_headers(),
        });
        let stalled = self.stall.is_some_and(|account| {
            request
                .metadata()
                .get(headers::VERIFIED_ACCOUNT)
                .is_some_and(|v| v == account)
        });
        let flooded = request
            .metadata()
            .get(headers::VERIFIED_ACCOUNT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|account| self.flood.contains(&account));
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let record = self.record.clone();
        if flooded {
            let tx = tx.clone();
            tokio::spawn(async move {
                let kind = "k".repeat(60 << 10);
                for _ in 0..FLOOD_BYTES / (60 << 10) {
                    let resync = CacheDown {
                        msg: Some(cache_down::Msg::Resync(spinlink_proto::v1::Resync {
                            kinds: vec![spinlink_proto::v1::Kind {
                                resource: kind.clone(),
                                ..Default::default()
                            }],
                        })),
                    };
                    if tx.send(Ok(resync)).await.is_err() {
                        return;
                    }
                }
            });
        }
        if stalled {
            // Held open, never read: its flow-control windows fill up.
            tokio::spawn(async move {
                let _held = (inbound, tx);
                std::future::pending::<()>().await;
            });
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        tokio::spawn(async move {
            while let Some(Ok(up)) = inbound.next().await {
                record.lock().unwrap().messages += 1;
                let ack = CacheDown {
                    msg: Some(cache_down::Msg::Ack(Ack { seq: up.seq })),
                };
                if tx.send(Ok(ack)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type AssignmentsStream = DownStream<spinlink_proto::v1::AssignmentsDown>;

    /// Records the stream and answers every message with a heartbeat.
    async fn assignments(
        &self,
        request: Request<Streaming<spinlink_proto::v1::AssignmentsUp>>,
    ) -> Result<Response<Self::AssignmentsStream>, Status> {
        use spinlink_proto::v1::{AssignmentsDown, Heartbeat, assignments_down};
        self.record.lock().unwrap().streams.push(Seen {
            method: "Assignments",
            headers: request.metadata().clone().into_headers(),
        });
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let record = self.record.clone();
        tokio::spawn(async move {
            while let Some(Ok(_up)) = inbound.next().await {
                record.lock().unwrap().messages += 1;
                let beat = AssignmentsDown {
                    msg: Some(assignments_down::Msg::Heartbeat(Heartbeat {
                        unix_millis: 1,
                        ..Default::default()
                    })),
                };
                if tx.send(Ok(beat)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type RelayStream = DownStream<RelayDown>;

    async fn relay(
        &self,
        request: Request<Streaming<RelayUp>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        self.record.lock().unwrap().streams.push(Seen {
            method: "Relay",
            headers: request.metadata().clone().into_headers(),
        });
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let record = self.record.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while let Some(Ok(_up)) = inbound.next().await {
                record.lock().unwrap().messages += 1;
                n += 1;
                let down = RelayDown {
                    msg: Some(relay_down::Msg::Heartbeat(spinlink_proto::v1::Heartbeat {
                        unix_millis: n,
                        ..Default::default()
                    })),
                };
                if tx.send(Ok(down)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// An in-process sidecar tunnel endpoint.
pub struct FakeSidecar {
    pub addr: SocketAddr,
    pub record: Arc<Mutex<Record>>,
    stop: CancellationToken,
}

impl Drop for FakeSidecar {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeSidecar {
    /// A sidecar over h2c with prior knowledge.
    pub async fn plain() -> Self {
        Self::start("127.0.0.1:0".parse().unwrap(), None).await
    }

    /// A sidecar over h2c that never reads `account`'s `Cache` streams.
    pub async fn stalling(account: &'static str) -> Self {
        Self::start_with("127.0.0.1:0".parse().unwrap(), None, Some(account), &[]).await
    }

    /// A sidecar over h2c that sends [`FLOOD_BYTES`] down every `Cache`
    /// stream of `accounts` as soon as it opens.
    pub async fn flooding(accounts: &'static [&'static str]) -> Self {
        Self::start_with("127.0.0.1:0".parse().unwrap(), None, None, accounts).await
    }

    /// A sidecar over h2c on a given address (a restarted one).
    pub async fn plain_on(addr: SocketAddr) -> Self {
        Self::start(addr, None).await
    }

    /// A sidecar over mTLS: its own certificate, client certificates from the
    /// dev CA required.
    pub async fn mtls(pki: &DevPki) -> Self {
        let config = server_config(
            ServerFiles {
                cert: &pki.cert("sidecar"),
                key: &pki.key("sidecar"),
                client_ca: Some(&pki.ca_cert()),
            },
            ClientAuth::Required,
            &[ALPN_H2],
        )
        .unwrap();
        Self::start(
            "127.0.0.1:0".parse().unwrap(),
            Some(TlsAcceptor::from(Arc::new(config))),
        )
        .await
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn tls_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn streams(&self) -> Vec<Seen> {
        self.record.lock().unwrap().streams.clone()
    }

    async fn start(addr: SocketAddr, tls: Option<TlsAcceptor>) -> Self {
        Self::start_with(addr, tls, None, &[]).await
    }

    async fn start_with(
        addr: SocketAddr,
        tls: Option<TlsAcceptor>,
        stall: Option<&'static str>,
        flood: &'static [&'static str],
    ) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let record = Arc::new(Mutex::new(Record::default()));
        let stop = CancellationToken::new();
        let server = TunnelServer::new(FakeTunnel {
            record: record.clone(),
            stall,
            flood,
        });
        tokio::spawn({
            let record = record.clone();
            let stop = stop.clone();
            async move {
                loop {
                    let (tcp, _) = tokio::select! {
                        () = stop.cancelled() => return,
                        a = listener.accept() => match a { Ok(a) => a, Err(_) => return },
                    };
                    tcp.set_nodelay(true).unwrap();
                    record.lock().unwrap().connections += 1;
                    let service = TowerToHyperService::new(server.clone());
                    let tls = tls.clone();
                    let record = record.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        let mut builder =
                            hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                        // As the sidecar's tunnel server (TUNNEL_CONNECTION_WINDOW):
                        // one stream's window cannot use up the connection's.
                        builder.initial_connection_window_size(64 << 20);
                        match tls {
                            None => {
                                let conn = builder.serve_connection(TokioIo::new(tcp), service);
                                tokio::select! { _ = conn => {}, () = stop.cancelled() => {} }
                            }
                            Some(acceptor) => {
                                let Ok(tls) = acceptor.accept(tcp).await else {
                                    return;
                                };
                                let peer = tls.get_ref().1.peer_certificates().and_then(|c| {
                                    spinlink_tls::identity::identity_from_cert(
                                        &c[0],
                                        &spinlink_tls::identity::DEFAULT_IDENTITY_ORDER,
                                    )
                                    .ok()
                                    .flatten()
                                });
                                record
                                    .lock()
                                    .unwrap()
                                    .tls_peers
                                    .push(peer.unwrap_or_default());
                                let conn = builder.serve_connection(TokioIo::new(tls), service);
                                tokio::select! { _ = conn => {}, () = stop.cancelled() => {} }
                            }
                        }
                    });
                }
            }
        });
        Self { addr, record, stop }
    }
}

/// A running gateway.
pub struct RunningGateway {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub stats: Arc<Stats>,
    pub upstreams: Arc<spinlink_gateway::upstream::UpstreamSet>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<spinlink_gateway::Result<()>>,
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// YAML for a TLS gateway with the dev PKI, letting agents serve `dev-*` and
/// `staging`; `extra` is appended (upstreams, upstreamTls, ...).
pub fn tls_gateway_yaml(pki: &DevPki, extra: &str) -> String {
    let p = |path: &Path| path.display().to_string();
    format!(
        "gatewayId: gw-test\n\
         listen: 127.0.0.1:0\n\
         tls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
         policy:\n  - identities: ['spiffe://spinlink.dev/agent/*']\n    accounts: ['dev-*', staging]\n\
         {extra}",
        p(&pki.cert("gateway")),
        p(&pki.key("gateway")),
        p(&pki.ca_cert()),
    )
}

pub async fn start_gateway(yaml: &str) -> RunningGateway {
    let config = Config::from_yaml_str(yaml, "test.yaml").unwrap();
    let gateway = Gateway::bind(config).await.unwrap();
    let addr = gateway.local_addr();
    let admin = gateway.admin_addr();
    let stats = gateway.stats();
    let upstreams = gateway.upstreams();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(gateway.run(shutdown.clone()));
    RunningGateway {
        addr,
        admin,
        stats,
        upstreams,
        shutdown,
        task,
    }
}

/// A tonic channel over exactly one TLS connection to `addr`, presenting
/// `agent`'s certificate (or none).
pub async fn agent_channel(
    addr: SocketAddr,
    pki: &DevPki,
    agent: Option<(&Path, &Path)>,
) -> anyhow::Result<Channel> {
    let ca = pki.ca_cert();
    let config = client_config(
        ClientFiles {
            ca: &ca,
            identity: agent,
        },
        &[ALPN_H2],
    )?;
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into()?, tcp)
        .await?;
    one_connection_channel(TokioIo::new(tls)).await
}

pub async fn agent_a1(addr: SocketAddr, pki: &DevPki) -> Channel {
    agent_channel(
        addr,
        pki,
        Some((&pki.cert("agent-a1"), &pki.key("agent-a1"))),
    )
    .await
    .unwrap()
}

/// A channel that uses `io` and never dials again.
pub async fn one_connection_channel<I>(io: I) -> anyhow::Result<Channel>
where
    I: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
{
    let slot = Arc::new(Mutex::new(Some(io)));
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let io = slot.lock().unwrap().take();
        async move { io.ok_or_else(|| std::io::Error::other("connection already used")) }
    });
    Ok(Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await?)
}

pub fn account(name: &str) -> AccountInfo {
    AccountInfo {
        name: name.to_owned(),
        ..AccountInfo::default()
    }
}

pub async fn hello(channel: &Channel, accounts: &[&str]) -> Result<HelloResponse, Status> {
    let mut client = TunnelClient::new(channel.clone());
    let request = HelloRequest {
        agent_id: "a1".into(),
        agent_version: "test".into(),
        accounts: accounts.iter().map(|a| account(a)).collect(),
    };
    Ok(client.hello(request).await?.into_inner())
}

/// The token `Hello` granted for `account`.
pub async fn token_for(channel: &Channel, account: &str) -> String {
    let resp = hello(channel, &[account]).await.unwrap();
    resp.granted
        .iter()
        .find(|g| g.account == account)
        .with_context(|| format!("{account} not granted: {:?}", resp.refused))
        .unwrap()
        .token
        .clone()
}

/// A request with stream metadata set.
pub fn with_metadata<T>(message: T, account: &str, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    let md = request.metadata_mut();
    md.insert(headers::ACCOUNT, account.parse().unwrap());
    md.insert(headers::TOKEN, token.parse().unwrap());
    request
}

/// Opens a Cache stream and returns the sender of up messages and the down
/// stream (or the status the stream was refused with).
pub async fn open_cache(
    channel: &Channel,
    request: impl FnOnce(ReceiverStream<CacheUp>) -> Request<ReceiverStream<CacheUp>>,
) -> Result<(mpsc::Sender<CacheUp>, Streaming<CacheDown>), Status> {
    let (tx, rx) = mpsc::channel(16);
    // The first message goes at once, as agents do.
    tx.send(CacheUp { seq: 1, msg: None }).await.unwrap();
    let mut client = TunnelClient::new(channel.clone());
    let down = client.cache(request(ReceiverStream::new(rx))).await?;
    Ok((tx, down.into_inner()))
}

/// A `Cache` stream for `account` with `token` whose first message the
/// sidecar acked.
pub async fn acked_cache(
    channel: &Channel,
    account: &str,
    token: &str,
) -> (mpsc::Sender<CacheUp>, Streaming<CacheDown>) {
    let (tx, mut down) = open_cache(channel, |s| with_metadata(s, account, token))
        .await
        .unwrap_or_else(|e| panic!("{account}: {e:?}"));
    assert_eq!(next_ack(&mut down).await.unwrap(), 1);
    (tx, down)
}

/// Reads the next message of a down stream as an ack number.
pub async fn next_ack(down: &mut Streaming<CacheDown>) -> Result<u64, Status> {
    let msg = tokio::time::timeout(WAIT, down.message())
        .await
        .map_err(|_| Status::deadline_exceeded("test wait"))??
        .ok_or_else(|| Status::unknown("stream ended"))?;
    match msg.msg {
        Some(cache_down::Msg::Ack(Ack { seq })) => Ok(seq),
        other => Err(Status::unknown(format!("not an ack: {other:?}"))),
    }
}

/// A TLS connection over `tcp` presenting agent `name`'s certificate
/// (`agent-a1`), offering h2.
pub async fn agent_tls_over(
    tcp: TcpStream,
    pki: &DevPki,
    name: &str,
) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let ca = pki.ca_cert();
    let (cert, key) = (pki.cert(name), pki.key(name));
    let config = client_config(
        ClientFiles {
            ca: &ca,
            identity: Some((&cert, &key)),
        },
        &[ALPN_H2],
    )?;
    tcp.set_nodelay(true)?;
    Ok(TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into()?, tcp)
        .await?)
}

/// A tonic channel for agent a1 over `tcp` (already connected, perhaps with
/// a PROXY header written).
pub async fn agent_a1_over(tcp: TcpStream, pki: &DevPki) -> anyhow::Result<Channel> {
    let tls = agent_tls_over(tcp, pki, "agent-a1").await?;
    one_connection_channel(TokioIo::new(tls)).await
}

/// `GET path` on a plain HTTP/1.1 port: status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    tokio::time::timeout(WAIT, tcp.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Waits until `stats` count at least `n` refusals for `reason`.
pub async fn wait_refusals(stats: &Stats, reason: spinlink_gateway::stats::Refusal, n: u64) {
    tokio::time::timeout(
        WAIT,
        stats.wait_until(|s| s.metrics().refusals(reason) >= n),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no {n} refusals for {reason:?}: {}",
            stats.metrics().refusals(reason)
        )
    });
}

/// Whether the peer closed `tcp` (EOF or reset) within [`WAIT`].
pub async fn closed_by_peer<S: tokio::io::AsyncRead + Unpin>(tcp: &mut S) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(WAIT, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// Everything logged in this test process since [`capture_logs`], and a
/// signal bumped on every write.
struct Captured {
    text: Mutex<Vec<u8>>,
    written: tokio::sync::watch::Sender<usize>,
}

static CAPTURED: OnceLock<Arc<Captured>> = OnceLock::new();

/// One write of the subscriber into the buffer.
struct CaptureWriter(Arc<Captured>);

impl std::io::Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.text.lock().unwrap().extend_from_slice(buf);
        self.0.written.send_modify(|n| *n += buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs, once per test process, a global subscriber that writes every
/// event of every crate at TRACE, without colours or timestamps, into
/// memory. nextest runs each test in a process of its own, so what
/// [`logs`] returns is that test's; call this before starting the gateway.
pub fn capture_logs() {
    CAPTURED.get_or_init(|| {
        let captured = Arc::new(Captured {
            text: Mutex::new(Vec::new()),
            written: tokio::sync::watch::Sender::new(0),
        });
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .without_time()
            .with_writer(move || CaptureWriter(writer.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("another global subscriber is installed");
        captured
    });
}

/// The text captured so far (empty unless [`capture_logs`] ran).
pub fn logs() -> String {
    CAPTURED.get().map_or_else(String::new, |c| {
        String::from_utf8_lossy(&c.text.lock().unwrap()).into_owned()
    })
}

/// Waits (at most [`WAIT`]) for a captured line with every one of `parts`,
/// and returns it; the panic shows what was captured.
pub async fn wait_log_line(parts: &[&str]) -> String {
    let captured = CAPTURED.get().expect("capture_logs() not called");
    let mut written = captured.written.subscribe();
    let find = || {
        logs()
            .lines()
            .find(|line| parts.iter().all(|p| line.contains(p)))
            .map(str::to_owned)
    };
    let found = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(line) = find() {
                return line;
            }
            // The sender lives in a static: `changed` cannot fail.
            let _ = written.changed().await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no log line with all of {parts:?} in:\n{}", logs()))
}

/// Polls `done` every 10 ms until it holds, for state nothing signals (a
/// gauge); panics naming `what` after [`WAIT`].
pub async fn eventually(what: &str, done: impl Fn() -> bool) {
    let polled = tokio::time::timeout(WAIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(polled.is_ok(), "{what}: not within {WAIT:?}");
}

/// Streams open now and carried in all to the upstream `url`, as its
/// `streams_open` and `streams_total` series say.
pub fn upstream_streams(stats: &Stats, url: &str) -> (i64, u64) {
    let label = spinlink_gateway::stats::metrics::UpstreamLabel {
        upstream: url.to_owned(),
    };
    let m = stats.metrics();
    (
        m.streams_open.get(&label).map_or(0, |g| g.get()),
        m.streams.get(&label).map_or(0, |c| c.get()),
    )
}

/// A bare HTTP/2 client over one agent TLS connection: frames as written
/// and read, so a GOAWAY, a refused stream or a hostile frame can be sent
/// and seen as such.
pub struct RawH2 {
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    /// Its HPACK encoder, with the default 4 KiB table.
    pub enc: spinlink_http2::hpack::Encoder,
    rbuf: bytes::BytesMut,
}

impl RawH2 {
    /// Agent a1's TLS connection to `addr`, with the preface and an empty
    /// SETTINGS sent.
    pub async fn connect(addr: SocketAddr, pki: &DevPki) -> Self {
        let mut out = bytes::BytesMut::from(&spinlink_http2::frame::PREFACE[..]);
        spinlink_http2::frame::Settings::default().write(&mut out);
        let mut raw = Self::connect_silent(addr, pki).await;
        raw.send(&out).await;
        raw
    }

    /// Agent a1's TLS connection to `addr`, with nothing sent on it.
    pub async fn connect_silent(addr: SocketAddr, pki: &DevPki) -> Self {
        let tcp = TcpStream::connect(addr).await.unwrap();
        Self {
            tls: agent_tls_over(tcp, pki, "agent-a1").await.unwrap(),
            enc: spinlink_http2::hpack::Encoder::new(4096),
            rbuf: bytes::BytesMut::new(),
        }
    }

    /// Writes `bytes` as they are.
    pub async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.tls.write_all(bytes).await.unwrap();
        self.tls.flush().await.unwrap();
    }

    /// HEADERS (and CONTINUATIONs) with `block` for stream `id`, not ending it.
    pub async fn headers(&mut self, id: u32, block: &[u8]) {
        let mut out = bytes::BytesMut::new();
        spinlink_http2::frame::write_headers(&mut out, id, block, false, 16_384);
        self.send(&out).await;
    }

    /// HEADERS opening stream `id` on `path` (not ending it).
    pub async fn open(&mut self, id: u32, path: &str) {
        use spinlink_http2::hpack::Indexing;
        let fields: [(&[u8], &[u8]); 5] = [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", path.as_bytes()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ];
        let mut block = bytes::BytesMut::new();
        self.enc.encode(
            fields.iter().map(|(n, v)| (*n, *v, Indexing::Indexed)),
            &mut block,
        );
        self.headers(id, &block).await;
    }

    /// A PING, and its answer: every frame sent before it has been read.
    pub async fn ping(&mut self) {
        let mut out = bytes::BytesMut::new();
        spinlink_http2::frame::write_ping(&mut out, false, *b"spinlink");
        self.send(&out).await;
        let answer = self.until(spinlink_http2::frame::kind::PING, 0).await;
        assert_eq!(answer, b"spinlink");
    }

    /// The next frame of `kind` on `stream`, answering SETTINGS on the way;
    /// its payload.
    pub async fn until(&mut self, want: u8, stream: u32) -> Vec<u8> {
        use spinlink_http2::frame::{self, flag, kind};
        tokio::time::timeout(WAIT, async {
            loop {
                let (head, payload) = self.next().await;
                if head.kind == kind::SETTINGS && head.flags & flag::ACK == 0 {
                    let mut ack = bytes::BytesMut::new();
                    frame::write_settings_ack(&mut ack);
                    self.send(&ack).await;
                }
                if head.kind == want && head.stream == stream {
                    return payload;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no frame of kind {want} on stream {stream}"))
    }

    /// The GOAWAY the gateway ends the connection with, as its error code,
    /// once the gateway has also closed the connection (within [`WAIT`]).
    pub async fn goaway_then_closed(&mut self) -> spinlink_http2::Reason {
        let payload = self.until(spinlink_http2::frame::kind::GOAWAY, 0).await;
        let reason = spinlink_http2::Reason(word(&payload[4..]));
        assert!(
            closed_by_peer(&mut self.tls).await,
            "still open after GOAWAY {reason}"
        );
        reason
    }

    /// Whether the gateway closed the connection within [`WAIT`] (whatever
    /// it wrote before).
    pub async fn closed(&mut self) -> bool {
        closed_by_peer(&mut self.tls).await
    }

    /// The next frame, whole.
    pub async fn next(&mut self) -> (spinlink_http2::Head, Vec<u8>) {
        use spinlink_http2::frame::{HEAD_LEN, Head};
        use tokio::io::AsyncReadExt;
        loop {
            if let Some(head) = Head::parse(&self.rbuf)
                && self.rbuf.len() >= HEAD_LEN + head.len
            {
                let bytes = self.rbuf.split_to(HEAD_LEN + head.len);
                return (head, bytes[HEAD_LEN..].to_vec());
            }
            let n = self.tls.read_buf(&mut self.rbuf).await.unwrap();
            assert_ne!(n, 0, "connection closed");
        }
    }
}

/// The first four bytes of a payload as a number (GOAWAY's last stream id,
/// RST_STREAM's error code).
pub fn word(payload: &[u8]) -> u32 {
    u32::from_be_bytes(payload[..4].try_into().unwrap())
}
