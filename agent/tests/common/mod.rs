//! A fake gateway + sidecar for the agent's integration tests: an in-process
//! tonic `Tunnel` server over mTLS that grants (or refuses) tokens bound to the
//! connection, records every message and the stream metadata, and can push
//! `RelayDown` requests to the agent.
#![allow(dead_code, missing_docs)]

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use spinlink_proto::v1::tunnel_server::{Tunnel, TunnelServer};
use spinlink_proto::v1::{
    CacheDown, CacheUp, ChannelGrant, ChannelRefusal, ControlEvent, HelloRequest, HelloResponse,
    Reconnect, RelayDown, RelayUp, control_event,
};
use spinlink_tls::config::{ALPN_H2, ClientAuth, ServerFiles, server_config};
use spinlink_tls::dev::DevPki;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Request, Response, Status, Streaming};

/// Longest a test waits for a condition before failing.
pub const WAIT: Duration = Duration::from_secs(30);

/// Identifies one accepted connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId(pub u64);

/// Metadata of one stream as the fake saw it.
#[derive(Debug, Clone)]
pub struct StreamRecord {
    pub method: &'static str,
    pub account: Option<String>,
    pub token: Option<String>,
    pub conn: ConnId,
    /// Whether the token was granted on this connection for this account
    /// and has not expired.
    pub token_valid: bool,
}

/// Everything recorded.
#[derive(Debug, Default)]
pub struct Records {
    pub hellos: Vec<(ConnId, HelloRequest)>,
    /// Hellos refused for the identity's Hello rate, by connection.
    pub rate_refused: Vec<ConnId>,
    pub streams: Vec<StreamRecord>,
    /// (account from metadata, message), in arrival order.
    pub cache_up: Vec<(String, CacheUp)>,
    pub relay_up: Vec<(String, RelayUp)>,
    /// The same messages with the account's relay stream they came on
    /// (0 for its first, 1 for the next…).
    pub relay_up_on: Vec<(String, usize, RelayUp)>,
    /// Relay streams whose request stream the agent ended, as (account,
    /// stream).
    pub relay_ended: Vec<(String, usize)>,
    /// Control streams opened (served after [`FakeGateway::serve_control`]).
    pub control_streams: usize,
    /// Streams whose first message was not `open`, by method.
    pub bad_first: Vec<&'static str>,
}

/// The sending end of a stream the fake serves.
type Down<T> = mpsc::Sender<Result<T, Status>>;

#[derive(Default)]
struct Shared {
    records: Mutex<Records>,
    changed: Option<watch::Sender<u64>>,
    /// Token → (connection, account, expiry).
    tokens: Mutex<HashMap<String, (ConnId, String, i64)>>,
    refuse: Mutex<BTreeSet<String>>,
    /// Hellos answered `RESOURCE_EXHAUSTED`, as the gateway's per-identity
    /// Hello rate does (recorded in [`Records::rate_refused`]).
    hello_rate_exceeded: std::sync::atomic::AtomicBool,
    /// Per account, the sender of each relay stream it opened, in order;
    /// `None` once the fake ended it.
    relay_down: Mutex<HashMap<String, Vec<Option<Down<RelayDown>>>>>,
    /// `Some` once [`FakeGateway::serve_control`]: each Control stream's sender.
    control: Mutex<Option<Vec<Down<ControlEvent>>>>,
    cache_down: Mutex<Vec<mpsc::Sender<Result<CacheDown, Status>>>>,
    token_ttl_secs: AtomicU64,
    next_token: AtomicU64,
}

impl Shared {
    fn bump(&self) {
        if let Some(tx) = &self.changed {
            tx.send_modify(|n| *n += 1);
        }
    }

    fn record(&self, f: impl FnOnce(&mut Records)) {
        f(&mut self.records.lock().unwrap());
        self.bump();
    }
}

/// The fake, running.
pub struct FakeGateway {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    changed: watch::Receiver<u64>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    pki: DevPki,
}

