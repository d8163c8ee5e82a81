//! The echo backend of the gateway-vs-peers benchmark: a tonic service
//! (`proto/echo.proto`, unary and bidi echo) that every proxy forwards to over
//! h2c, and that the load generator also reaches directly over its own TLS 1.3
//! mTLS port (the "direct" figures).
//!
//! It stands in for the sidecar: besides its own paths it answers the
//! `spinlink.v1.Tunnel` paths the gateway carries — `Relay` as the bidi echo,
//! `Cache` as the unary echo (the gateway forwards HTTP/2 streams without
//! decoding them, so a unary exchange is a stream like any other).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{Request, Uri};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use spinlink_proto::paths;
use tokio::net::TcpListener;
use tokio_stream::Stream;
use tonic::codegen::Service as _;
use tonic::{Response, Status, Streaming};

/// Generated code for `spinlink.bench.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("spinlink.bench.v1");
}

use pb::EchoMessage;
use pb::echo_server::{Echo, EchoServer};

/// The echo backend's unary path.
pub const UNARY: &str = "/spinlink.bench.v1.Echo/Unary";
/// The echo backend's bidi path.
pub const BIDI: &str = "/spinlink.bench.v1.Echo/Bidi";
/// Streams per connection the backend allows: proxies multiplex thousands of
/// client streams onto a few upstream connections.
pub const MAX_STREAMS: u32 = 100_000;

/// The echo service.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoService;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn unary(
        &self,
        req: tonic::Request<EchoMessage>,
    ) -> Result<Response<EchoMessage>, Status> {
        Ok(Response::new(req.into_inner()))
    }

    type BidiStream = Pin<Box<dyn Stream<Item = Result<EchoMessage, Status>> + Send>>;

    async fn bidi(
        &self,
        req: tonic::Request<Streaming<EchoMessage>>,
    ) -> Result<Response<Self::BidiStream>, Status> {
        // The inbound stream is the outbound one: each message is answered
        // as soon as it is decoded, with no task or channel in between.
        Ok(Response::new(Box::pin(req.into_inner())))
    }
}

/// Maps the tunnel paths onto the echo paths.
fn alias(mut req: Request<Incoming>) -> Request<Incoming> {
    let to = match req.uri().path() {
        paths::RELAY => BIDI,
        paths::CACHE => UNARY,
        _ => return req,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::from_static(to));
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    req
}

/// The arguments of `spinlink-bench` that start this backend
/// (`grpc-proxy echo`) with scratch directory `dir` and the dev PKI in `pki`.
pub fn args<'a>(
    dir: &'a std::path::Path,
    pki: &'a std::path::Path,
) -> anyhow::Result<[&'a str; 6]> {
    let path = crate::grpc_peers::path;
    Ok([
        "--dir",
        path(dir)?,
        "grpc-proxy",
        "echo",
        "--pki",
        path(pki)?,
    ])
}

/// Serves HTTP/2 connections from `listener`, over TLS when `tls` is given
/// (h2c otherwise), until the process ends.
pub async fn serve(listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // Out of file descriptors, most likely: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            match acceptor {
                None => serve_conn(tcp).await,
                Some(a) => {
                    if let Ok(tls) = a.accept(tcp).await {
                        serve_conn(tls).await;
                    }
                }
            }
        });
    }
}

async fn serve_conn<I>(io: I)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let echo = EchoServer::new(EchoService);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let mut echo = echo.clone();
        async move { echo.call(alias(req)).await }
    });
    let _ = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        // As the sidecar it stands in for sets it.
        .max_pending_accept_reset_streams(spinlink_sidecar::tunnel::MAX_PENDING_ACCEPT_RESETS)
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// Runs the backend: h2c on `h2c`, TLS 1.3 mTLS (the PKI's `sidecar`
/// certificate) on `tls`; prints `listening: echo-h2c ADDR` and `listening:
/// echo-tls ADDR`, then serves until killed.
pub fn run(pki_dir: &std::path::Path, h2c: SocketAddr, tls: SocketAddr) -> anyhow::Result<()> {
    let pki = spinlink_tls::dev::DevPki {
        dir: pki_dir.to_owned(),
    };
    let config = Arc::new(crate::grpc_wire::tls13_server(&pki, "sidecar")?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let plain = TcpListener::bind(h2c).await?;
        let secure = TcpListener::bind(tls).await?;
        println!("listening: echo-h2c {}", plain.local_addr()?);
        println!("listening: echo-tls {}", secure.local_addr()?);
        tokio::spawn(serve(plain, None));
        serve(secure, Some(config)).await;
        Ok(())
    })
}
