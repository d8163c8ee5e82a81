//! The gateway's HTTP/2 client towards the sidecars. Start at [`set`]: the
//! live set of sidecar instances (from the static list, DNS and EndpointSlice
//! [`discovery`]), which account goes to which (rendezvous hashing with
//! bounded load), and [`health`] checks and outlier ejection taking instances
//! out of rotation. Here: per instance an [`Upstream`], a small pool of
//! long-lived connections (mTLS for `https://`, h2c with prior knowledge for
//! `http://`), dialled lazily and again when one closes or stops taking
//! streams. Many agent streams multiplex on each connection; HTTP/2 flow
//! control is per stream, so one slow account does not stall the others.

pub mod client;
pub mod discovery;
pub mod health;
pub mod set;

pub use set::{Carried, Instance, Lease, UpstreamSet};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::uri::{Scheme, Uri};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::config::UpstreamTlsConfig;
use crate::engine::bridge::{Bridge, BridgeBody};
use crate::engine::link::{Fields, Link, Route, Side};
use crate::workers::Spawners;

/// How long dialling a sidecar (TCP and TLS handshakes) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval of HTTP/2 PINGs on upstream connections.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long a PING may go unanswered before the connection is closed.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// An error type any body can report.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an upstream could not be parsed, reached or asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The upstream URL is not `http(s)://host[:port]`.
    #[error("invalid upstream URL {url:?}: {message}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The name to check the sidecar's certificate against is not valid.
    #[error("invalid TLS server name {0:?}")]
    InvalidServerName(String),
    /// No pooled connection takes new streams.
    #[error("{url}: no connection takes new streams")]
    Unavailable {
        /// The upstream.
        url: String,
    },
    /// The response head did not arrive.
    #[error("request to {url}: {source}")]
    Send {
        /// The upstream.
        url: String,
        /// Why.
        #[source]
        source: crate::engine::bridge::BridgeError,
    },
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where an upstream is: scheme, authority and the address to dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    url: String,
    scheme: Scheme,
    /// `:scheme` and `:authority` as HTTP/2 fields take them, made once:
    /// every carried stream's head, and every health check's, shares them.
    fields: (bytes::Bytes, bytes::Bytes),
    host: String,
    port: u16,
    /// The name the sidecar's certificate is checked against when it is not
    /// `host` (an instance found by DNS or EndpointSlice is dialled by
    /// address but named as configured).
    tls_name: Option<String>,
}

impl Target {
    /// Parses `http://host[:port]` or `https://host[:port]` (no path, query or
    /// credentials).
    pub fn parse(url: &str) -> Result<Self> {
        let invalid = |message: &str| Error::InvalidUrl {
            url: url.to_owned(),
            message: message.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| invalid("no scheme"))?;
        let default_port = if scheme == Scheme::HTTPS {
            443
        } else if scheme == Scheme::HTTP {
            80
        } else {
            return Err(invalid("scheme must be http or https"));
        };
        let authority = uri.authority().cloned().ok_or_else(|| invalid("no host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid("credentials are not allowed"));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(invalid("path and query are not allowed"));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.is_empty() {
            return Err(invalid("no host"));
        }
        Ok(Self {
            url: url.to_owned(),
            port: authority.port_u16().unwrap_or(default_port),
            fields: (
                bytes::Bytes::copy_from_slice(scheme.as_str().as_bytes()),
                bytes::Bytes::copy_from_slice(authority.as_str().as_bytes()),
            ),
            scheme,
            host,
            tls_name: None,
        })
    }

    /// One instance of this (configured) target at `addr`: dialled there,
    /// named `scheme://addr` in logs and metrics, but with this target's
    /// authority on requests and its host as the TLS name.
    pub fn instance(&self, addr: std::net::SocketAddr) -> Self {
        Self {
            url: format!("{}://{addr}", self.scheme),
            scheme: self.scheme.clone(),
            fields: self.fields.clone(),
            host: addr.ip().to_string(),
            port: addr.port(),
            tls_name: Some(self.tls_name.clone().unwrap_or_else(|| self.host.clone())),
        }
    }

    /// The host name (or address) in the URL.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port dialled.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the upstream is reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// The URL as configured.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The values of the `:scheme` and `:authority` fields requests carry.
    pub fn pseudo_fields(&self) -> &(bytes::Bytes, bytes::Bytes) {
        &self.fields
    }
}

/// TLS settings towards sidecars.
#[derive(Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// Loads the CA bundle and the gateway's client certificate; offers ALPN h2.
    pub fn from_config(config: &UpstreamTlsConfig) -> Result<Self, crate::Error> {
        let tls = spinlink_tls::config::client_config(
            spinlink_tls::config::ClientFiles {
                ca: &config.ca_file,
                identity: Some((&config.cert_file, &config.key_file)),
            },
            &[spinlink_tls::config::ALPN_H2],
        )
        .map_err(|source| crate::Error::Tls {
            what: "upstreamTls",
            source,
        })?;
        let server_name = match &config.server_name {
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|_| {
                crate::Error::InvalidConfig {
                    origin: String::new(),
                    key: "upstreamTls.serverName".to_owned(),
                    message: format!("{name:?} is not a DNS name or IP address"),
                }
            })?),
            None => None,
        };
        Ok(Self {
            config: Arc::new(tls),
            server_name,
        })
    }
}