struct Svc {
    shared: Arc<Shared>,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

impl Svc {
    fn check(
        &self,
        method: &'static str,
        md: &tonic::metadata::MetadataMap,
        conn: ConnId,
    ) -> StreamRecord {
        let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let account = get(spinlink_proto::headers::ACCOUNT);
        let token = get(spinlink_proto::headers::TOKEN);
        let token_valid = match (&account, &token) {
            (Some(a), Some(t)) => self
                .shared
                .tokens
                .lock()
                .unwrap()
                .get(t)
                .is_some_and(|(c, acc, exp)| *c == conn && acc == a && *exp > unix_now()),
            _ => false,
        };
        StreamRecord {
            method,
            account,
            token,
            conn,
            token_valid,
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Tunnel for Svc {
    type ControlStream = BoxStream<ControlEvent>;

    async fn control(
        &self,
        _request: Request<spinlink_proto::v1::ControlRequest>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        let mut control = self.shared.control.lock().unwrap();
        let Some(senders) = control.as_mut() else {
            return Err(Status::unimplemented("no Control in this fake"));
        };
        let (tx, rx) = mpsc::channel(16);
        senders.push(tx);
        drop(control);
        self.shared.record(|r| r.control_streams += 1);
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type AssignmentsStream = BoxStream<spinlink_proto::v1::AssignmentsDown>;

    async fn assignments(
        &self,
        _request: Request<Streaming<spinlink_proto::v1::AssignmentsUp>>,
    ) -> Result<Response<Self::AssignmentsStream>, Status> {
        Err(Status::unimplemented("no Assignments in this fake"))
    }

    async fn hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloResponse>, Status> {
        let conn = *request.extensions().get::<ConnId>().unwrap();
        if self.shared.hello_rate_exceeded.load(Ordering::SeqCst) {
            self.shared.record(|r| r.rate_refused.push(conn));
            return Err(Status::resource_exhausted(
                "Hello rate of this identity exceeded; retry later",
            ));
        }
        let hello = request.into_inner();
        let refuse = self.shared.refuse.lock().unwrap().clone();
        let ttl = self.shared.token_ttl_secs.load(Ordering::SeqCst) as i64;
        let mut response = HelloResponse {
            gateway_id: "fake".into(),
            ..Default::default()
        };
        for account in &hello.accounts {
            if refuse.contains(&account.name) {
                response.refused.push(ChannelRefusal {
                    account: account.name.clone(),
                    reason: "not yours".into(),
                });
                continue;
            }
            let n = self.shared.next_token.fetch_add(1, Ordering::SeqCst);
            let token = format!("tok-{}-{}-{n}", conn.0, account.name);
            self.shared.tokens.lock().unwrap().insert(
                token.clone(),
                (conn, account.name.clone(), unix_now() + ttl),
            );
            response.granted.push(ChannelGrant {
                account: account.name.clone(),
                token,
                expires_at_unix: unix_now() + ttl,
            });
        }
        self.shared.record(|r| r.hellos.push((conn, hello)));
        Ok(Response::new(response))
    }

    type CacheStream = BoxStream<CacheDown>;

    async fn cache(
        &self,
        request: Request<Streaming<CacheUp>>,
    ) -> Result<Response<Self::CacheStream>, Status> {
        let conn = *request.extensions().get::<ConnId>().unwrap();
        let rec = self.check("cache", request.metadata(), conn);
        let valid = rec.token_valid;
        let account = rec.account.clone().unwrap_or_default();
        self.shared.record(|r| r.streams.push(rec));
        if !valid {
            return Err(Status::unauthenticated("bad token"));
        }
        let mut inbound = request.into_inner();
        let shared = self.shared.clone();
        let (tx, rx) = mpsc::channel(16);
        // Like the sidecar: resume points first, here always none.
        let resume = spinlink_proto::v1::cache_down::Msg::Resume(Default::default());
        let _ = tx.try_send(Ok(CacheDown { msg: Some(resume) }));
        shared.cache_down.lock().unwrap().push(tx);
        tokio::spawn(async move {
            let mut first = true;
            while let Ok(Some(msg)) = inbound.message().await {
                if first && !matches!(msg.msg, Some(spinlink_proto::v1::cache_up::Msg::Open(_))) {
                    shared.record(|r| r.bad_first.push("cache"));
                }
                first = false;
                shared.record(|r| r.cache_up.push((account.clone(), msg)));
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type RelayStream = BoxStream<RelayDown>;

    async fn relay(
        &self,
        request: Request<Streaming<RelayUp>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        let conn = *request.extensions().get::<ConnId>().unwrap();
        let rec = self.check("relay", request.metadata(), conn);
        let valid = rec.token_valid;
        let account = rec.account.clone().unwrap_or_default();
        self.shared.record(|r| r.streams.push(rec));
        if !valid {
            return Err(Status::unauthenticated("bad token"));
        }
        let mut inbound = request.into_inner();
        let shared = self.shared.clone();
        let (tx, rx) = mpsc::channel(64);
        let stream = {
            let mut down = shared.relay_down.lock().unwrap();
            let streams = down.entry(account.clone()).or_default();
            streams.push(Some(tx));
            streams.len() - 1
        };
        tokio::spawn(async move {
            let mut first = true;
            while let Ok(Some(msg)) = inbound.message().await {
                if first && !matches!(msg.msg, Some(spinlink_proto::v1::relay_up::Msg::Open(_))) {
                    shared.record(|r| r.bad_first.push("relay"));
                }
                first = false;
                shared.record(|r| {
                    r.relay_up_on.push((account.clone(), stream, msg.clone()));
                    r.relay_up.push((account.clone(), msg));
                });
            }
            shared.record(|r| r.relay_ended.push((account, stream)));
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A server-side TLS connection that dies when the fake stops.
struct KillableIo {
    inner: TlsStream<TcpStream>,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
    conn: ConnId,
}

impl KillableIo {
    fn check(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        self.killed.as_mut().poll(cx).is_ready().then(|| {
            std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fake gateway stopped")
        })
    }
}

use std::future::Future;

impl AsyncRead for KillableIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for KillableIo {
    type ConnectInfo = ConnId;
    fn connect_info(&self) -> ConnId {
        self.conn
    }
}

impl FakeGateway {
    /// Starts on a fresh loopback port with a new dev PKI in `dir`.
    pub async fn start(dir: &Path) -> Self {
        Self::start_on(dir, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts on `addr` (to come back where a stopped fake was).
    pub async fn start_on(dir: &Path, addr: SocketAddr) -> Self {
        let pki = DevPki::ensure(dir, &["a1"]).unwrap();
        let tls = server_config(
            ServerFiles {
                cert: &pki.cert("gateway"),
                key: &pki.key("gateway"),
                client_ca: Some(&pki.ca_cert()),
            },
            ClientAuth::Required,
            &[ALPN_H2],
        )
        .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (changed_tx, changed) = watch::channel(0);
        let shared = Arc::new(Shared {
            changed: Some(changed_tx),
            token_ttl_secs: AtomicU64::new(600),
            ..Shared::default()
        });
        let stop = CancellationToken::new();
        let (io_tx, io_rx) = mpsc::channel::<Result<KillableIo, std::io::Error>>(16);
        let accept_stop = stop.clone();
        tokio::spawn(async move {
            let mut next = 0;
            loop {
                let (tcp, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                    () = accept_stop.cancelled() => return,
                };
                next += 1;
                let acceptor = acceptor.clone();
                let io_tx = io_tx.clone();
                let killed = Box::pin(accept_stop.clone().cancelled_owned());
                let conn = ConnId(next);
                tokio::spawn(async move {
                    if let Ok(inner) = acceptor.accept(tcp).await {
                        let _ = io_tx
                            .send(Ok(KillableIo {
                                inner,
                                killed,
                                conn,
                            }))
                            .await;
                    }
                });
            }
        });
        let svc = TunnelServer::new(Svc {
            shared: shared.clone(),
        });
        let server_stop = stop.clone();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    ReceiverStream::new(io_rx),
                    server_stop.cancelled_owned(),
                )
                .await;
        });
        Self {
            addr,
            shared,
            changed,
            stop,
            task: Some(task),
            pki,
        }
    }

    /// Kills every connection and stops listening.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(WAIT, task).await;
        }
    }

    /// Refuses `account` in every later Hello.
    pub fn refuse(&self, account: &str) {
        self.shared
            .refuse
            .lock()
            .unwrap()
            .insert(account.to_owned());
    }

    /// Answers every later Hello `RESOURCE_EXHAUSTED` (`true`) or as before.
    pub fn exceed_hello_rate(&self, exceeded: bool) {
        self.shared
            .hello_rate_exceeded
            .store(exceeded, Ordering::SeqCst);
    }

    /// Grants tokens valid for `secs` from now on.
    pub fn token_ttl(&self, secs: u64) {
        self.shared.token_ttl_secs.store(secs, Ordering::SeqCst);
    }

    /// Sends a `RelayDown` on `account`'s newest relay stream.
    pub async fn relay_down(&self, account: &str, msg: RelayDown) {
        let newest = self.shared.relay_down.lock().unwrap()[account].len() - 1;
        self.relay_down_on(account, newest, msg).await.unwrap();
    }

    /// Sends a `RelayDown` on `account`'s relay stream `stream` (0 for its
    /// first); fails when that stream is gone.
    pub async fn relay_down_on(
        &self,
        account: &str,
        stream: usize,
        msg: RelayDown,
    ) -> Result<(), String> {
        let tx = self
            .shared
            .relay_down
            .lock()
            .unwrap()
            .get(account)
            .and_then(|s| s.get(stream).cloned().flatten())
            .ok_or("no such relay stream")?;
        tx.send(Ok(msg))
            .await
            .map_err(|_| "the relay stream is gone".to_owned())
    }

    /// Ends `account`'s relay stream `stream` towards the agent, with OK, as
    /// the sidecar ends a drained one.
    pub fn end_relay(&self, account: &str, stream: usize) {
        if let Some(tx) = self
            .shared
            .relay_down
            .lock()
            .unwrap()
            .get_mut(account)
            .and_then(|s| s.get_mut(stream))
        {
            tx.take();
        }
    }

    /// Serves `Control` streams from now on (the fake refuses them
    /// otherwise), so [`FakeGateway::reconnect`] can ask the agent to move.
    pub fn serve_control(&self) {
        self.shared
            .control
            .lock()
            .unwrap()
            .get_or_insert_with(Vec::new);
    }

    /// Sends `Reconnect` on every Control stream, as a draining gateway
    /// does (once one is open).
    pub async fn reconnect(&self, deadline: Duration) {
        self.wait_for("a Control stream", |r| r.control_streams > 0)
            .await;
        let senders = self
            .shared
            .control
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_default();
        assert!(!senders.is_empty(), "no Control stream open");
        for tx in senders {
            let event = ControlEvent {
                event: Some(control_event::Event::Reconnect(Reconnect {
                    reason: "draining".into(),
                    deadline_millis: u32::try_from(deadline.as_millis()).unwrap(),
                })),
            };
            let _ = tx.send(Ok(event)).await;
        }
    }

    /// Sends a `CacheDown` on the newest cache stream.
    pub async fn cache_down(&self, msg: CacheDown) {
        let tx = self.shared.cache_down.lock().unwrap().last().cloned();
        tx.expect("cache stream").send(Ok(msg)).await.unwrap();
    }

    /// Runs `f` on the records.
    pub fn with<T>(&self, f: impl FnOnce(&Records) -> T) -> T {
        f(&self.shared.records.lock().unwrap())
    }

    /// Waits until `pred` holds on the records (fails the test after [`WAIT`]).
    pub async fn wait_for(&self, what: &str, mut pred: impl FnMut(&Records) -> bool) {
        let mut changed = self.changed.clone();
        let fut = async {
            loop {
                if self.with(&mut pred) {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(WAIT, fut).await.is_err() {
            panic!("timed out waiting for {what}");
        }
    }

    /// The PKI the fake serves with.
    pub fn pki(&self) -> &DevPki {
        &self.pki
    }

    /// Agent YAML for this fake and the given accounts `(name, kubeconfig)`.
    pub fn agent_yaml(&self, accounts: &[(&str, &Path)]) -> String {
        let mut yaml = format!(
            "agentId: a1\n\
             gateway:\n  url: https://127.0.0.1:{port}\n  caFile: {ca}\n  certFile: {crt}\n  keyFile: {key}\n\
             reconnect:\n  initialBackoffMillis: 50\n  maxBackoffMillis: 500\n\
             heartbeatSeconds: 1\n\
             kubernetes:\n  accounts:\n",
            port = self.addr.port(),
            ca = self.pki.ca_cert().display(),
            crt = self.pki.cert("agent-a1").display(),
            key = self.pki.key("agent-a1").display(),
        );
        for (name, kc) in accounts {
            yaml.push_str(&format!(
                "    - name: {name}\n      kubeconfigFile: {}\n",
                kc.display()
            ));
        }
        yaml
    }
}

/// Polls `f` until it holds, failing after [`WAIT`]: for state the agent
/// publishes without a notification (its metrics).
pub async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes a kubeconfig pointing at `server` (no credentials).
pub fn write_plain_kubeconfig(path: &Path, server: &str) -> PathBuf {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
         users:\n- name: u\n  user: {{}}\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\n\
         current-context: ctx\n"
    );
    std::fs::write(path, text).unwrap();
    path.to_owned()
}

/// Every byte the agent sent, as one lossy string (for sentinel checks).
pub fn all_bytes(records: &Records) -> String {
    use prost::Message;
    let mut out = Vec::new();
    for (_, m) in &records.cache_up {
        out.extend(m.encode_to_vec());
    }
    for (_, m) in &records.relay_up {
        out.extend(m.encode_to_vec());
    }
    String::from_utf8_lossy(&out).into_owned()
}
