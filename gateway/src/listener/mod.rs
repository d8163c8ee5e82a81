//! The agent listener. Per accepted TCP connection (TCP_NODELAY), in order:
//!
//! 1. a slot of `listener.maxConnections`, held until the connection ends;
//! 2. with `listener.proxyProtocol`, the PROXY v1/v2 header ([`proxy_protocol`])
//!    from a `trustedProxies` address ([`crate::cidr`]) within its timeout; the client
//!    address it names is the one logs use from then on ([`read_proxy_header`]),
//!    and its network the one `client_connections_total` counts
//!    ([`crate::stats::client_networks`]);
//! 3. the first record of the ClientHello, read within
//!    `handshakeTimeoutSeconds` and left for rustls: a session ticket this
//!    deployment issued ([`crate::tls::tickets`]) marks a returning agent;
//! 4. admission ([`limits::Admission`]): a token of the handshake bucket
//!    (`handshakesPerSecond`; past the burst a connection waits its turn for
//!    at most `handshakeQueueSeconds`, then is refused). A stranger (no
//!    ticket) must also fit its client network's budget
//!    (`handshakesPerSecondPerSource`, refused at once past it) and the
//!    strangers' share of the rate (all but `handshakeReservedPercent`), so
//!    neither one source nor a crowd of them keeps returning agents out;
//! 5. mTLS with the configuration current *now* ([`crate::tls::ServerTls`],
//!    reloaded from disk) within `handshakeTimeoutSeconds`;
//! 6. the connection is named — identity from the leaf certificate, binding
//!    from the TLS exporter — and served by the tunnel
//!    ([`crate::tunnel::server`]) with that name; its HTTP/2 preface and
//!    first SETTINGS are due within `prefaceTimeoutSeconds`.
//!
//! With an `ingress` configured, step 3 onwards is [`ingress`]'s: TLS chosen
//! by SNI, HTTP/1.1 and HTTP/2, requests routed as nginx would, agent names
//! and tunnel paths still reaching step 4.
//!
//! Every refusal is counted by reason ([`crate::stats::Refusal`]). A connection
//! with no open stream for `idleTimeoutSeconds` is closed. Past its maximum
//! age (with jitter) the agent gets `Reconnect{max-age}` on its `Control`
//! stream and GOAWAY after the grace. On shutdown the listener stops accepting
//! and every connection gets `Reconnect{draining}` and GOAWAY (in-flight
//! streams go on) and is closed when the grace period ends.

mod activity;
pub mod ingress;
pub mod limits;
pub mod log_summary;
pub mod prefixed;
pub mod proxy_protocol;
mod send_timeout;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use spinlink_tls::binding::{ConnectionBinding, connection_binding};
use spinlink_tls::identity::{IdentitySource, identity_from_cert};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::limits::{Admission, AdmissionLimits, Refused};
use self::prefixed::Prefixed;
use self::proxy_protocol::{Parse, ProxyHeader};
use crate::cidr::Cidr;
use crate::config::ListenerConfig;
use crate::limits::Slots;
use crate::stats::metrics::ClientResult;
use crate::stats::{Counter, Refusal};
use crate::tls::ServerTls;
use crate::tunnel::{self, ConnPeer, ControlSlot, Shared};
use crate::workers::Workers;

/// Interval of HTTP/2 PINGs to agents; well inside load balancers' idle cuts
/// (AWS NLB: 350 s).
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered before the connection is closed.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request header block accepted (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE).
/// Agents send a few short headers; this bounds what one stream can make the
/// gateway hold before any check.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// Pause after a failed `accept` (e.g. out of file descriptors) before the
/// next, so the loop does not spin.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The listener's settings, resolved from [`ListenerConfig`].
#[derive(Debug)]
pub struct Settings {
    proxy: Option<ProxySettings>,
    handshake_timeout: Duration,
    preface_timeout: Duration,
    max_concurrent_streams: u32,
    idle_timeout: Duration,
    max_age: Option<MaxAge>,
    connections: Arc<Slots<()>>,
    /// Handshake admission: the global rate, the returning agents' share,
    /// the per-network budgets.
    handshakes: Admission,
    /// The shutdown grace, announced to agents in `Reconnect{draining}`.
    drain_grace: Duration,
    /// Ingress routes served on this listener besides the agent tunnel.
    ingress: Option<Arc<crate::ingress::Ingress>>,
    /// Refusal and handshake-failure warnings, summarised in a flood.
    warnings: Arc<log_summary::Summarised>,
}

