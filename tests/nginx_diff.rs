//! The differential test of the gateway's ingress against real nginx: one
//! nginx configuration (Deck-like UI, Gate-like API with optional client
//! certificates, a gRPC agent route with required ones, all on one port told
//! apart by name) served by `nginx` (apt) and by `spinlink gateway
//! --nginx-config`, in front of the same loopback upstreams started here (an
//! HTTP/1.1 echo server that also takes WebSocket-style upgrades, and an h2c
//! gRPC echo server). The same requests go to both — HTTP/1.1 and HTTP/2, gRPC
//! unary and bidi, accepted, missing and refused client certificates, unknown
//! host and path, oversized bodies, bodies that stall half-way, a client
//! that stops reading a large answer, an upstream whose kept-alive
//! connections fail under their second request (bodies sent again or not),
//! upstream answers framed every way
//! ([`RAW_ANSWERS`]) — and the outcomes (status, selected headers, bodies;
//! for that upstream, also the requests it saw on each of its connections)
//! must be equal. Differences that remain by design are in docs/ingress.md
//! (those in answers' framing are [`RAW_DIVERGENT`], where the gateway's
//! own status is checked); error pages are compared by status (their
//! footers name the server). Skipped with a note when nginx is not
//! installed.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use spinlink_tls::dev::{DevCa, Leaf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::{Proc, free_port};

const NGINX: &str = "/usr/sbin/nginx";
/// The client address every connection's PROXY header names.
const CLIENT_IP: &str = "203.0.113.7";

