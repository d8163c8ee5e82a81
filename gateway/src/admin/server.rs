//! The admin HTTP/1.1 port: `/healthz` (the process serves), `/readyz` (it
//! takes new agent connections: 503 while draining) and `/metrics` (the
//! Prometheus text format). Plain HTTP: bind it to a private address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::stats::Stats;

/// Content type of `/metrics` (what `prometheus-client` writes).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The bound admin port.
#[derive(Debug)]
pub struct AdminServer {
    tcp: TcpListener,
    stats: Arc<Stats>,
    ready: watch::Receiver<bool>,
}

impl AdminServer {
    /// An admin server on `tcp`; `ready` says whether `/readyz` answers 200.
    pub fn new(tcp: TcpListener, stats: Arc<Stats>, ready: watch::Receiver<bool>) -> Self {
        Self { tcp, stats, ready }
    }

    /// The same server answering `/readyz` from `ready`.
    #[must_use]
    pub fn with_ready(self, ready: watch::Receiver<bool>) -> Self {
        Self { ready, ..self }
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let connections = TaskTracker::new();
        loop {
            let (tcp, _) = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.tcp.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(crate::listener::ACCEPT_ERROR_BACKOFF).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let stats = self.stats.clone();
            let ready = self.ready.clone();
            let shutdown = shutdown.clone();
            connections.spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let response = answer(&stats, *ready.borrow(), &req);
                    async move { Ok::<_, Infallible>(response) }
                });
                let conn = http1::Builder::new().serve_connection(TokioIo::new(tcp), service);
                tokio::select! {
                    _ = conn => {}
                    () = shutdown.cancelled() => {}
                }
            });
        }
        connections.close();
        connections.wait().await;
    }
}

/// The admin port's answer to `req`.
pub fn answer(stats: &Stats, ready: bool, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    route(stats, ready, req.method(), req.uri().path())
}

fn route(stats: &Stats, ready: bool, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match path {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if ready => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(stats.metrics().encode())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::stats::Refusal;

    async fn body(r: Response<Full<Bytes>>) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let stats = Stats::default();
        let get = Method::GET;
        assert_eq!(route(&stats, true, &get, "/healthz").status(), 200);
        assert_eq!(route(&stats, true, &get, "/readyz").status(), 200);
        assert_eq!(route(&stats, false, &get, "/readyz").status(), 503);
        assert_eq!(route(&stats, false, &get, "/healthz").status(), 200);
        assert_eq!(route(&stats, true, &get, "/nope").status(), 404);
        assert_eq!(route(&stats, true, &Method::POST, "/metrics").status(), 405);

        stats.refuse(Refusal::MaxConnections);
        stats.incr(crate::stats::Counter::AccountsGranted);
        let r = route(&stats, true, &get, "/metrics");
        assert_eq!(r.headers()[header::CONTENT_TYPE], METRICS_CONTENT_TYPE);
        let text = body(r).await;
        assert!(
            text.contains("spinlink_gateway_refusals_total{reason=\"max_connections\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("spinlink_gateway_tokens_issued_total 1"),
            "{text}"
        );
        assert!(text.contains("# TYPE spinlink_gateway_certificate_expiry_seconds gauge"));
        assert!(text.ends_with("# EOF\n"));
    }
}