#[derive(Debug)]
struct ProxySettings {
    trusted: Vec<Cidr>,
    required: bool,
    timeout: Duration,
}

#[derive(Debug, Clone, Copy)]
struct MaxAge {
    age: Duration,
    jitter_percent: u32,
    grace: Duration,
}

impl MaxAge {
    /// This connection's age limit: `age` ± up to `jitter_percent`.
    fn pick(&self) -> Duration {
        let j = f64::from(self.jitter_percent) / 100.0;
        let factor = if j > 0.0 {
            1.0 + rand::random_range(-j..=j)
        } else {
            1.0
        };
        self.age.mul_f64(factor)
    }
}

impl Settings {
    /// Settings from the (validated) `listener` section; `drain_grace` is the
    /// shutdown grace period.
    pub fn from_config(c: &ListenerConfig, drain_grace: Duration) -> Self {
        let proxy = c.proxy_protocol.then(|| ProxySettings {
            // Validated at load time; an entry that does not parse cannot get here.
            trusted: c
                .trusted_proxies
                .iter()
                .filter_map(|s| Cidr::parse(s).ok())
                .collect(),
            required: c.proxy_protocol_required,
            timeout: Duration::from_secs(c.proxy_header_timeout_seconds),
        });
        let max_age = (c.max_connection_age_seconds > 0).then(|| MaxAge {
            age: Duration::from_secs(c.max_connection_age_seconds),
            jitter_percent: c.max_connection_age_jitter_percent,
            grace: Duration::from_secs(c.max_connection_age_grace_seconds),
        });
        Self {
            proxy,
            handshake_timeout: Duration::from_secs(c.handshake_timeout_seconds),
            preface_timeout: Duration::from_secs(c.preface_timeout_seconds),
            max_concurrent_streams: c.max_concurrent_streams,
            idle_timeout: Duration::from_secs(c.idle_timeout_seconds),
            max_age,
            connections: Slots::new(c.max_connections),
            handshakes: Admission::new(
                AdmissionLimits {
                    rate: c.handshakes_per_second,
                    burst: c.handshake_burst,
                    reserved_percent: c.handshake_reserved_percent,
                    per_source_rate: c.handshakes_per_second_per_source,
                    per_source_burst: c.handshake_burst_per_source,
                    queue: Duration::from_secs_f64(c.handshake_queue_seconds),
                },
                Instant::now(),
            ),
            drain_grace,
            ingress: None,
            warnings: log_summary::Summarised::new(log_summary::SUMMARY_INTERVAL),
        }
    }

    /// Admits one TLS handshake from `client` (`returning`: it offered a
    /// ticket of ours): at once while the buckets have tokens; in a storm,
    /// after waiting its turn for at most `handshakeQueueSeconds`; refused
    /// (with the reason) when its turn is further away than that or its
    /// network is over budget.
    async fn admit_handshake(&self, client: IpAddr, returning: bool) -> Result<(), Refusal> {
        match self.handshakes.admit(client, returning, Instant::now()) {
            Err(Refused::Rate) => Err(Refusal::HandshakeRate),
            Err(Refused::Source) => Err(Refusal::HandshakeSourceRate),
            Ok(wait) => {
                if !wait.is_zero() {
                    // The connection holds its `maxConnections` slot meanwhile.
                    tokio::time::sleep(wait).await;
                }
                Ok(())
            }
        }
    }

    /// Serves `ingress` on the listener too (see [`ingress`]).
    #[must_use]
    pub fn with_ingress(mut self, ingress: Arc<crate::ingress::Ingress>) -> Self {
        self.ingress = Some(ingress);
        self
    }
}