/// The answers the raw upstream gives, by path: the ways an HTTP/1.1
/// answer can be framed, well and badly.
const RAW_ANSWERS: &[(&str, &[u8])] = &[
    ("/raw/length", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"),
    (
        "/raw/chunked",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nx-trailer: 1\r\n\r\n",
    ),
    ("/raw/until-close", b"HTTP/1.1 200 OK\r\n\r\nhello"),
    ("/raw/http10", b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\nhello"),
    (
        "/raw/interim",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
    ),
    (
        "/raw/length-and-chunked",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ),
    (
        "/raw/gzip-encoded",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nhello",
    ),
    (
        "/raw/differing-lengths",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello",
    ),
    ("/raw/no-content", b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello"),
    (
        "/raw/http10-chunked",
        b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ),
    (
        "/raw/chunked-bare-lf",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\n0\nx-trailer: 1\n\n",
    ),
    ("/raw/garbage", b"SSH-2.0-OpenSSH_9.2\r\n\r\n"),
    ("/raw/nothing", b""),
];

/// Where the gateway answers a client otherwise than nginx 1.22.1 for one
/// of [`RAW_ANSWERS`], on purpose (docs/ingress.md): the path, over HTTP/2
/// to the client or not (`None`: both), the gateway's status, and why.
const RAW_DIVERGENT: &[(&str, Option<bool>, u16, &str)] = &[
    (
        "/raw/differing-lengths",
        None,
        502,
        "nginx 1.22.1 takes one of the lengths and cuts the body short; the gateway refuses the answer",
    ),
    (
        "/raw/garbage",
        None,
        502,
        "nginx reads an answer without a status line as HTTP/0.9 and passes its bytes on as they are, which the client cannot read; the gateway refuses it",
    ),
    (
        "/raw/interim",
        Some(true),
        200,
        "nginx 1.22.1 fails an HTTP/2 client's request whose upstream sent 100 Continue first (HTTP/1.1 clients get the final answer); the gateway skips it for both",
    ),
];

/// The gateway's status and why, where it answers `path` otherwise than
/// nginx on purpose.
fn raw_divergent(path: &str, h2: bool) -> Option<(u16, &'static str)> {
    RAW_DIVERGENT
        .iter()
        .find(|(p, over, _, _)| *p == path && over.is_none_or(|o| o == h2))
        .map(|(_, _, status, why)| (*status, *why))
}

fn raw_answer(name: &str) -> &'static [u8] {
    RAW_ANSWERS
        .iter()
        .find(|(path, _)| path.strip_prefix("/raw/") == Some(name))
        .map_or(b"", |(_, a)| a)
}

/// The upstreams a front's configuration names.
#[derive(Clone, Copy)]
struct Upstreams {
    echo: SocketAddr,
    echo_tls: SocketAddr,
    grpc: SocketAddr,
    /// One per front, so each front's requests are logged apart.
    closing: SocketAddr,
    raw: SocketAddr,
    silent: SocketAddr,
    /// Connecting hangs ([`spinlink_gateway::test_support::BlackHole`]).
    hole: SocketAddr,
    /// Connections are refused.
    refusing: SocketAddr,
}

/// The configuration both servers run; only the port and the closing
/// upstream differ.
fn nginx_conf(dir: &Path, port: u16, up: Upstreams) -> String {
    let d = dir.display();
    let Upstreams {
        echo,
        echo_tls,
        grpc,
        closing,
        raw,
        silent,
        hole,
        refusing,
    } = up;
    format!(
        r#"
worker_processes 1;
daemon off;
master_process off;
pid {d}/nginx-{port}.pid;
error_log {d}/nginx-error-{port}.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    proxy_http_version 1.1;
    proxy_set_header Host $host;
    proxy_set_header X-Real-IP $remote_addr;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-Proto $scheme;
    client_max_body_size 8m;
    send_timeout 2s;
    set_real_ip_from 127.0.0.1;
    real_ip_header proxy_protocol;

    upstream deck {{ server {echo}; }}
    upstream gate {{ server 127.0.0.1:1 down; server {echo}; }}
    upstream agents {{ server {grpc}; }}
    upstream deck_tls {{ server {echo_tls}; }}
    upstream closing {{ server {closing}; keepalive 8; }}
    upstream raw {{ server {raw}; keepalive 8; }}
    upstream failover {{ server {raw} max_fails=0; server {echo} backup; }}
    upstream hung {{ server {silent} max_fails=0; server {echo} backup; }}
    upstream unreachable {{ server {hole} max_fails=0; server {echo} backup; }}
    upstream refusing {{ server {refusing} max_fails=0; server {echo} backup; }}
    upstream nowhere {{ server {hole} max_fails=0; }}

    server {{
        listen 127.0.0.1:{port} ssl http2 proxy_protocol default_server;
        server_name deck.test;
        ssl_certificate {d}/server.crt;
        ssl_certificate_key {d}/server.key;
        location / {{ proxy_pass http://deck; }}
        location /small/ {{
            proxy_pass http://deck;
            client_max_body_size 1k;
        }}
        location /slow {{
            proxy_pass http://deck;
            proxy_read_timeout 1s;
        }}
        location /paced-upload/ {{
            proxy_pass http://deck;
            proxy_read_timeout 1s;
            proxy_send_timeout 5s;
        }}
        location /stalled-upload/ {{
            proxy_pass http://deck;
            client_body_timeout 1s;
        }}
        location /streamed/ {{
            proxy_pass http://deck;
            proxy_request_buffering off;
        }}
        location /tls/ {{
            proxy_pass https://deck_tls/;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {d}/upstream-ca.crt;
            proxy_ssl_name upstream.internal;
            proxy_ssl_server_name on;
        }}
        location /tls-wrong-name/ {{
            proxy_pass https://deck_tls/;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {d}/upstream-ca.crt;
            proxy_ssl_name other.internal;
        }}
        location /closing/ {{
            proxy_pass http://closing;
            proxy_set_header Connection "";
        }}
        location /raw/ {{
            proxy_pass http://raw;
            proxy_set_header Connection "";
        }}
        location /failover/ {{
            proxy_pass http://failover;
        }}
        location /hung/ {{
            proxy_pass http://hung;
            proxy_read_timeout 1s;
        }}
        location /unreachable/ {{
            proxy_pass http://unreachable;
            proxy_connect_timeout 300ms;
            proxy_read_timeout 30s;
        }}
        location /refusing/ {{
            proxy_pass http://refusing;
        }}
        location /nowhere/ {{
            proxy_pass http://nowhere;
            proxy_connect_timeout 300ms;
        }}
        location /ws {{
            proxy_pass http://deck;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
        }}
        location /ws-idle {{
            proxy_pass http://deck;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 1s;
        }}
        location /twice/ {{
            proxy_pass http://deck;
            # A location's own settings replace the inherited ones; these
            # two the gateway sends even where nginx is not told to.
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Twice one;
            proxy_set_header X-Twice two;
            proxy_set_header X-Empty-First "";
            proxy_set_header X-Empty-First three;
            proxy_set_header X-Empty-Last four;
            proxy_set_header X-Empty-Last "";
        }}
    }}
    server {{
        listen 127.0.0.1:{port} ssl http2 proxy_protocol;
        server_name api.test;
        ssl_certificate {d}/server.crt;
        ssl_certificate_key {d}/server.key;
        ssl_client_certificate {d}/clients-ca.crt;
        ssl_verify_client optional;
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_set_header X-SSL-Client-Cert $ssl_client_escaped_cert;
        location /api/ {{
            proxy_pass http://gate/;
            proxy_read_timeout 5s;
        }}
        location = /health {{ proxy_pass http://gate/healthz; }}
    }}
    server {{
        listen 127.0.0.1:{port} ssl http2 proxy_protocol;
        server_name agents.test;
        ssl_certificate {d}/server.crt;
        ssl_certificate_key {d}/server.key;
        ssl_client_certificate {d}/clients-ca.crt;
        ssl_verify_client on;
        location /test.Echo/ {{
            grpc_pass grpc://agents;
            grpc_read_timeout 30s;
            client_max_body_size 0;
        }}
    }}
}}
"#
    )
}

// ---------------------------------------------------------------- upstreams

/// The statuses of `requests` (method, path, body) sent one after another
/// over one HTTP/1.1 connection to the UI server.
async fn in_sequence(addr: SocketAddr, requests: &[(&str, &str, &'static str)]) -> Vec<u16> {
    let io = TokioIo::new(tls(addr, "deck.test", false, None).await);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut statuses = Vec::new();
    for (method, path, body) in requests {
        let req = Request::builder()
            .method(*method)
            .uri(*path)
            .header("host", "deck.test")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        // The connection takes the next request only once it has seen the
        // last answer's end: without waiting, a send can race that.
        send.ready()
            .await
            .unwrap_or_else(|e| panic!("{method} {path} to {addr} after {statuses:?}: {e}"));
        let resp = send
            .send_request(req)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} to {addr} after {statuses:?}: {e}"));
        statuses.push(resp.status().as_u16());
        resp.into_body().collect().await.unwrap();
    }
    statuses
}

/// The HTTP/1.1 echo over TLS, presenting `dir/upstream.crt`.
async fn echo_tls_server(dir: &Path) -> SocketAddr {
    let config = spinlink_tls::config::server_config(
        spinlink_tls::config::ServerFiles {
            cert: &dir.join("upstream.crt"),
            key: &dir.join("upstream.key"),
            client_ca: None,
        },
        spinlink_tls::config::ClientAuth::Off,
        &[b"http/1.1"],
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = tcp.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(echo);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// HTTP/1.1 echo: the body names what the upstream saw.
async fn echo_server() -> SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = tcp.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(echo);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

async fn echo(mut req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let h = |n: &str| {
        req.headers()
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap_or("?").to_owned())
            .collect::<Vec<_>>()
            .join("|")
    };
    if req.headers().contains_key("upgrade") {
        let text = format!(
            "host={} upgrade={} connection={} xri={}",
            h("host"),
            h("upgrade"),
            h("connection"),
            h("x-real-ip")
        );
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 64];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        return Ok(Response::builder()
            .status(101)
            .header("upgrade", "echo")
            .header("connection", "upgrade")
            .header("x-seen", text)
            .body(Full::new(Bytes::new()))
            .unwrap());
    }
    if req.uri().path().starts_with("/slow") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    if req.uri().path() == "/big-answer" {
        return Ok(Response::new(Full::new(Bytes::from(vec![
            b'x';
            BIG_ANSWER
        ]))));
    }
    let seen = format!(
        "method={}\nuri={}\nhost={}\nxff={}\nxfp={}\nxri={}\nssl-cert={}\nupgrade={}\n\
         x-twice={}\nx-empty-first={}\nx-empty-last={}\n",
        req.method(),
        req.uri(),
        h("host"),
        h("x-forwarded-for"),
        h("x-forwarded-proto"),
        h("x-real-ip"),
        h("x-ssl-client-cert"),
        h("upgrade"),
        h("x-twice"),
        h("x-empty-first"),
        h("x-empty-last"),
    );
    let framing = format!(
        "content-length={}\ntransfer-encoding={}\n",
        h("content-length"),
        h("transfer-encoding")
    );
    let body = req.into_body().collect().await?.to_bytes();
    let text = format!("{seen}{framing}body-bytes={}\n", body.len());
    Ok(Response::builder()
        .header("content-type", "text/plain")
        .header("x-echo", "yes")
        .body(Full::new(Bytes::from(text)))
        .unwrap())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The echo's answer to `/big-answer`: far more than the sockets between
/// a client and the upstream hold.
const BIG_ANSWER: usize = 64 << 20;

/// h2c gRPC echo: every request message comes back as it arrives, then
/// `grpc-status: 0` (or the status the path asks for).
async fn grpc_server() -> SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = tcp.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let fail = req.uri().path().ends_with("/Fail");
                    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(8);
                    let mut body = req.into_body();
                    tokio::spawn(async move {
                        while let Some(Ok(frame)) = body.frame().await {
                            if let Ok(data) = frame.into_data()
                                && tx.send(Ok(Frame::data(data))).await.is_err()
                            {
                                return;
                            }
                        }
                        let mut t = http::HeaderMap::new();
                        t.insert("grpc-status", if fail { "7" } else { "0" }.parse().unwrap());
                        if fail {
                            t.insert("grpc-message", "denied".parse().unwrap());
                        }
                        let _ = tx.send(Ok(Frame::trailers(t))).await;
                    });
                    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .header("content-type", "application/grpc")
                            .body(StreamBody::new(stream))
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

// ------------------------------------------------------------------ clients

#[derive(Debug)]
struct AnyServer;

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            m,
            c,
            d,
            &spinlink_tls::config::provider().signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            m,
            c,
            d,
            &spinlink_tls::config::provider().signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        spinlink_tls::config::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[derive(Clone)]
struct ClientCert {
    certs: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl ClientCert {
    fn from_files(cert: &Path, key: &Path) -> Self {
        Self {
            certs: CertificateDer::pem_file_iter(cert)
                .unwrap()
                .map(|c| c.unwrap())
                .collect(),
            key: Arc::new(PrivateKeyDer::from_pem_file(key).unwrap()),
        }
    }
}

async fn tls(
    addr: SocketAddr,
    sni: &str,
    h2: bool,
    cert: Option<&ClientCert>,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let b = rustls::ClientConfig::builder_with_provider(spinlink_tls::config::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer));
    let mut config = match cert {
        Some(c) => b
            .with_client_auth_cert(c.certs.clone(), c.key.clone_key())
            .unwrap(),
        None => b.with_no_client_auth(),
    };
    config.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    // Both listen with `proxy_protocol`, as behind the load balancer.
    tcp.write_all(format!("PROXY TCP4 {CLIENT_IP} 127.0.0.1 51000 {}\r\n", addr.port()).as_bytes())
        .await
        .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .unwrap()
}

/// What is compared.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    status: u16,
    /// Selected response headers and trailers.
    headers: Vec<(String, String)>,
    /// The body for successful answers; error pages are compared by status.
    body: String,
}

const COMPARED_HEADERS: [&str; 5] = [
    "content-type",
    "x-echo",
    "grpc-status",
    "grpc-message",
    "upgrade",
];

async fn outcome(resp: Response<Incoming>) -> Outcome {
    let status = resp.status().as_u16();
    let mut headers = Vec::new();
    let pick = |map: &http::HeaderMap, out: &mut Vec<(String, String)>| {
        for n in COMPARED_HEADERS {
            if let Some(v) = map.get(n) {
                out.push((n.to_owned(), v.to_str().unwrap_or("?").to_owned()));
            }
        }
    };
    pick(resp.headers(), &mut headers);
    let collected = resp.into_body().collect().await;
    let body = match collected {
        Ok(c) => {
            if let Some(t) = c.trailers() {
                pick(t, &mut headers);
            }
            String::from_utf8_lossy(&c.to_bytes()).into_owned()
        }
        Err(e) => format!("<body error: {e}>"),
    };
    if status >= 400 {
        // Error pages name the server; the content type is theirs too.
        headers.retain(|(n, _)| n != "content-type");
        return Outcome {
            status,
            headers,
            body: String::new(),
        };
    }
    Outcome {
        status,
        headers,
        body,
    }
}

/// One plain request.
#[derive(Clone)]
struct Req {
    sni: &'static str,
    host: &'static str,
    method: &'static str,
    path: &'static str,
    body: Vec<u8>,
    /// Send the body without Content-Length (chunked / no length on h2).
    stream_body: bool,
    /// Send the streamed body in four parts, this long apart.
    pace: Option<Duration>,
    /// Declare the body's length, send its first half, then nothing.
    stall: bool,
    cert: Option<ClientCert>,
}

impl Req {
    fn get(host: &'static str, path: &'static str) -> Self {
        Self {
            sni: host,
            host,
            method: "GET",
            path,
            body: Vec::new(),
            stream_body: false,
            pace: None,
            stall: false,
            cert: None,
        }
    }
}

async fn send(addr: SocketAddr, r: &Req, h2: bool) -> Outcome {
    let io = TokioIo::new(tls(addr, r.sni, h2, r.cert.as_ref()).await);
    let body: http_body_util::combinators::BoxBody<Bytes, BoxError> = if r.stall {
        let half = Bytes::copy_from_slice(&r.body[..r.body.len() / 2]);
        let first = futures::stream::iter([Ok::<_, BoxError>(Frame::data(half))]);
        StreamBody::new(futures::StreamExt::chain(first, futures::stream::pending())).boxed()
    } else if let Some(pace) = r.pace {
        let parts: Vec<Bytes> = r
            .body
            .chunks(r.body.len().div_ceil(4).max(1))
            .map(Bytes::copy_from_slice)
            .collect();
        let paced =
            futures::StreamExt::then(futures::stream::iter(parts), move |part| async move {
                tokio::time::sleep(pace).await;
                Ok::<_, BoxError>(Frame::data(part))
            });
        StreamBody::new(paced).boxed()
    } else if r.stream_body {
        let chunks: Vec<Result<Frame<Bytes>, BoxError>> = r
            .body
            .chunks(512)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        StreamBody::new(futures::stream::iter(chunks)).boxed()
    } else {
        Full::new(Bytes::from(r.body.clone()))
            .map_err(|e| match e {})
            .boxed()
    };
    let mut b = Request::builder().method(r.method);
    if r.stall {
        b = b.header("content-length", r.body.len());
    }
    if h2 {
        b = b.uri(format!("https://{}{}", r.host, r.path));
    } else {
        b = b.uri(r.path).header("host", r.host);
    }
    let req = b.body(body).unwrap();
    let resp = async {
        if h2 {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            send.send_request(req).await
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            send.send_request(req).await
        }
    };
    // Bounded: a request neither front answers or ends is an outcome too.
    let Ok(resp) = tokio::time::timeout(Duration::from_secs(15), resp).await else {
        return Outcome {
            status: 0,
            headers: Vec::new(),
            body: "<no answer within 15 s>".to_owned(),
        };
    };
    match resp {
        Ok(resp) => outcome(resp).await,
        Err(e) => Outcome {
            status: 0,
            headers: Vec::new(),
            body: format!(
                "<request failed: {}>",
                e.is_closed() || e.is_incomplete_message()
            ),
        },
    }
}

fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.extend_from_slice(&[0]);
    b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    b.extend_from_slice(msg);
    b.freeze()
}

/// gRPC over HTTP/2: sends `messages` one at a time, each after the echo of
/// the one before (bidi) — or all at once for one (unary) — and returns what
/// came back, messages joined by `|`.
async fn grpc(
    addr: SocketAddr,
    path: &str,
    messages: &[&str],
    cert: Option<&ClientCert>,
) -> Outcome {
    let io = TokioIo::new(tls(addr, "agents.test", true, cert).await);
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
    let req = Request::builder()
        .method("POST")
        .uri(format!("https://agents.test{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap();
    tx.send(Ok(Frame::data(grpc_frame(messages[0].as_bytes()))))
        .await
        .unwrap();
    let resp = match send.send_request(req).await {
        Ok(r) => r,
        Err(e) => {
            return Outcome {
                status: 0,
                headers: Vec::new(),
                body: format!("<request failed: {e}>"),
            };
        }
    };
    if resp.status() != 200 {
        return outcome(resp).await;
    }
    let status = resp.status().as_u16();
    let mut headers = Vec::new();
    for n in COMPARED_HEADERS {
        if let Some(v) = resp.headers().get(n) {
            headers.push((n.to_owned(), v.to_str().unwrap().to_owned()));
        }
    }
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    let mut next = 1;
    let mut tx = Some(tx);
    if messages.len() == 1 {
        tx = None;
    }
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("gRPC answer within 10 s");
        let Some(frame) = frame else { break };
        let frame = frame.unwrap();
        if let Some(t) = frame.trailers_ref() {
            for n in COMPARED_HEADERS {
                if let Some(v) = t.get(n) {
                    headers.push((n.to_owned(), v.to_str().unwrap().to_owned()));
                }
            }
            continue;
        }
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            buf.advance(5);
            got.push(String::from_utf8_lossy(&buf.split_to(len)).into_owned());
            // Bidi: the next message only after this echo arrived.
            if let Some(t) = &tx {
                if next < messages.len() {
                    t.send(Ok(Frame::data(grpc_frame(messages[next].as_bytes()))))
                        .await
                        .unwrap();
                    next += 1;
                } else {
                    tx = None;
                }
            }
        }
    }
    Outcome {
        status,
        headers,
        body: got.join("|"),
    }
}

/// An HTTP/1.1 upgrade, then bytes both ways over the upgraded connection.
async fn upgrade(addr: SocketAddr, path: &str, pauses: &[Duration]) -> Outcome {
    let mut s = tls(addr, "deck.test", false, None).await;
    s.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: deck.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let seen = head
        .lines()
        .find_map(|l| l.strip_prefix("x-seen: "))
        .unwrap_or("")
        .to_owned();
    if status != 101 {
        return Outcome {
            status,
            headers: Vec::new(),
            body: seen,
        };
    }
    // A ping after each pause (the pauses are the behaviour under test:
    // how long the upgraded connection may be quiet), and what came back.
    let mut echoes = Vec::new();
    for (i, pause) in pauses.iter().enumerate() {
        tokio::time::sleep(*pause).await;
        let ping = format!("ping-{i}");
        let mut echo = vec![0u8; ping.len()];
        let echoed = async {
            s.write_all(ping.as_bytes()).await?;
            s.read_exact(&mut echo).await
        };
        match tokio::time::timeout(Duration::from_secs(5), echoed).await {
            Ok(Ok(_)) => echoes.push(String::from_utf8_lossy(&echo).into_owned()),
            Ok(Err(_)) => {
                echoes.push("closed".to_owned());
                break;
            }
            Err(_) => {
                echoes.push("no echo within 5 s".to_owned());
                break;
            }
        }
    }
    Outcome {
        status,
        headers: Vec::new(),
        body: format!("{seen} / {}", echoes.join(" ")),
    }
}

/// A client that asks for [`BIG_ANSWER`] bytes and reads none for longer
/// than `send_timeout`, then reads what is left: the status, and whether
/// the whole answer came (the front closes the connection when its
/// `send_timeout` runs out).
async fn slow_reader(addr: SocketAddr) -> Outcome {
    let mut s = tls(addr, "deck.test", false, None).await;
    s.write_all(b"GET /big-answer HTTP/1.1\r\nHost: deck.test\r\n\r\n")
        .await
        .unwrap();
    // Not reading is the behaviour under test: 2 s of send_timeout, and
    // time for the sockets to fill first.
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Until the whole answer (head and body) is in, or the connection ends.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while got.len() <= BIG_ANSWER {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    let status = String::from_utf8_lossy(&got[..got.len().min(12)])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Outcome {
        status,
        headers: Vec::new(),
        body: format!(
            "whole answer: {}, connection ended: {ended}",
            got.len() > BIG_ANSWER
        ),
    }
}

// -------------------------------------------------------------------- test

struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_port(port: u16) {
    support::wait_for("listener", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_and_the_gateway_answer_alike() {
    if !Path::new(NGINX).exists() {
        eprintln!("note: {NGINX} not installed; skipping the nginx differential test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Certificates: the server's, a client CA with one client, and a client
    // from a CA nobody trusts.
    let ca = DevCa::generate("ingress test CA").unwrap();
    std::fs::write(d.join("clients-ca.crt"), ca.cert_pem()).unwrap();
    ca.issue(
        &Leaf::server("deck.test")
            .with_dns("deck.test")
            .with_dns("api.test")
            .with_dns("agents.test"),
    )
    .unwrap()
    .write(d, "server")
    .unwrap();
    ca.issue(&Leaf::client("agent-1").with_uri("spiffe://spinlink.dev/agent/agent-1"))
        .unwrap()
        .write(d, "client")
        .unwrap();
    let stranger = DevCa::generate("stranger CA").unwrap();
    stranger
        .issue(&Leaf::client("intruder"))
        .unwrap()
        .write(d, "intruder")
        .unwrap();
    let good = ClientCert::from_files(&d.join("client.crt"), &d.join("client.key"));
    let bad = ClientCert::from_files(&d.join("intruder.crt"), &d.join("intruder.key"));

    // An upstream speaking TLS under a name of its own CA.
    let upstream_ca = DevCa::generate("upstream CA").unwrap();
    std::fs::write(d.join("upstream-ca.crt"), upstream_ca.cert_pem()).unwrap();
    upstream_ca
        .issue(&Leaf::server("upstream.internal").with_dns("upstream.internal"))
        .unwrap()
        .write(d, "upstream")
        .unwrap();

    let echo = echo_server().await;
    let echo_tls = echo_tls_server(d).await;
    let grpc_addr = grpc_server().await;
    // One each, so each front's requests are logged apart.
    let (nginx_closing, nginx_closing_log) =
        spinlink_gateway::test_support::closing_upstream().await;
    let (gw_closing, gw_closing_log) = spinlink_gateway::test_support::closing_upstream().await;
    let black_hole = spinlink_gateway::test_support::BlackHole::new().await;
    let (refusing, _bound) = spinlink_gateway::test_support::refusing_address();
    let upstreams = Upstreams {
        echo,
        echo_tls,
        grpc: grpc_addr,
        closing: nginx_closing,
        raw: spinlink_gateway::test_support::raw_upstream(raw_answer).await,
        silent: spinlink_gateway::test_support::silent_upstream().await,
        hole: black_hole.addr(),
        refusing,
    };
    let (nginx_port, gw_port) = (free_port(), free_port());
    let nginx_conf_path: PathBuf = d.join("nginx.conf");
    std::fs::write(&nginx_conf_path, nginx_conf(d, nginx_port, upstreams)).unwrap();
    let gw_conf_path: PathBuf = d.join("gateway-nginx.conf");
    let gw_upstreams = Upstreams {
        closing: gw_closing,
        ..upstreams
    };
    std::fs::write(&gw_conf_path, nginx_conf(d, gw_port, gw_upstreams)).unwrap();

    let _nginx = Nginx(
        std::process::Command::new(NGINX)
            .args(["-p", &d.display().to_string(), "-c"])
            .arg(&nginx_conf_path)
            .stderr(std::fs::File::create(d.join("nginx.stderr")).unwrap())
            .spawn()
            .expect("starting nginx"),
    );
    let mut gw = Proc::start(
        "gateway",
        d,
        &[
            "gateway",
            "--nginx-config",
            &gw_conf_path.display().to_string(),
        ],
    );
    let gw_addr = gw.listening("gateway");
    assert_eq!(gw_addr.port(), gw_port);
    wait_port(nginx_port);
    let nginx_addr: SocketAddr = ([127, 0, 0, 1], nginx_port).into();

    let big = vec![b'x'; 2000];
    // On the UI server's connection, naming another host.
    let bad_host = |host: &'static str| Req {
        host,
        ..Req::get("deck.test", "/")
    };
    let post = |host: &'static str, path: &'static str, body: &[u8], stream: bool| Req {
        method: "POST",
        body: body.to_vec(),
        stream_body: stream,
        ..Req::get(host, path)
    };
    let with_cert = |r: Req, c: &ClientCert| Req {
        cert: Some(c.clone()),
        ..r
    };
    let cases: Vec<(&str, Req, bool)> = vec![
        ("ui", Req::get("deck.test", "/index.html?x=1"), false),
        ("ui h2", Req::get("deck.test", "/index.html?x=1"), true),
        // Every setting of one name is sent; an empty one adds nothing.
        (
            "proxy_set_header of one name twice",
            Req::get("deck.test", "/twice/x"),
            false,
        ),
        (
            "proxy_set_header of one name twice h2",
            Req::get("deck.test", "/twice/x"),
            true,
        ),
        (
            "tls upstream, verified",
            Req::get("deck.test", "/tls/index.html"),
            false,
        ),
        (
            "tls upstream, verified h2",
            Req::get("deck.test", "/tls/index.html"),
            true,
        ),
        (
            "tls upstream, wrong name",
            Req::get("deck.test", "/tls-wrong-name/x"),
            false,
        ),
        (
            "api prefix rewrite",
            Req::get("api.test", "/api/v1/applications"),
            false,
        ),
        (
            "api prefix rewrite h2",
            Req::get("api.test", "/api/v1/applications"),
            true,
        ),
        ("api exact", Req::get("api.test", "/health"), false),
        ("api exact h2", Req::get("api.test", "/health"), true),
        ("api no location", Req::get("api.test", "/other"), false),
        (
            "api with client cert",
            with_cert(Req::get("api.test", "/api/me"), &good),
            false,
        ),
        (
            "api with client cert h2",
            with_cert(Req::get("api.test", "/api/me"), &good),
            true,
        ),
        (
            "api with refused cert",
            with_cert(Req::get("api.test", "/api/me"), &bad),
            false,
        ),
        (
            "api with refused cert h2",
            with_cert(Req::get("api.test", "/api/me"), &bad),
            true,
        ),
        (
            "unknown host",
            Req {
                sni: "deck.test",
                ..Req::get("unknown.test", "/x")
            },
            false,
        ),
        ("unknown host and sni", Req::get("unknown.test", "/x"), true),
        (
            "agents host, unknown path",
            with_cert(Req::get("agents.test", "/nothing"), &good),
            false,
        ),
        (
            "agents host without cert",
            Req::get("agents.test", "/nothing"),
            false,
        ),
        (
            "host other than a client-checking sni",
            Req {
                sni: "agents.test",
                ..with_cert(Req::get("api.test", "/api/x"), &good)
            },
            false,
        ),
        (
            "body within limit",
            post("deck.test", "/small/up", &big[..1000], false),
            false,
        ),
        (
            "oversized body",
            post("deck.test", "/small/up", &big, false),
            false,
        ),
        (
            "oversized body h2",
            post("deck.test", "/small/up", &big, true),
            true,
        ),
        (
            "big body, other location",
            post("deck.test", "/big", &big, true),
            true,
        ),
        ("read timeout", Req::get("deck.test", "/slow"), false),
        // A body that takes longer to arrive than the read timeout: nginx
        // reads it whole, then sends it and starts the read timeout; the
        // gateway streams it and starts the read timeout once it has gone.
        (
            "upload slower than the read timeout",
            Req {
                pace: Some(Duration::from_millis(450)),
                ..post("deck.test", "/paced-upload/x", &big, true)
            },
            false,
        ),
        (
            "upload slower than the read timeout h2",
            Req {
                pace: Some(Duration::from_millis(450)),
                ..post("deck.test", "/paced-upload/x", &big, true)
            },
            true,
        ),
        // A body that stops half-way: no answer after client_body_timeout
        // (nginx closes the connection, or resets the HTTP/2 stream).
        (
            "stalled upload",
            Req {
                stall: true,
                ..post("deck.test", "/stalled-upload/x", &big, false)
            },
            false,
        ),
        (
            "stalled upload h2",
            Req {
                stall: true,
                ..post("deck.test", "/stalled-upload/x", &big, true)
            },
            true,
        ),
        // With proxy_request_buffering off a body goes as it comes. (One
        // without a length is not compared: nginx sends it chunked while
        // it is still arriving when the request goes out, and with a
        // length when it has all arrived — ngx_http_proxy_create_request's
        // `r->headers_in.chunked && r->reading_body` —, which here depends
        // on timing; the gateway sends it chunked.)
        (
            "body with a length, request buffering off",
            post("deck.test", "/streamed/x", &big, false),
            false,
        ),
        // Hosts nginx's ngx_http_validate_host refuses (400) or reads
        // otherwise than as they are written.
        ("host with two dots in a row", bad_host("deck..test"), false),
        (
            "host with two dots in a row h2",
            bad_host("deck..test"),
            true,
        ),
        ("host with a slash", bad_host("deck.test/x"), false),
        ("host that is a port alone", bad_host(":8443"), false),
        ("host with two trailing dots", bad_host("api.test.."), false),
        ("host with a trailing dot", bad_host("api.test."), false),
        // nginx's 421 looks at the server the Host names, not the SNI's.
        (
            "host of a client-checking server, sni of another",
            Req {
                sni: "deck.test",
                ..Req::get("api.test", "/api/x")
            },
            false,
        ),
        (
            "host of a server without client checks, sni of a checking one",
            Req {
                sni: "api.test",
                ..Req::get("deck.test", "/")
            },
            false,
        ),
    ];
    // How each front reads an upstream's answer framed every way
    // `raw_answer` frames one, over HTTP/1.1 and HTTP/2 to the client.
    let raw_cases: Vec<(String, Req, bool)> = RAW_ANSWERS
        .iter()
        .flat_map(|(path, _)| [(*path, false), (*path, true)])
        .filter(|(path, h2)| raw_divergent(path, *h2).is_none())
        .map(|(path, h2)| {
            let label = format!("upstream answer {path}{}", if h2 { " h2" } else { "" });
            (label, Req::get("deck.test", path), h2)
        })
        .collect();
    // A pool whose first server fails each request, with a `backup` that
    // answers: `/failover/` (the server takes the request and closes
    // without an answer) and `/hung/` (it never answers: after the
    // location's 1 s read timeout, the same rule, nginx's default
    // `proxy_next_upstream error timeout`, and 504 where nothing answered).
    // What was sent goes on to the next server unless its method is not
    // idempotent.
    let next_server_cases: Vec<(String, Req, bool)> = [
        (
            "failed",
            ["/failover/get", "/failover/post", "/failover/delete"],
        ),
        ("timed out", ["/hung/get", "/hung/post", "/hung/delete"]),
    ]
    .into_iter()
    .flat_map(|(what, [get, post_path, delete])| {
        [
            ("next server", Req::get("deck.test", get), false),
            ("next server h2", Req::get("deck.test", get), true),
            (
                "not idempotent",
                post("deck.test", post_path, b"", false),
                false,
            ),
            (
                "DELETE",
                Req {
                    method: "DELETE",
                    ..Req::get("deck.test", delete)
                },
                false,
            ),
            // A body read whole goes again with the request; a POST's does
            // not (its method is not idempotent).
            (
                "PUT with a body",
                Req {
                    method: "PUT",
                    ..post("deck.test", delete, &big[..1000], false)
                },
                false,
            ),
            (
                "PUT with a streamed body h2",
                Req {
                    method: "PUT",
                    ..post("deck.test", delete, &big[..1000], true)
                },
                true,
            ),
            (
                "POST with a body",
                post("deck.test", post_path, &big[..1000], false),
                false,
            ),
        ]
        .map(|(case, req, h2)| (format!("sent, {what}, {case}"), req, h2))
    })
    .collect();
    // No connection made — the server refuses it, or it does not come
    // within `proxy_connect_timeout` — and nothing sent: every request goes
    // on to the backup, a POST's body with it (nginx buffered it; the
    // gateway had not read it yet). Nothing left after a connect timeout:
    // 504.
    let unsent_cases: Vec<(String, Req, bool)> = [
        ("connect timeout", ["/unreachable/get", "/unreachable/post"]),
        ("refused", ["/refusing/get", "/refusing/post"]),
    ]
    .into_iter()
    .flat_map(|(what, [get, post_path])| {
        [
            ("GET", Req::get("deck.test", get), false),
            ("GET h2", Req::get("deck.test", get), true),
            (
                "POST without a body",
                post("deck.test", post_path, b"", false),
                false,
            ),
            (
                "POST with a body",
                post("deck.test", post_path, &big[..1000], false),
                false,
            ),
            (
                "POST with a streamed body h2",
                post("deck.test", post_path, &big[..1000], true),
                true,
            ),
        ]
        .map(|(case, req, h2)| (format!("not connected, {what}, {case}"), req, h2))
    })
    .chain([(
        "not connected, no server left".to_owned(),
        Req::get("deck.test", "/nowhere/x"),
        false,
    )])
    .collect();
    let cases: Vec<(&str, Req, bool)> = cases
        .into_iter()
        .chain(
            next_server_cases
                .iter()
                .chain(&unsent_cases)
                .chain(&raw_cases)
                .map(|(n, r, h2)| (n.as_str(), r.clone(), *h2)),
        )
        .collect();
    let mut differences = Vec::new();
    for (name, req, h2) in &cases {
        let n = send(nginx_addr, req, *h2).await;
        let g = send(gw_addr, req, *h2).await;
        if n != g {
            differences.push(format!("{name}:\n  nginx:   {n:?}\n  gateway: {g:?}"));
        } else {
            eprintln!("same: {name}: {} {:?}", n.status, n.body.lines().nth(3));
        }
    }
    // Where the gateway answers otherwise on purpose: its own answer.
    for (path, _) in RAW_ANSWERS {
        for h2 in [false, true] {
            let Some((status, why)) = raw_divergent(path, h2) else {
                continue;
            };
            let req = Req::get("deck.test", path);
            let n = send(nginx_addr, &req, h2).await;
            let g = send(gw_addr, &req, h2).await;
            if g.status != status {
                differences.push(format!(
                    "upstream answer {path} (h2: {h2}): the gateway answered {g:?}, not {status} ({why})"
                ));
            } else {
                eprintln!(
                    "by design: upstream answer {path} (h2: {h2}): gateway {status}, nginx {n:?}: {why}"
                );
            }
        }
    }
    let grpc_cases: Vec<(&str, &str, Vec<&str>, Option<&ClientCert>)> = vec![
        ("grpc unary", "/test.Echo/Unary", vec!["hello"], Some(&good)),
        (
            "grpc bidi",
            "/test.Echo/Bidi",
            vec!["one", "two", "three"],
            Some(&good),
        ),
        (
            "grpc error status",
            "/test.Echo/Fail",
            vec!["x"],
            Some(&good),
        ),
        ("grpc without cert", "/test.Echo/Unary", vec!["hello"], None),
        (
            "grpc refused cert",
            "/test.Echo/Unary",
            vec!["hello"],
            Some(&bad),
        ),
    ];
    for (name, path, msgs, cert) in &grpc_cases {
        let n = grpc(nginx_addr, path, msgs, *cert).await;
        let g = grpc(gw_addr, path, msgs, *cert).await;
        if n != g {
            differences.push(format!("{name}:\n  nginx:   {n:?}\n  gateway: {g:?}"));
        } else {
            eprintln!("same: {name}: {} {:?}", n.status, n.body);
        }
    }
    // An upstream whose kept-alive connections fail under their second
    // request: what each front answers over one client connection, and
    // what the upstream saw, connection by connection.
    let exchange = [
        ("GET", "/closing/a", ""),
        ("GET", "/closing/b", ""),
        ("POST", "/closing/c", ""),
        ("GET", "/closing/d", ""),
        ("DELETE", "/closing/e", ""),
        // Read whole, a body goes again with its request; a POST's does not.
        ("PUT", "/closing/f", "a body"),
        ("GET", "/closing/g", ""),
        ("POST", "/closing/h", "a body"),
    ];
    let n = (
        in_sequence(nginx_addr, &exchange).await,
        nginx_closing_log.lock().unwrap().clone(),
    );
    let g = (
        in_sequence(gw_addr, &exchange).await,
        gw_closing_log.lock().unwrap().clone(),
    );
    assert!(
        n.1.len() > exchange.len(),
        "nginx sent no request twice: the case tests nothing ({:?})",
        n.1
    );
    if n != g {
        differences.push(format!(
            "kept-alive connection failing:\n  nginx:   {n:?}\n  gateway: {g:?}"
        ));
    } else {
        eprintln!("same: kept-alive connection failing: {:?}", n.0);
    }
    let (n, g) = tokio::join!(slow_reader(nginx_addr), slow_reader(gw_addr));
    assert!(
        !n.body.starts_with("whole answer: true"),
        "nginx sent the whole answer to a client that read nothing: the case tests nothing ({n:?})"
    );
    if n != g {
        differences.push(format!("slow reader:\n  nginx:   {n:?}\n  gateway: {g:?}"));
    } else {
        eprintln!("same: slow reader: {} {:?}", n.status, n.body);
    }
    // An upgraded connection ends once nothing has moved either way for the
    // location's proxy_read_timeout (1 s on /ws-idle); traffic keeps it up.
    let quiet = Duration::from_millis(2000);
    let busy = [Duration::from_millis(400); 5];
    let upgrades: [(&str, &str, &[Duration]); 3] = [
        ("upgrade", "/ws", &[Duration::ZERO]),
        (
            "upgrade, quiet past the read timeout",
            "/ws-idle",
            &[Duration::ZERO, quiet],
        ),
        ("upgrade, busy past the read timeout", "/ws-idle", &busy),
    ];
    for (name, path, pauses) in upgrades {
        let (n, g) = tokio::join!(
            upgrade(nginx_addr, path, pauses),
            upgrade(gw_addr, path, pauses)
        );
        if n != g {
            differences.push(format!("{name}:\n  nginx:   {n:?}\n  gateway: {g:?}"));
        } else {
            eprintln!("same: {name}: {} {:?}", n.status, n.body);
        }
    }
    assert!(
        differences.is_empty(),
        "{} difference(s):\n{}\n{}",
        differences.len(),
        differences.join("\n"),
        gw.log_tail()
    );
}