/// What a stream's outcome is reported to (the instance's health): `true`
/// when its response head arrived, `false` when it failed before one.
pub type Outcome = Arc<dyn Fn(bool) + Send + Sync>;

/// A pool of HTTP/2 connections to one sidecar, each driven by the engine's
/// client task ([`client`]).
pub struct Upstream {
    target: Target,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// Slot `i` belongs to worker `i % workers.len()`, which dials and
    /// drives its connection.
    slots: Box<[Mutex<Option<Arc<Link>>>]>,
    next: AtomicUsize,
    workers: Spawners,
    connections: Option<prometheus_client::metrics::gauge::Gauge>,
    outcome: std::sync::OnceLock<Outcome>,
    bytes_down: Option<prometheus_client::metrics::counter::Counter>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("url", &self.target.url)
            .field("connections", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// A pool of `connections` (at least one) connections to `target`; `tls`
    /// is required for `https://` targets. Nothing is dialled until needed.
    pub fn new(target: Target, tls: Option<&UpstreamTls>, connections: usize) -> Result<Self> {
        let tls = match (target.is_tls(), tls) {
            (false, _) => None,
            (true, None) => {
                return Err(Error::InvalidUrl {
                    url: target.url.clone(),
                    message: "https upstreams need upstreamTls".to_owned(),
                });
            }
            (true, Some(tls)) => {
                let name = match &tls.server_name {
                    Some(name) => name.clone(),
                    None => {
                        let host = target.tls_name.as_ref().unwrap_or(&target.host);
                        ServerName::try_from(host.clone())
                            .map_err(|_| Error::InvalidServerName(host.clone()))?
                    }
                };
                Some((TlsConnector::from(tls.config.clone()), name))
            }
        };
        let slots = (0..connections.max(1)).map(|_| Mutex::new(None)).collect();
        Ok(Self {
            target,
            tls,
            slots,
            next: AtomicUsize::new(0),
            workers: Spawners::default(),
            connections: None,
            outcome: std::sync::OnceLock::new(),
            bytes_down: None,
        })
    }

    /// Spreads the pool over `workers`: each keeps its share of the
    /// connections (at least one), dials them and drives them, and the
    /// streams it opens go on its own (see [`crate::workers`]).
    #[must_use]
    pub fn with_workers(mut self, workers: Spawners) -> Self {
        let n = self.slots.len().max(workers.len());
        self.slots = (0..n).map(|_| Mutex::new(None)).collect();
        self.workers = workers;
        self
    }

    /// Counts this pool's open connections in `gauge`.
    #[must_use]
    pub fn with_connection_gauge(
        mut self,
        gauge: prometheus_client::metrics::gauge::Gauge,
    ) -> Self {
        self.connections = Some(gauge);
        self
    }

    /// Counts sidecar → agent bytes in `counter`.
    #[must_use]
    pub fn with_bytes_counter(
        mut self,
        counter: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        self.bytes_down = Some(counter);
        self
    }

    /// Reports every stream's outcome to `outcome` (set once).
    pub fn set_outcome(&self, outcome: Outcome) {
        let _ = self.outcome.set(outcome);
    }

    /// Where this pool connects.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// A connection that takes new streams: the next slot's, or a new one
    /// dialled in its place (the old one serves its open streams and closes
    /// when they are done).
    fn link(&self) -> Arc<Link> {
        let i = self.slot();
        let mut held = self.slots[i].lock().unwrap_or_else(|e| e.into_inner());
        if let Some(link) = held.as_ref() {
            if link.is_usable() {
                return link.clone();
            }
            link.refuse_new();
        }
        let link = self.dial(i);
        *held = Some(link.clone());
        link
    }

    /// The next slot for the calling thread: one of its own on a worker,
    /// any of them elsewhere (health checks, the shared runtime).
    fn slot(&self) -> usize {
        let next = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.slots.len();
        match self.workers.current() {
            Some(w) => {
                let workers = self.workers.len();
                // Slots w, w + workers, w + 2·workers, … below n.
                let own = (n - w).div_ceil(workers);
                w + workers * (next % own)
            }
            None => next % n,
        }
    }

    /// Opens a stream with `fields` answered into `route`, on a pooled
    /// connection; a connection that just stopped taking streams is replaced
    /// once.
    pub fn open(&self, fields: &Fields, end: bool, route: Route) -> Option<(Arc<Link>, u32)> {
        for _ in 0..2 {
            let link = self.link();
            if let Some(id) = link.open(fields, end, route.clone()) {
                return Some((link, id));
            }
        }
        None
    }

    /// Starts a connection: its link at once (streams may be opened on it
    /// while it dials), its task in the background.
    fn dial(&self, slot: usize) -> Arc<Link> {
        let local = client::local();
        let link = Link::new(
            Side::Client,
            Arc::from(self.target.url.as_str()),
            local.preamble(Side::Client),
            spinlink_http2::hpack::Encoder::new(client::ENCODER_TABLE).without_huffman(),
        );
        let dial = client::run(client::Dial {
            link: link.clone(),
            target: self.target.clone(),
            tls: self.tls.clone(),
            local,
            outcome: self.outcome.get().cloned(),
            gauge: self.connections.clone(),
            bytes: self.bytes_down.clone(),
        });
        self.workers.spawn(slot, dial);
        link
    }

    /// Sends a request (`fields` and `body`) on the pool and returns the
    /// response head with its streaming body (the gateway's own requests:
    /// health checks, and tunnel streams of ingress connections).
    pub async fn send<B>(&self, fields: Fields, body: B) -> Result<Response<BridgeBody>>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::fmt::Display + Send + 'static,
    {
        let bridge = Bridge::new(false);
        let end = body.is_end_stream();
        let route = Route {
            sink: bridge.clone(),
            id: 0,
        };
        let Some((link, id)) = self.open(&fields, end, route) else {
            return Err(Error::Unavailable {
                url: self.target.url.clone(),
            });
        };
        let source = Route {
            sink: link.clone(),
            id,
        };
        if !end {
            let writer = bridge.clone();
            tokio::spawn(async move {
                let _ = writer.write_body(&link, id, body).await;
            });
        }
        bridge.response(source).await.map_err(|e| Error::Send {
            url: self.target.url.clone(),
            source: e,
        })
    }

    /// Ends every stream carried on the pool with `Unavailable` (`message`):
    /// the instance left the set or rotation; agents reopen elsewhere.
    pub fn end_streams(&self, message: &'static str) {
        for slot in &*self.slots {
            let link = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(link) = link {
                link.fail_all(message);
            }
        }
    }

    /// Lets the pool's connections go: streams in flight finish, the
    /// connections close once they have none.
    pub fn close(&self) {
        for slot in &*self.slots {
            if let Some(link) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                link.refuse_new();
                link.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t = Target::parse("https://127.0.0.1:7001").unwrap();
        assert!(t.is_tls());
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 7001));
        assert_eq!(
            t.pseudo_fields(),
            &(b"https"[..].into(), b"127.0.0.1:7001"[..].into())
        );
        let t = Target::parse("http://[::1]:7001/").unwrap();
        assert!(!t.is_tls());
        assert_eq!((t.host.as_str(), t.port), ("::1", 7001));
        let t = Target::parse("https://sidecar.example").unwrap();
        assert_eq!(t.port, 443);
    }