/// The bound agent listener.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<Arc<ServerTls>>,
    sources: Arc<[IdentitySource]>,
    shared: Arc<Shared>,
    settings: Arc<Settings>,
    workers: Workers,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.tcp.local_addr().ok())
            .field("tls", &self.tls.is_some())
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener on `tcp` whose connections are served on `workers`;
    /// `tls` is `None` only for the insecure (h2c) development listener.
    pub fn new(
        tcp: TcpListener,
        tls: Option<Arc<ServerTls>>,
        sources: Vec<IdentitySource>,
        shared: Arc<Shared>,
        settings: Settings,
        workers: Workers,
    ) -> Self {
        Self {
            tcp,
            tls,
            sources: sources.into(),
            shared,
            settings: Arc::new(settings),
            workers,
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accepts connections until `shutdown`, then gives open connections
    /// `grace` to finish.
    pub async fn run(self, shutdown: CancellationToken, grace: Duration) {
        let connections = TaskTracker::new();
        // Cancelled when the grace period is over: connections still open close.
        let hard = CancellationToken::new();
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.tcp.accept() => accepted,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            };
            self.shared.stats.incr(Counter::ConnectionsAccepted);
            let conn = Connection {
                tls: self.tls.clone(),
                sources: self.sources.clone(),
                shared: self.shared.clone(),
                settings: self.settings.clone(),
                remote,
                shutdown: shutdown.clone(),
                hard: hard.clone(),
            };
            // The socket leaves this runtime's poller for its worker's.
            let stream = match stream.into_std() {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, %remote, "handing a connection to a worker failed");
                    continue;
                }
            };
            self.workers
                .spawn_connection(connections.track_future(async move {
                    let stream = match TcpStream::from_std(stream) {
                        Ok(stream) => stream,
                        Err(e) => {
                            tracing::warn!(error = %e, %remote, "taking a connection on a worker failed");
                            return;
                        }
                    };
                    // Two phases, so the task stays small for the
                    // connection's life: the handshake's state (PROXY
                    // header, ClientHello, TLS) is boxed and freed once it
                    // is done, and what serves the connection afterwards is
                    // one boxed future.
                    if let Some(life) = Box::pin(conn.handshake(stream)).await {
                        life.await;
                    }
                }));
        }
        let started = Instant::now();
        drop(self.tcp);
        connections.close();
        tracing::info!(
            open = connections.len(),
            "listener stopped; draining connections"
        );
        if tokio::time::timeout(grace, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = connections.len(),
                "shutdown grace period over; closing remaining connections"
            );
            hard.cancel();
            connections.wait().await;
        }
        self.shared
            .stats
            .metrics()
            .drain_duration
            .set(started.elapsed().as_secs_f64());
    }
}

/// Why reading the PROXY header ended the connection: a refusal to count, or
/// `None` when the peer simply went away (load balancer TCP health checks).
type ProxyOutcome = Result<(Bytes, SocketAddr), Option<Refusal>>;

/// Reads what a PROXY-protocol listener expects at the start of a connection
/// from `socket` (whose peer is `peer`): from a trusted proxy the header (or,
/// unless required, none); from anyone else no header. Returns the bytes read
/// past the header and the client's address.
pub async fn read_proxy_header<S>(
    socket: &mut S,
    peer: SocketAddr,
    trusted: &[Cidr],
    required: bool,
) -> ProxyOutcome
where
    S: AsyncRead + Unpin,
{
    let is_trusted = crate::cidr::any_contains(trusted, peer.ip());
    if !is_trusted && required {
        return Err(Some(Refusal::UntrustedSource));
    }
    let mut buf = BytesMut::with_capacity(512);
    let (header, len) = loop {
        match proxy_protocol::parse(&buf) {
            Ok(Parse::Incomplete) => {}
            Ok(Parse::NotProxy) => break (None, 0),
            Ok(Parse::Done { header, len }) => break (Some(header), len),
            Err(_) => return Err(Some(Refusal::ProxyHeaderInvalid)),
        }
        if buf.len() >= proxy_protocol::V2_MAX_LEN {
            return Err(Some(Refusal::ProxyHeaderInvalid));
        }
        match socket.read_buf(&mut buf).await {
            Ok(0) | Err(_) if buf.is_empty() => return Err(None),
            Ok(0) | Err(_) => return Err(Some(Refusal::ProxyHeaderInvalid)),
            Ok(_) => {}
        }
    };
    let rest = buf.freeze().slice(len..);
    match (is_trusted, header) {
        (true, Some(ProxyHeader::Proxied { source, .. })) => Ok((rest, source)),
        (true, Some(ProxyHeader::Local | ProxyHeader::Unknown)) => Ok((rest, peer)),
        (true, None) if required => Err(Some(Refusal::ProxyHeaderMissing)),
        (false, Some(_)) => Err(Some(Refusal::UntrustedProxy)),
        (_, None) => Ok((rest, peer)),
    }
}

