//! Connections to sidecars: the upstream's [`Role`] on the HTTP/2 engine
//! ([`crate::engine::conn`]), dialled by an upstream pool
//! ([`super::Upstream`]) — TCP, then TLS with the gateway's client certificate (or h2c for `http://` upstreams) — and driven
//! by [`Conn`]. Streams are opened on the [`Link`] by agent connections (and
//! bridges) at once, even while the connection is still being dialled: their
//! frames wait in the link until it is up. If dialling fails, every stream
//! opened on it ends with `Unavailable`, which agents retry.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Context;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT, Outcome, Target,
};
use crate::engine::conn::{Conn, InStream, Local, Role, Signal};
use crate::engine::link::{Failure, Fields, Link, Side};

/// HPACK table the gateway keeps per sidecar connection: the verified
/// headers repeat on every stream, and there are few such connections.
pub const ENCODER_TABLE: usize = 4096;
/// Receive window per stream: sidecar → agent traffic is small (acks,
/// relayed requests); this keeps one slow agent from holding much.
pub const STREAM_WINDOW: u32 = 1 << 20;
/// Receive window of each sidecar connection, shared by its streams.
pub const CONN_WINDOW: u32 = 16 << 20;
/// Largest header list accepted from a sidecar.
pub const MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;

/// What the gateway announces to sidecars.
pub fn local() -> Local {
    Local {
        max_concurrent_streams: 0,
        stream_window: STREAM_WINDOW,
        conn_window: CONN_WINDOW,
        max_header_list_size: MAX_HEADER_LIST_SIZE,
        header_table_size: spinlink_http2::frame::DEFAULT_HEADER_TABLE_SIZE,
        keepalive: DEFAULT_KEEPALIVE_INTERVAL,
        keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
        // The client sends the preface; the dial and TLS are timed instead.
        preface_timeout: None,
    }
}

/// Everything a new sidecar connection needs.
pub struct Dial {
    /// Its sending side, already holding the preface and SETTINGS.
    pub link: Arc<Link>,
    /// Where to dial.
    pub target: Target,
    /// TLS, for `https://` upstreams.
    pub tls: Option<(TlsConnector, ServerName<'static>)>,
    /// What to announce.
    pub local: Local,
    /// Where streams' outcomes go (instance health).
    pub outcome: Option<Outcome>,
    /// Open connections of the instance.
    pub gauge: Option<Gauge>,
    /// Sidecar → agent bytes.
    pub bytes: Option<Counter>,
}

/// The sidecar side's role: it never opens streams, reports outcomes, and
/// ends once the pool let it go and its streams are done.
struct SidecarRole {
    outcome: Option<Outcome>,
}

impl Role for SidecarRole {
    const SIDE: Side = Side::Client;

    fn open(&mut self, _link: &Arc<Link>, _id: u32, _fields: Fields, _end: bool) -> InStream {
        unreachable!("a client connection opens no stream for its peer")
    }

    fn answered(&mut self, ok: bool) {
        if let Some(outcome) = &self.outcome {
            outcome(ok);
        }
    }

    fn poll_signal(
        &mut self,
        _cx: &mut Context<'_>,
        open_streams: usize,
        link: &Arc<Link>,
    ) -> Signal {
        if open_streams == 0 && link.lock().is_refusing() {
            Signal::Close
        } else {
            Signal::None
        }
    }

    fn failure(&self) -> Failure {
        Failure::Unavailable("upstream stream broke".into())
    }
}

/// Dials and drives one sidecar connection until it ends.
pub async fn run(d: Dial) {
    let url = d.target.url().to_owned();
    let connect = async {
        let tcp = TcpStream::connect((d.target.host(), d.target.port())).await?;
        tcp.set_nodelay(true)?;
        std::io::Result::Ok(tcp)
    };
    let tcp = match tokio::time::timeout(DEFAULT_CONNECT_TIMEOUT, connect).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return dial_failed(&d, &url, &e.to_string()),
        Err(_) => return dial_failed(&d, &url, "connect timed out"),
    };
    match &d.tls {
        None => drive(tcp, &d, &url).await,
        Some((connector, name)) => {
            let tls = connector.connect(name.clone(), tcp);
            match tokio::time::timeout(DEFAULT_CONNECT_TIMEOUT, tls).await {
                Ok(Ok(tls)) => drive(tls, &d, &url).await,
                Ok(Err(e)) => dial_failed(&d, &url, &format!("TLS handshake: {e}")),
                Err(_) => dial_failed(&d, &url, "TLS handshake timed out"),
            }
        }
    }
}

/// Every stream opened on a connection that could not be made ends with
/// `Unavailable`: nothing reached the sidecar, so reopening is safe.
fn dial_failed(d: &Dial, url: &str, why: &str) {
    tracing::warn!(upstream = url, error = why, "upstream unavailable");
    let message = format!("upstream {url} unavailable");
    for route in d.link.close() {
        route
            .sink
            .fail(route.id, Failure::Unavailable(message.clone().into()));
        if let Some(outcome) = &d.outcome {
            outcome(false);
        }
    }
}

async fn drive<IO>(io: IO, d: &Dial, url: &str)
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    tracing::debug!(upstream = url, "upstream connection established");
    if let Some(g) = &d.gauge {
        g.inc();
    }
    let role = SidecarRole {
        outcome: d.outcome.clone(),
    };
    let mut conn = Conn::new(io, d.link.clone(), role, d.local);
    let result = poll_fn(|cx| {
        let r = conn.poll_run(cx);
        if let Some(bytes) = &d.bytes {
            let n = conn.take_forwarded();
            if n > 0 {
                bytes.inc_by(n);
            }
        }
        r
    })
    .await;
    conn.shut();
    if let Some(g) = &d.gauge {
        g.dec();
    }
    match result {
        Ok(()) => tracing::debug!(upstream = url, "upstream connection closed"),
        Err(e) => tracing::info!(upstream = url, error = %e, "upstream connection ended"),
    }
}
