//! The agent's client to an account's API server: kube-rs's middleware over a
//! hyper client that speaks HTTP/2 when the server offers it by ALPN, as
//! client-go does, so every watch, list and relayed request of an account
//! shares a handful of TCP connections instead of holding one each.
//!
//! Start at [`builder`]; [`pool`] spreads requests over connections within
//! the server's stream limit and [`counted`] counts the connections
//! (`spinlink_agent_apiserver_connections`).

pub mod counted;
pub mod pool;

use std::time::Duration;

use http::{Request, Response};
use hyper_util::client::legacy::{self, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ClientBuilder, ConfigExt as _, DynBody};
use prometheus_client::metrics::gauge::Gauge;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};
use tower_http::ServiceExt as _;

use counted::Counting;

/// With no frame from the server for this long, the client pings it
/// (client-go's `ReadIdleTimeout`).
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(30);

/// A ping not answered within this closes the connection, failing its
/// streams so the watches reconnect (client-go's `PingTimeout`).
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Flow-control window of one stream: what the server may send on a stream
/// the agent is not reading (its watches wait while the sidecar is behind)
/// before the stream waits. A 500-object page streams through it.
pub const STREAM_WINDOW: u32 = 1024 * 1024;

/// Flow-control window of a connection: every stream's window, so a stream
/// that waits never holds up the others on the connection (relayed
/// requests share it with the watches).
pub const CONNECTION_WINDOW: u32 = STREAM_WINDOW * pool::MAX_STREAMS_PER_CONNECTION as u32;

/// A slot's connector: TCP counted in the account's gauge, TLS offering
/// `h2` and `http/1.1`, kube's connect, read and write timeouts.
pub type Connector =
    hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<Counting<HttpConnector>>>;

/// The service stack kube-rs's client runs on.
pub type Service =
    tower::util::BoxService<Request<kube::client::Body>, Response<Box<DynBody>>, BoxError>;

/// A client builder for `config`, as kube-rs's `ClientBuilder::try_from`
/// makes it — base URI, retries on 429/503/504, authentication (tokens,
/// token files and exec plugins refreshed as they expire), extra and
/// impersonation headers, tracing — over a [`pool::Pool`] of HTTP/2
/// connections instead of kube's HTTP/1.1-only hyper client. Open TCP
/// connections count in `connections`.
///
/// A proxied configuration (`proxy-url`) keeps kube-rs's own client, which
/// refuses the proxy schemes this build leaves out. The expiry of a client
/// certificate an exec plugin hands out (`Client::valid_until`) is not
/// recorded: the agent does not read it, and reading it here would run the
/// plugin a second time.
pub fn builder(config: &kube::Config, connections: Gauge) -> kube::Result<ClientBuilder<Service>> {
    if config.proxy_url.is_some() {
        return ClientBuilder::try_from(config.clone());
    }
    let tls = config.rustls_client_config()?;
    let server_name = match &config.tls_server_name {
        Some(name) => Some(
            rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(kube::client::RustlsTlsError::InvalidServerName)
                .map_err(kube::Error::RustlsTls)?,
        ),
        None => None,
    };
    let timeouts = (
        config.connect_timeout,
        config.read_timeout,
        config.write_timeout,
        config.reset_reader_on_write,
    );
    let make = move |slot: Gauge| {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http();
        let https = match &server_name {
            Some(name) => https.with_server_name_resolver(
                hyper_rustls::FixedServerNameResolver::new(name.clone()),
            ),
            None => https,
        };
        // ALPN `h2`, `http/1.1`: HTTP/2 when the server offers it, as
        // client-go asks; plain `http://` stays HTTP/1.1.
        let https = https.enable_all_versions().wrap_connector(Counting::new(
            tcp,
            connections.clone(),
            slot,
        ));
        let mut connector = hyper_timeout::TimeoutConnector::new(https);
        connector.set_connect_timeout(timeouts.0);
        connector.set_read_timeout(timeouts.1);
        connector.set_write_timeout(timeouts.2);
        connector.set_reset_reader_on_write(timeouts.3);
        hyper_client(connector)
    };
    let pool = pool::Pool::new(Box::new(make));
    Ok(ClientBuilder::new(
        stack(config, pool)?,
        config.default_namespace.clone(),
    ))
}

/// A slot's hyper client: keepalive pings like client-go's, flow-control
/// windows sized so that no stream waits for another.
fn hyper_client<C>(connector: C) -> legacy::Client<C, kube::client::Body>
where
    C: legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER_IDLE)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .http2_initial_stream_window_size(STREAM_WINDOW)
        .http2_initial_connection_window_size(CONNECTION_WINDOW)
        .build(connector)
}

/// kube-rs's middleware around `pool`, in kube-rs's order (outermost
/// first). gzip is left out as kube-rs leaves it out without its `gzip`
/// feature, which this build does not enable.
fn stack<C>(config: &kube::Config, pool: pool::Pool<C>) -> kube::Result<Service>
where
    C: legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    use tower_http::classify::ServerErrorsFailureClass;
    use tower_http::trace::TraceLayer;
    let trace = TraceLayer::new_for_http()
        .make_span_with(|req: &Request<kube::client::Body>| {
            tracing::debug_span!(
                "HTTP",
                http.method = %req.method(),
                http.url = %req.uri(),
                http.status_code = tracing::field::Empty,
                otel.name = req.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
                otel.kind = "client",
                otel.status_code = tracing::field::Empty,
            )
        })
        .on_request(|_: &Request<kube::client::Body>, _: &tracing::Span| {
            tracing::debug!("requesting");
        })
        .on_response(
            |res: &Response<pool::Body>, _: Duration, span: &tracing::Span| {
                let status = res.status();
                span.record("http.status_code", status.as_u16());
                if status.is_client_error() || status.is_server_error() {
                    span.record("otel.status_code", "ERROR");
                }
            },
        )
        .on_body_chunk(())
        .on_eos(
            |_: Option<&http::HeaderMap>, _: Duration, _: &tracing::Span| {
                tracing::debug!("stream closed");
            },
        )
        .on_failure(
            |failure: ServerErrorsFailureClass, _: Duration, span: &tracing::Span| {
                span.record("otel.status_code", "ERROR");
                match failure {
                    ServerErrorsFailureClass::StatusCode(status) => {
                        span.record("http.status_code", status.as_u16());
                        tracing::error!("failed with status {}", status)
                    }
                    ServerErrorsFailureClass::Error(err) => {
                        tracing::error!("failed with error {}", err)
                    }
                }
            },
        );
    let service = ServiceBuilder::new()
        // Relative request paths onto the server's URL.
        .layer(config.base_uri_layer())
        // 429, 503 and 504 retried with backoff, honouring Retry-After.
        .option_layer(config.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        // Credentials: a fixed token or basic auth, or a token refreshed
        // from a file or an exec plugin before it expires.
        .option_layer(config.auth_layer()?)
        // The kubeconfig's extra and impersonation headers.
        .layer(config.extra_headers_layer()?)
        // A span per request, as kube-rs traces it.
        .layer(trace)
        .map_err(BoxError::from)
        .service(pool);
    Ok(service
        .map_response_body(|body| {
            Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
        })
        .boxed())
}