/// Reads from `socket`, after `prefix` (bytes already read), until the
/// first TLS record is complete, and says whether its ClientHello offers a
/// session ticket `tls` issued. Returns every byte read, for the handshake.
/// A peer that closes or errs first is left to the handshake to report.
async fn read_client_hello(
    socket: &mut TcpStream,
    prefix: Bytes,
    tls: &ServerTls,
) -> (Bytes, bool) {
    use crate::tls::client_hello::{MAX_RECORD_LEN, Peek, RECORD_HEADER_LEN, peek};
    let mut buf = BytesMut::from(&prefix[..]);
    loop {
        match peek(&buf) {
            Peek::Incomplete => {}
            Peek::Ticket(ticket) => {
                let ours = tls.knows_ticket(ticket);
                return (buf.freeze(), ours);
            }
            Peek::None => return (buf.freeze(), false),
        }
        // Bounded by `peek`: a record is at most this long, or it is `None`.
        if buf.len() >= RECORD_HEADER_LEN + MAX_RECORD_LEN {
            return (buf.freeze(), false);
        }
        // Grown a little at a time: a ClientHello is a few hundred bytes,
        // and a peer that trickles one pays for its own buffer only.
        buf.reserve(1024);
        match socket.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return (buf.freeze(), false),
            Ok(_) => {}
        }
    }
}

struct Connection {
    tls: Option<Arc<ServerTls>>,
    sources: Arc<[IdentitySource]>,
    shared: Arc<Shared>,
    settings: Arc<Settings>,
    remote: SocketAddr,
    shutdown: CancellationToken,
    hard: CancellationToken,
}

/// What serves a connection once its handshake is done.
type ConnectionLife = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

pin_project_lite::pin_project! {
    /// `fut`, holding `held` until it is dropped. (An `async move` block
    /// around `fut` would reserve room for it twice: once as the captured
    /// value, once as the value awaited.)
    struct Holding<F> {
        #[pin]
        fut: F,
        held: Option<Held>,
    }
}

impl<F> Holding<F> {
    fn new(fut: F, held: Option<Held>) -> Self {
        Self { fut, held }
    }
}

impl<F: std::future::Future> std::future::Future for Holding<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.project().fut.poll(cx)
    }
}

/// What a connection holds while it is open: its `maxConnections` slot and
/// its count in `connections_open`.
struct Held {
    _slot: crate::limits::Slot<()>,
    _open: OpenGauge,
}

/// Keeps `connections_open` right however the connection ends.
struct OpenGauge(Arc<crate::stats::Stats>);

impl Drop for OpenGauge {
    fn drop(&mut self) {
        self.0.metrics().connections_open.dec();
        self.0.notify();
    }
}

impl Connection {
    fn refuse(&self, reason: Refusal, remote: SocketAddr) {
        // Before the refusal, whose count wakes waiters.
        self.count_client(remote, ClientResult::Refused);
        self.shared.stats.refuse(reason);
        if self
            .settings
            .warnings
            .admit(reason.as_str(), "connections refused")
        {
            tracing::warn!(%remote, peer = %self.remote, reason = reason.as_str(), "connection refused");
        }
    }

    /// Counts the connection under its client's network: `remote` is the
    /// address the PROXY header named once it has been read.
    fn count_client(&self, remote: SocketAddr, result: ClientResult) {
        let metrics = self.shared.stats.metrics();
        metrics.client_connections.count(remote.ip(), result);
    }

