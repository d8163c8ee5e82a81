//! The one connection to the gateway: TCP (TCP_NODELAY) → rustls (ALPN h2,
//! client certificate) → hyper I/O, made at most once per [`Connector`].
//!
//! Channel tokens are bound to the TLS connection they were issued on, so a
//! tonic `Channel` must never quietly dial a second one after the first
//! broke: a second call of the connector fails, every RPC on the channel then
//! fails, and the agent starts over with a fresh connection and a fresh
//! `Hello`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

/// The I/O a [`Connector`] hands to hyper: TLS, or plain TCP for h2c.
pub type GatewayIo = TokioIo<Either<TlsStream<TcpStream>, TcpStream>>;

/// Why the connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connector was already used; a channel carries one connection only.
    #[error("the gateway connection is gone; a new one needs a new Hello")]
    AlreadyUsed,
    /// The URI names no host.
    #[error("gateway URI has no host")]
    NoHost,
    /// TCP connect failed.
    #[error("TCP connect to {addr}: {source}")]
    Tcp {
        /// host:port.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS handshake with {addr}: {source}")]
    Tls {
        /// host:port.
        addr: String,
        /// The I/O error (rustls errors are wrapped in it).
        #[source]
        source: std::io::Error,
    },
    /// The server chose a protocol other than HTTP/2.
    #[error("gateway negotiated ALPN {0:?}, not h2")]
    NotHttp2(String),
}

/// A tower connector that dials the gateway once.
#[derive(Clone)]
pub struct Connector {
    tls: Option<(TlsConnector, ServerName<'static>)>,
    used: Arc<AtomicBool>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// A connector that wraps TCP in TLS with `config`, verifying `server_name`.
    pub fn tls(config: Arc<rustls::ClientConfig>, server_name: ServerName<'static>) -> Self {
        Self {
            tls: Some((TlsConnector::from(config), server_name)),
            used: Arc::default(),
        }
    }

    /// A plaintext (h2c) connector, for `insecure: true`.
    pub fn plaintext() -> Self {
        Self {
            tls: None,
            used: Arc::default(),
        }
    }
}

impl tower::Service<Uri> for Connector {
    type Response = GatewayIo;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<GatewayIo, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let first = !self.used.swap(true, Ordering::SeqCst);
        let tls = self.tls.clone();
        Box::pin(async move {
            if !first {
                return Err(ConnectError::AlreadyUsed);
            }
            let host = uri.host().ok_or(ConnectError::NoHost)?;
            // `[::1]` in a URI is `::1` to the resolver.
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri
                .port_u16()
                .unwrap_or(if tls.is_some() { 443 } else { 80 });
            let addr = format!("{host}:{port}");
            let tcp =
                TcpStream::connect((host, port))
                    .await
                    .map_err(|source| ConnectError::Tcp {
                        addr: addr.clone(),
                        source,
                    })?;
            tcp.set_nodelay(true).map_err(|source| ConnectError::Tcp {
                addr: addr.clone(),
                source,
            })?;
            let Some((connector, server_name)) = tls else {
                return Ok(TokioIo::new(Either::Right(tcp)));
            };
            let stream = connector
                .connect(server_name, tcp)
                .await
                .map_err(|source| ConnectError::Tls { addr, source })?;
            match stream.get_ref().1.alpn_protocol() {
                None | Some(b"h2") => {}
                Some(other) => {
                    return Err(ConnectError::NotHttp2(
                        String::from_utf8_lossy(other).into_owned(),
                    ));
                }
            }
            Ok(TokioIo::new(Either::Left(stream)))
        })
    }
}