    #[test]
    fn instances_dial_the_address_but_keep_the_name() {
        let t = Target::parse("https://sidecar.spinlink.svc:7001").unwrap();
        let i = t.instance("10.0.0.5:7002".parse().unwrap());
        assert_eq!(i.url(), "https://10.0.0.5:7002");
        assert_eq!((i.host(), i.port()), ("10.0.0.5", 7002));
        assert_eq!(&i.pseudo_fields().1[..], b"sidecar.spinlink.svc:7001");
        assert_eq!(i.tls_name.as_deref(), Some("sidecar.spinlink.svc"));
        let v6 = t.instance("[fd00::1]:7001".parse().unwrap());
        assert_eq!(v6.url(), "https://[fd00::1]:7001");
        assert_eq!(v6.host(), "fd00::1");
    }

    #[test]
    fn bad_targets_refused() {
        for url in [
            "",
            "127.0.0.1:7001",
            "ftp://host:1",
            "https://host:1/path",
            "https://user:pw@host:1",
            "http://host:1?q=1",
        ] {
            assert!(Target::parse(url).is_err(), "{url:?} accepted");
        }
    }

    #[test]
    fn https_without_tls_settings_refused() {
        let t = Target::parse("https://127.0.0.1:7001").unwrap();
        assert!(Upstream::new(t, None, 2).is_err());
    }