    /// Counts a finished handshake, under the client's network too.
    fn handshake_ok(&self, remote: SocketAddr) {
        self.shared.stats.metrics().handshake(true);
        self.count_client(remote, ClientResult::Accepted);
    }

    /// Counts a failed handshake (an auth failure), under the client's
    /// network too.
    fn handshake_failed(&self, remote: SocketAddr) {
        self.count_client(remote, ClientResult::Refused);
        self.shared.stats.incr(Counter::HandshakeFailures);
    }

    /// Everything before the connection is served: the slot, the PROXY
    /// header, admission and the TLS handshake. Returns what serves the
    /// connection from then on (holding its slot and its gauge), or `None`
    /// when it ended here.
    async fn handshake(mut self, mut stream: TcpStream) -> Option<ConnectionLife> {
        let socket_peer = self.remote;
        let local_port = stream.local_addr().map_or(0, |a| a.port());
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(remote = %socket_peer, error = %e, "setting TCP_NODELAY failed");
        }
        let Some(slot) = self.settings.connections.try_take(()) else {
            self.refuse(Refusal::MaxConnections, socket_peer);
            return None;
        };
        self.shared.stats.metrics().connections_open.inc();
        let held = Held {
            _slot: slot,
            _open: OpenGauge(self.shared.stats.clone()),
        };

        let prefix = match &self.settings.proxy {
            None => Bytes::new(),
            Some(proxy) => {
                let read =
                    read_proxy_header(&mut stream, socket_peer, &proxy.trusted, proxy.required);
                match tokio::time::timeout(proxy.timeout, read).await {
                    Ok(Ok((rest, client))) => {
                        if client != socket_peer {
                            tracing::debug!(remote = %client, proxy = %socket_peer, "PROXY header read");
                        }
                        // From here on, logs name the client, not the balancer.
                        self.remote = client;
                        rest
                    }
                    Ok(Err(Some(reason))) => {
                        self.refuse(reason, socket_peer);
                        return None;
                    }
                    Ok(Err(None)) => return None,
                    Err(_) => {
                        self.refuse(Refusal::ProxyHeaderTimeout, socket_peer);
                        return None;
                    }
                }
            }
        };
        let remote = self.remote;
        if let Some(ingress) = self.settings.ingress.clone() {
            let stream = Prefixed::new(prefix, stream);
            let serve = self.serve_ingress(ingress, stream, local_port);
            return Some(Box::pin(Holding::new(serve, Some(held))));
        }

