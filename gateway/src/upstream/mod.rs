//! The gateway's HTTP/2 client towards the sidecars. Start at [`set`]: the
//! live set of sidecar instances (from the static list, DNS and EndpointSlice
//! [`discovery`]), which account goes to which (rendezvous hashing with
//! bounded load), and [`health`] checks and outlier ejection taking instances
//! out of rotation. Here: per instance an [`Upstream`], a small pool of
//! long-lived connections (mTLS for `https://`, h2c with prior knowledge for
//! `http://`), dialled lazily and again when one closes. Many agent streams
//! multiplex on each connection; HTTP/2 flow control is per stream, so one
//! slow account does not stall the others.

pub mod discovery;
pub mod health;
pub mod set;

pub use set::{Instance, Lease, UpstreamSet};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;

use crate::config::UpstreamTlsConfig;

/// How long dialling a sidecar (TCP, TLS and HTTP/2 handshakes) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval of HTTP/2 PINGs on upstream connections.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long a PING may go unanswered before the connection is closed.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// An error type any body can report.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of requests sent upstream.
pub type RequestBody = UnsyncBoxBody<Bytes, BoxError>;

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
    /// The TCP connection could not be made.
    #[error("connecting to {url}: {source}")]
    Connect {
        /// The upstream.
        url: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS handshake with {url}: {source}")]
    TlsHandshake {
        /// The upstream.
        url: String,
        /// The I/O error (rustls errors come wrapped in one).
        #[source]
        source: std::io::Error,
    },
    /// The HTTP/2 handshake failed.
    #[error("HTTP/2 handshake with {url}: {source}")]
    Http2Handshake {
        /// The upstream.
        url: String,
        /// The hyper error.
        #[source]
        source: hyper::Error,
    },
    /// Dialling took longer than [`DEFAULT_CONNECT_TIMEOUT`].
    #[error("connecting to {url}: timed out")]
    ConnectTimeout {
        /// The upstream.
        url: String,
    },
    /// The request could not be sent or its response head not received.
    #[error("request to {url}: {source}")]
    Send {
        /// The upstream.
        url: String,
        /// The hyper error.
        #[source]
        source: hyper::Error,
    },
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where an upstream is: scheme, authority and the address to dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    url: String,
    scheme: Scheme,
    authority: Authority,
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
            scheme,
            authority,
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
            authority: self.authority.clone(),
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

    /// The scheme requests carry.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// The authority requests carry.
    pub fn authority(&self) -> &Authority {
        &self.authority
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

/// A pool of HTTP/2 connections to one sidecar.
pub struct Upstream {
    target: Target,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    slots: Box<[Mutex<Option<SendRequest<RequestBody>>>]>,
    next: AtomicUsize,
    connections: Option<prometheus_client::metrics::gauge::Gauge>,
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
            connections: None,
        })
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

    /// Where this pool connects.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Drops the pool's connections: streams in flight finish, the
    /// connections close once they have none.
    pub async fn close(&self) {
        for slot in &*self.slots {
            slot.lock().await.take();
        }
    }

    /// Sends `req` on one of the pool's connections and returns the response
    /// head with its streaming body. A request that could not be written
    /// because its connection had just closed is retried once on a fresh one.
    pub async fn send(&self, req: Request<RequestBody>) -> Result<Response<Incoming>> {
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        let mut sender = self.sender(slot).await?;
        let req = match sender.try_send_request(req).await {
            Ok(response) => return Ok(response),
            Err(mut e) => match e.take_message() {
                Some(req) => req,
                None => return Err(self.send_error(e.into_error())),
            },
        };
        let mut sender = self.sender(slot).await?;
        sender
            .send_request(req)
            .await
            .map_err(|e| self.send_error(e))
    }

    fn send_error(&self, source: hyper::Error) -> Error {
        Error::Send {
            url: self.target.url.clone(),
            source,
        }
    }

    /// A live sender of `slot`, dialling when it has none or its connection
    /// closed. The slot's lock is held while dialling so that concurrent
    /// streams wait for one dial instead of each making their own.
    async fn sender(
        &self,
        slot: &Mutex<Option<SendRequest<RequestBody>>>,
    ) -> Result<SendRequest<RequestBody>> {
        let mut held = slot.lock().await;
        if let Some(sender) = held.as_ref().filter(|s| !s.is_closed()) {
            return Ok(sender.clone());
        }
        *held = None;
        let sender = tokio::time::timeout(DEFAULT_CONNECT_TIMEOUT, self.dial())
            .await
            .map_err(|_| Error::ConnectTimeout {
                url: self.target.url.clone(),
            })??;
        *held = Some(sender.clone());
        Ok(sender)
    }

    async fn dial(&self) -> Result<SendRequest<RequestBody>> {
        let url = &self.target.url;
        let tcp = TcpStream::connect((self.target.host.as_str(), self.target.port))
            .await
            .map_err(|source| Error::Connect {
                url: url.clone(),
                source,
            })?;
        tcp.set_nodelay(true).map_err(|source| Error::Connect {
            url: url.clone(),
            source,
        })?;
        match &self.tls {
            None => self.handshake(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|source| Error::TlsHandshake {
                        url: url.clone(),
                        source,
                    })?;
                self.handshake(tls).await
            }
        }
    }

    async fn handshake<I>(&self, io: I) -> Result<SendRequest<RequestBody>>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(DEFAULT_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(DEFAULT_KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(io))
            .await
            .map_err(|source| Error::Http2Handshake {
                url: self.target.url.clone(),
                source,
            })?;
        let url = self.target.url.clone();
        let gauge = self.connections.clone();
        if let Some(g) = &gauge {
            g.inc();
        }
        // The connection task ends when the peer closes, a PING times out, or
        // every sender (the pool's and in-flight streams') is gone.
        tokio::spawn(async move {
            let result = connection.await;
            if let Some(g) = gauge {
                g.dec();
            }
            match result {
                Ok(()) => tracing::debug!(upstream = %url, "upstream connection closed"),
                Err(e) => tracing::info!(upstream = %url, error = %e, "upstream connection ended"),
            }
        });
        tracing::debug!(upstream = %self.target.url, "upstream connection established");
        Ok(sender)
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
        assert_eq!(t.authority().as_str(), "127.0.0.1:7001");
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
        assert_eq!(i.authority().as_str(), "sidecar.spinlink.svc:7001");
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
    async fn unreachable_upstream_is_a_connect_error() {
        // Bind then drop a listener so the port is (almost certainly) closed.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let up = Upstream::new(Target::parse(&format!("http://{addr}")).unwrap(), None, 1).unwrap();
        let req = Request::builder()
            .uri(format!("http://{addr}/x"))
            .body(RequestBody::default())
            .unwrap();
        let err = up.send(req).await.unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err}");
    }
}