    #[tokio::test]
    async fn unreachable_upstream_is_unavailable() {
        // Bind then drop a listener so the port is (almost certainly) closed.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let up = Upstream::new(Target::parse(&format!("http://{addr}")).unwrap(), None, 1).unwrap();
        let fields = vec![
            (Bytes::from_static(b":method"), Bytes::from_static(b"POST")),
            (Bytes::from_static(b":scheme"), Bytes::from_static(b"http")),
            (Bytes::from_static(b":path"), Bytes::from_static(b"/x")),
        ];
        let err = up
            .send(fields, http_body_util::Empty::<Bytes>::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("unavailable"), "{err}");
    }

    /// The slots `upstream` picks in eight opens from worker `w`.
    async fn picked_on(
        workers: &crate::workers::Workers,
        upstream: &Arc<Upstream>,
        w: usize,
    ) -> std::collections::BTreeSet<usize> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let u = upstream.clone();
        workers.spawners().spawn(w, async move {
            let _ = tx.send((0..8).map(|_| u.slot()).collect());
        });
        rx.await.unwrap()
    }

    #[tokio::test]
    async fn each_worker_opens_streams_on_its_own_connections_only() {
        let workers = crate::workers::Workers::start(2).unwrap();
        let target = Target::parse("http://127.0.0.1:1").unwrap();
        let up = Arc::new(
            Upstream::new(target.clone(), None, 4)
                .unwrap()
                .with_workers(workers.spawners()),
        );
        assert_eq!(picked_on(&workers, &up, 0).await, [0, 2].into());
        assert_eq!(picked_on(&workers, &up, 1).await, [1, 3].into());
        // Off the workers (health checks): any slot.
        let anywhere: std::collections::BTreeSet<usize> = (0..8).map(|_| up.slot()).collect();
        assert_eq!(anywhere, [0, 1, 2, 3].into());

        // Fewer connections than workers: each worker still has its own.
        let one = Arc::new(
            Upstream::new(target, None, 1)
                .unwrap()
                .with_workers(workers.spawners()),
        );
        assert_eq!(one.slots.len(), 2);
        assert_eq!(picked_on(&workers, &one, 0).await, [0].into());
        assert_eq!(picked_on(&workers, &one, 1).await, [1].into());
    }
}