        let Some(tls) = self.tls.clone() else {
            // Insecure listener: no TLS exporter, so a random value stands in
            // for the binding; tokens stay tied to this connection.
            let peer = ConnPeer {
                identity: None,
                binding: ConnectionBinding(rand::random()),
                remote,
                control: ControlSlot::default(),
            };
            self.count_client(remote, ClientResult::Accepted);
            return Some(self.serve_h2(Prefixed::new(prefix, stream), peer, Some(held)));
        };
        let peek = read_client_hello(&mut stream, prefix, &tls);
        let (prefix, returning) =
            match tokio::time::timeout(self.settings.handshake_timeout, peek).await {
                Ok(read) => read,
                Err(_) => {
                    self.shared.stats.metrics().handshake(false);
                    self.refuse(Refusal::HandshakeTimeout, remote);
                    return None;
                }
            };
        if let Err(reason) = self.settings.admit_handshake(remote.ip(), returning).await {
            self.refuse(reason, remote);
            return None;
        }
        let stream = Prefixed::new(prefix, stream);
        // The configuration current now: a reload changes what the next
        // handshake sees, never this one.
        let acceptor = tls.acceptor();
        // Boxed, so the handshake's state is freed once it is done instead of
        // sizing the connection's task for its whole life.
        let handshake = Box::pin(acceptor.accept(stream));
        // Boxed as it comes out: it moves on by pointer.
        let tls = match tokio::time::timeout(self.settings.handshake_timeout, handshake).await {
            Ok(Ok(tls)) => Box::new(tls),
            Ok(Err(e)) => {
                self.handshake_failed(remote);
                if self
                    .settings
                    .warnings
                    .admit("handshake_failed", "TLS handshakes failed")
                {
                    tracing::warn!(%remote, error = %e, "TLS handshake failed");
                }
                return None;
            }
            Err(_) => {
                self.shared.stats.metrics().handshake(false);
                self.refuse(Refusal::HandshakeTimeout, remote);
                return None;
            }
        };
        if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
            // The session's certificate was verified when its ticket was
            // issued, up to two ticket periods ago; it must still be valid.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            let valid = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .is_none_or(|leaf| spinlink_tls::identity::valid_at(leaf, now).unwrap_or(false));
            if !valid {
                self.shared.stats.incr(Counter::ConnectionsWithoutIdentity);
                tracing::warn!(%remote, "resumed session's client certificate has expired; closing");
                return None;
            }
            self.shared.stats.metrics().handshakes_resumed.inc();
        }
        self.handshake_ok(remote);
        self.serve_agent(tls, remote, Some(held))
    }

    /// An agent connection after its handshake: named, then served as
    /// HTTP/2 (`None`: it names no one, and ends). `held` is `None` when the
    /// caller's future holds the connection's slot and gauge.
    fn serve_agent(
        self,
        tls: Box<tokio_rustls::server::TlsStream<Prefixed<TcpStream>>>,
        remote: SocketAddr,
        held: Option<Held>,
    ) -> Option<ConnectionLife> {
        let (_, server) = tls.get_ref();
        let identity = match server.peer_certificates().and_then(|certs| certs.first()) {
            Some(leaf) => identity_from_cert(leaf, &self.sources),
            // TLS lets a handshake without a certificate through only when
            // JWT bootstrap is on; the first `Hello`'s JWT names the agent.
            None if self.shared.jwt.is_some() => {
                return match connection_binding(&**server) {
                    Ok(binding) => {
                        let peer = ConnPeer {
                            identity: None,
                            binding,
                            remote,
                            control: tunnel::ConnState::bootstrap(),
                        };
                        Some(self.serve_h2(tls, peer, held))
                    }
                    Err(e) => {
                        tracing::warn!(%remote, error = %e, "no connection binding; closing");
                        None
                    }
                };
            }
            None => Ok(None),
        };
        let identity = match identity {
            Ok(Some(identity)) => identity,
            Ok(None) => {
                self.shared.stats.incr(Counter::ConnectionsWithoutIdentity);
                tracing::warn!(%remote, "client certificate names no identity; closing");
                return None;
            }
            Err(e) => {
                self.shared.stats.incr(Counter::ConnectionsWithoutIdentity);
                tracing::warn!(%remote, error = %e, "client certificate unreadable; closing");
                return None;
            }
        };
        let binding = match connection_binding(&**server) {
            Ok(binding) => binding,
            Err(e) => {
                tracing::warn!(%remote, error = %e, "no connection binding; closing");
                return None;
            }
        };
        tracing::debug!(%remote, identity, "agent connected");
        let peer = ConnPeer {
            identity: Some(identity.into()),
            binding,
            remote,
            control: ControlSlot::default(),
        };
        Some(self.serve_h2(tls, peer, held))
    }

    /// The agent connection's life: HTTP/2 on `io`, one boxed future that
    /// holds the connection's slot and gauge (`held`, when the caller's
    /// future does not).
    fn serve_h2<I>(self, io: I, peer: ConnPeer, held: Option<Held>) -> ConnectionLife
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let settings = &self.settings;
        let limits = crate::tunnel::server::AgentLimits {
            max_concurrent_streams: settings.max_concurrent_streams,
            max_header_list_size: MAX_HEADER_LIST_SIZE,
            idle_timeout: settings.idle_timeout,
            max_age: settings.max_age.map(|m| (m.pick(), m.grace)),
            drain_grace: settings.drain_grace,
            keepalive: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            preface_timeout: settings.preface_timeout,
        };
        let serve = crate::tunnel::server::serve(
            io,
            peer,
            self.shared.clone(),
            limits,
            self.shutdown.clone(),
            self.hard.clone(),
        );
        Box::pin(Holding::new(serve, held))
    }
}

#[cfg(test)]
mod tests;
