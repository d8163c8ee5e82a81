use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use spinlink_nginx_compat::{Options, parse_str};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A gateway serving in the background, stopped by [`Running::stop`].
struct Running {
    addr: std::net::SocketAddr,
    stats: Arc<crate::stats::Stats>,
    shutdown: CancellationToken,
    run: tokio::task::JoinHandle<crate::Result<()>>,
}

impl Running {
    async fn start(config: crate::Config) -> Running {
        let gateway = crate::Gateway::bind(config).await.unwrap();
        let addr = gateway.local_addr();
        let stats = gateway.stats();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(gateway.run(shutdown.clone()));
        Running {
            addr,
            stats,
            shutdown,
            run,
        }
    }

    /// Shuts the gateway down and waits (bounded) for its drain.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(10), self.run)
            .await
            .expect("drains")
            .unwrap()
            .unwrap();
    }
}

fn compile(http_block: &str) -> Result<Ingress, CompileError> {
    let text = format!("events {{}}\nhttp {{\n{http_block}\n}}\n");
    let parsed = parse_str(&text, "test.conf", &Options::new()).expect("valid nginx");
    Ingress::compile(&parsed.ingress)
}

fn path_of(ingress: &Ingress, server: usize, path: &str) -> Option<String> {
    select(&ingress.servers[server].routes, path).map(|r| r.path.clone())
}

const NAMES: &str = r#"
upstream u { server 127.0.0.1:9; }
server { listen 8080; server_name first.test; location / { proxy_pass http://u; } }
server { listen 8080 default_server; server_name *.example.com .wild.test; location / { proxy_pass http://u; } }
server { listen 8080; server_name *.api.example.com www.shop.*; location / { proxy_pass http://u; } }
server { listen 8080; server_name exact.api.example.com; location / { proxy_pass http://u; } }
"#;

#[test]
fn server_names_match_in_nginx_order() {
    let i = compile(NAMES).unwrap();
    assert_eq!(i.find_server("first.test"), Some(0));
    assert_eq!(i.find_server("FIRST.test."), Some(0));
    // Exact beats any wildcard; the longest leading wildcard wins.
    assert_eq!(i.find_server("exact.api.example.com"), Some(3));
    assert_eq!(i.find_server("x.api.example.com"), Some(2));
    assert_eq!(i.find_server("x.example.com"), Some(1));
    // `.wild.test` also matches the bare name.
    assert_eq!(i.find_server("wild.test"), Some(1));
    assert_eq!(i.find_server("a.wild.test"), Some(1));
    assert_eq!(i.find_server("www.shop.de"), Some(2));
    assert_eq!(i.find_server("nothing.test"), None);
    // Unknown names fall to the `default_server`, not the first.
    assert_eq!(i.default, 1);
}

#[test]
fn locations_select_exact_then_longest_prefix_then_nested() {
    let i = compile(
        r#"
upstream u { server 127.0.0.1:9; }
server {
    listen 8080;
    location / { proxy_pass http://u; }
    location /api/ { proxy_pass http://u; location /api/v2/ { proxy_pass http://u; } }
    location = /api/ { proxy_pass http://u; }
    location /ap { proxy_pass http://u; }
}
"#,
    )
    .unwrap();
    assert_eq!(path_of(&i, 0, "/api/").as_deref(), Some("/api/"));
    assert_eq!(
        select(&i.servers[0].routes, "/api/").map(|r| r.kind),
        Some(MatchKind::Exact)
    );
    assert_eq!(path_of(&i, 0, "/api/x").as_deref(), Some("/api/"));
    assert_eq!(path_of(&i, 0, "/api/v2/x").as_deref(), Some("/api/v2/"));
    assert_eq!(path_of(&i, 0, "/apx").as_deref(), Some("/ap"));
    assert_eq!(path_of(&i, 0, "/").as_deref(), Some("/"));
}

#[test]
fn compile_errors_name_the_key_and_the_reason() {
    let e = compile(
        "server { listen 80; location / { proxy_pass http://127.0.0.1:9; proxy_set_header X $connection_upgrade; } }",
    )
    .unwrap_err();
    assert_eq!(e.key, "servers[0].locations[0].headers[0]");
    assert!(
        e.message
            .contains("unknown variable \"$connection_upgrade\""),
        "{e}"
    );

    let e = compile(
        "server { listen 80; location / { proxy_pass https://127.0.0.1:9; \
         proxy_ssl_trusted_certificate /nonexistent/ca.pem; } }",
    )
    .unwrap_err();
    assert_eq!(e.key, "servers[0].locations[0].upstreamTls");
    assert!(e.message.contains("/nonexistent/ca.pem"), "{e}");

    let e = compile("server { listen 80; } server { listen 81; }").unwrap_err();
    assert_eq!(e.key, "servers");
    assert!(e.message.contains("one port"), "{e}");

    let e = compile("server { listen 80; set_real_ip_from 10.0.0.0/8; real_ip_header X-Real-IP; }")
        .unwrap_err();
    assert_eq!(e.key, "servers[0].realIp.header");

    let e = compile("upstream u { server 127.0.0.1:9 down; } server { listen 80; location / { proxy_pass http://u; } }")
        .unwrap_err();
    assert!(e.message.contains("no usable server"), "{e}");
}

#[test]
fn config_takes_an_ingress_without_tls_or_upstreams_and_refuses_unknown_keys() {
    let parsed = parse_str(
        "events {} http { server { listen 127.0.0.1:8080; location / { proxy_pass http://127.0.0.1:9; } } }",
        "t.conf",
        &Options::new(),
    )
    .unwrap();
    let yaml =
        from_nginx::config_yaml(&parsed.ingress, std::path::Path::new("/etc/nginx")).unwrap();
    let config = crate::Config::from_yaml_str(&yaml, "converted").unwrap();
    assert!(config.ingress.is_some());

    let bad = yaml.replace("matchKind:", "matchKnd:");
    let e = crate::Config::from_yaml_str(&bad, "converted")
        .unwrap_err()
        .to_string();
    assert!(e.contains("matchKnd"), "{e}");

    // Without an ingress the old requirements hold.
    let e = crate::Config::from_yaml_str("listen: 127.0.0.1:0\n", "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tls"), "{e}");
}

#[test]
fn proxy_protocol_listens_need_trusted_proxies() {
    let parsed = parse_str(
        "events {} http { server { listen 8443 proxy_protocol; location / { proxy_pass http://127.0.0.1:9; } } }",
        "t.conf",
        &Options::new(),
    )
    .unwrap();
    assert!(from_nginx::config_yaml(&parsed.ingress, std::path::Path::new("/etc/nginx")).is_err());
    let parsed = parse_str(
        "events {} http { set_real_ip_from 10.0.0.0/8; set_real_ip_from 192.0.2.1; real_ip_header proxy_protocol;
         server { listen 8443 proxy_protocol; location / { proxy_pass http://127.0.0.1:9; } } }",
        "t.conf",
        &Options::new(),
    )
    .unwrap();
    let yaml =
        from_nginx::config_yaml(&parsed.ingress, std::path::Path::new("/etc/nginx")).unwrap();
    let config = crate::Config::from_yaml_str(&yaml, "converted").unwrap();
    assert!(config.listener.proxy_protocol);
    assert_eq!(
        config.listener.trusted_proxies,
        ["10.0.0.0/8", "192.0.2.1/32"]
    );
    assert_eq!(config.listen.port(), 8443);
}

/// An upstream that answers with the request head it saw.
async fn head_echo() -> std::net::SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = tcp.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let mut text = format!("{} {}\n", req.method(), req.uri());
                    let mut names: Vec<_> = req.headers().iter().collect();
                    names.sort_by_key(|(n, _)| n.as_str());
                    for (n, v) in names {
                        text.push_str(&format!("{n}: {}\n", v.to_str().unwrap_or("?")));
                    }
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

async fn http1(
    addr: std::net::SocketAddr,
    req: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = send.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The gateway configuration `spinlink gateway --nginx-config` makes of
/// `nginx` (conf prefix `/etc/nginx`), with `extra` YAML appended.
fn config_from_nginx(nginx: &str, extra: &str) -> crate::Config {
    let parsed = parse_str(nginx, "t.conf", &Options::new()).unwrap();
    let yaml =
        from_nginx::config_yaml(&parsed.ingress, std::path::Path::new("/etc/nginx")).unwrap();
    crate::Config::from_yaml_str(&format!("{yaml}{extra}"), "t").unwrap()
}

/// The `X-Forwarded-*` headers the gateway adds by default, as the head echo
/// shows them for a plain request to `app.test` that came with
/// `X-Forwarded-For: 198.51.100.1`.
fn assert_forwarded_defaults(body: &str) {
    for line in [
        "x-forwarded-for: 198.51.100.1, 127.0.0.1\n",
        "x-forwarded-proto: http\n",
        "x-forwarded-host: app.test\n",
    ] {
        assert!(body.contains(line), "{line:?} missing: {body}");
    }
}

/// A plain-HTTP ingress on a real gateway next to a configured tunnel: headers
/// set, removed and added, the URI rewritten, the body limit, and tunnel paths
/// refused without a verified agent identity.
#[tokio::test]
async fn plain_ingress_routes_rewrites_and_guards_the_tunnel() {
    let upstream = head_echo().await;
    let port = free_port();
    let nginx = format!(
        r#"events {{}} http {{
upstream app {{ server {upstream}; }}
server {{
    listen 127.0.0.1:{port};
    server_name app.test;
    proxy_set_header Host $host;
    proxy_set_header X-Drop "";
    proxy_set_header X-Path "$request_method $uri?$args";
    location /api/ {{ proxy_pass http://app/v1/; client_max_body_size 10; }}
}}
}}"#
    );
    // A tunnel upstream too: `/spinlink.v1.` paths are then the tunnel's.
    let config = config_from_nginx(
        &nginx,
        "upstreams:\n  - url: http://127.0.0.1:9\nshutdownGraceSeconds: 1\n",
    );
    let running = Running::start(config).await;
    let addr = running.addr;

    let req = Request::get("/api/apps?x=1")
        .header("host", "APP.test:8080")
        .header("x-drop", "secret")
        .header("x-forwarded-for", "198.51.100.1")
        .header("connection", "keep-alive, x-hop")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = http1(addr, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.starts_with("GET /v1/apps?x=1\n"), "{body}");
    assert!(body.contains("host: app.test\n"), "{body}");
    assert!(!body.contains("x-drop"), "{body}");
    assert!(body.contains("x-path: GET /api/apps?x=1\n"), "{body}");
    assert_forwarded_defaults(&body);

    let req = Request::post("/api/upload")
        .header("host", "app.test")
        .body(Full::new(Bytes::from_static(b"more than ten bytes")))
        .unwrap();
    assert_eq!(http1(addr, req).await.0, StatusCode::PAYLOAD_TOO_LARGE);

    let req = Request::get("/elsewhere")
        .header("host", "app.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(http1(addr, req).await.0, StatusCode::NOT_FOUND);

    let req = Request::post(spinlink_proto::paths::HELLO)
        .header("host", "app.test")
        .header("content-type", "application/grpc")
        .header(crate::identity::DEV_IDENTITY_HEADER, "agent-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, _) = http1(addr, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"16"[..]),
        "the dev identity header is never believed on an ingress listener"
    );

    running.stop().await;
}

/// Two servers in an upstream block, the first refusing connections: every
/// request without a body still reaches the second with all its headers
/// (the headers a try takes are kept for the next one), and a location's own
/// `X-Forwarded-*` lines replace the gateway's defaults instead of joining them.
///
/// The nginx behaviour expected here is nginx's source
/// (`src/http/modules/ngx_http_proxy_module.c`): `Host: $proxy_host`, the
/// upstream block's name, is in its default `ngx_http_proxy_headers`, and
/// `$proxy_add_x_forwarded_for` is the incoming `X-Forwarded-For` values, ", ",
/// then the client address (`ngx_http_proxy_add_x_forwarded_for_variable`).
/// The `X-Forwarded-Proto`/`-Host` defaults are the gateway's own
/// (docs/ingress.md), not nginx's.
#[tokio::test]
async fn a_refused_try_goes_to_the_next_server_with_the_same_headers() {
    let upstream = head_echo().await;
    let dead = free_port();
    let port = free_port();
    let nginx = format!(
        r#"events {{}} http {{
upstream app {{ server 127.0.0.1:{dead} max_fails=0; server {upstream} max_fails=0; }}
server {{
    listen 127.0.0.1:{port};
    server_name app.test;
    location / {{ proxy_pass http://app; proxy_set_header X-Path "$request_method $uri"; }}
    location /own/ {{
        proxy_pass http://app;
        proxy_set_header X-Forwarded-Proto "custom-$scheme";
        proxy_set_header X-Forwarded-Host "";
    }}
}}
}}"#
    );
    let running = Running::start(config_from_nginx(&nginx, "")).await;

    // Round robin: of four requests, two try the refusing server first.
    for i in 0..4 {
        let req = Request::get(format!("/r{i}"))
            .header("host", "app.test")
            .header("x-forwarded-for", "198.51.100.1")
            .header("x-client", format!("c{i}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, _, body) = http1(running.addr, req).await;
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
        assert!(body.starts_with(&format!("GET /r{i}\n")), "{body}");
        assert!(body.contains(&format!("x-client: c{i}\n")), "{body}");
        assert!(body.contains(&format!("x-path: GET /r{i}\n")), "{body}");
        assert!(body.contains("host: app\n"), "{body}");
        assert_forwarded_defaults(&body);
    }

    let req = Request::get("/own/x")
        .header("host", "app.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = http1(running.addr, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body.matches("x-forwarded-proto: ").count(),
        1,
        "one X-Forwarded-Proto: {body}"
    );
    assert!(body.contains("x-forwarded-proto: custom-http\n"), "{body}");
    assert!(!body.contains("x-forwarded-host"), "{body}");
    assert!(body.contains("x-forwarded-for: 127.0.0.1\n"), "{body}");

    running.stop().await;
}

/// An upstream that answers with the request's method, URI and body length.
async fn body_echo() -> std::net::SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = tcp.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await?.to_bytes();
                    let text = format!("{} {} {}", parts.method, parts.uri, body.len());
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// nginx's `proxy_next_upstream error timeout` where no connection was
/// made: the request goes on to the next server whatever its method, body
/// and all (nothing of it was sent), after `proxy_connect_timeout` for a
/// server that does not answer the connect (not after the read timeout);
/// 504 when no server is left after a connect timeout.
#[tokio::test]
async fn a_request_no_server_took_goes_on_body_and_all_after_the_connect_timeout() {
    let echo = body_echo().await;
    let black_hole = crate::test_support::BlackHole::new().await;
    let hole = black_hole.addr();
    let (refusing, _bound) = crate::test_support::refusing_address();
    let port = free_port();
    let nginx = format!(
        r#"events {{}} http {{
upstream hole {{ server {hole} max_fails=0; server {echo} backup; }}
upstream refused {{ server {refusing} max_fails=0; server {echo} backup; }}
upstream hole_only {{ server {hole}; }}
server {{
    listen 127.0.0.1:{port};
    server_name app.test;
    location /hole/ {{
        proxy_pass http://hole;
        proxy_connect_timeout 200ms;
        proxy_read_timeout 60s;
    }}
    location /refused/ {{ proxy_pass http://refused; }}
    location /nowhere/ {{ proxy_pass http://hole_only; proxy_connect_timeout 200ms; }}
}}
}}"#
    );
    let running = Running::start(config_from_nginx(&nginx, "")).await;
    let request = |method: &str, path: &str, body: &'static str| {
        Request::builder()
            .method(method)
            .uri(path)
            .header("host", "app.test")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    for (method, path, body, want) in [
        ("GET", "/hole/a", "", "GET /hole/a 0"),
        ("POST", "/hole/b", "", "POST /hole/b 0"),
        ("POST", "/hole/c", "hello", "POST /hole/c 5"),
        ("PATCH", "/refused/d", "hello world", "PATCH /refused/d 11"),
    ] {
        let (status, _, answer) = http1(running.addr, request(method, path, body)).await;
        assert_eq!(
            (status, answer.as_str()),
            (StatusCode::OK, want),
            "{method} {path}"
        );
    }
    let (status, _, answer) = http1(running.addr, request("GET", "/nowhere/e", "")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{answer}");
    running.stop().await;
}

/// An upstream that answers with how the request's body came (its
/// `Content-Length` and `Transfer-Encoding`) and the body itself, and counts
/// the connections it accepted.
async fn framing_echo() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = tcp.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let (parts, body) = req.into_parts();
                    let h = |n| {
                        parts
                            .headers
                            .get(n)
                            .map_or("-", |v| v.to_str().unwrap_or("?"))
                            .to_owned()
                    };
                    let (cl, te) = (
                        h(http::header::CONTENT_LENGTH),
                        h(http::header::TRANSFER_ENCODING),
                    );
                    let body = body.collect().await?.to_bytes();
                    let text = format!("cl={cl} te={te} {}", String::from_utf8_lossy(&body));
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, accepted)
}

/// What a raw HTTP/1.1 client that writes `parts` one after another reads
/// back until the gateway closes the connection.
async fn raw_exchange(addr: std::net::SocketAddr, parts: &[&[u8]]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    for part in parts {
        tcp.write_all(part).await.unwrap();
        tcp.flush().await.unwrap();
    }
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tcp.read_to_end(&mut answer),
    )
    .await
    .expect("the gateway answers or closes within 10 s")
    .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// nginx's `proxy_request_buffering on` (its default): a body is read whole
/// before any upstream is dialled and goes with its length, however the
/// client framed it; a client that stops sending it for
/// `client_body_timeout` is answered with nothing (the connection closed,
/// as nginx 1.22.1 ends such a request: `ngx_http_finalize_request` with
/// 408 terminates it) and no upstream ever saw it. A body larger than
/// `client_body_buffer_size` streams (what was read first, then the rest);
/// `proxy_request_buffering off` streams it all; `client_max_body_size`
/// still bounds a body without a length while it is read ahead.
#[tokio::test]
async fn a_body_is_read_whole_before_its_upstream_and_a_stalled_one_gets_no_answer() {
    let (echo, accepted) = framing_echo().await;
    let port = free_port();
    let nginx = format!(
        r#"events {{}} http {{
upstream app {{ server {echo}; }}
server {{
    listen 127.0.0.1:{port};
    server_name app.test;
    client_body_timeout 300ms;
    location /read/ {{ proxy_pass http://app; client_max_body_size 20; }}
    location /big/ {{ proxy_pass http://app; client_body_buffer_size 8; }}
    location /stream/ {{ proxy_pass http://app; proxy_request_buffering off; }}
}}
}}"#
    );
    let running = Running::start(config_from_nginx(&nginx, "")).await;
    let addr = running.addr;

    // Half a body, then nothing: no answer, and nothing went upstream.
    let stalled = raw_exchange(
        addr,
        &[b"POST /read/a HTTP/1.1\r\nhost: app.test\r\ncontent-length: 10\r\n\r\nhello"],
    )
    .await;
    assert_eq!(stalled, "", "a stalled body is answered with nothing");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no upstream connection for a body that never came whole"
    );

    let chunked = |path: &str, chunks: &[&str]| {
        let mut text = format!(
            "POST {path} HTTP/1.1\r\nhost: app.test\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        for c in chunks {
            text.push_str(&format!("{:x}\r\n{c}\r\n", c.len()));
        }
        text.push_str("0\r\n\r\n");
        text
    };
    // Chunked, read whole: the upstream gets its length.
    let answer = raw_exchange(
        addr,
        &[chunked("/read/b", &["hello", " ", "world"]).as_bytes()],
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("cl=11 te=- hello world"), "{answer}");
    // Past the buffer: streamed, nothing lost or reordered.
    let answer = raw_exchange(
        addr,
        &[chunked("/big/c", &["0123456", "789ab", "cdef"]).as_bytes()],
    )
    .await;
    assert!(
        answer.ends_with("cl=- te=chunked 0123456789abcdef"),
        "{answer}"
    );
    // Request buffering off: streamed as it comes.
    let answer = raw_exchange(addr, &[chunked("/stream/d", &["hi"]).as_bytes()]).await;
    assert!(answer.ends_with("cl=- te=chunked hi"), "{answer}");
    // A body without a length past client_max_body_size while read ahead.
    let answer = raw_exchange(
        addr,
        &[chunked("/read/e", &["0123456789", "0123456789", "x"]).as_bytes()],
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // Declared lengths go as they are.
    let answer = raw_exchange(
        addr,
        &[b"PUT /read/f HTTP/1.1\r\nhost: app.test\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc"],
    )
    .await;
    assert!(answer.ends_with("cl=3 te=- abc"), "{answer}");
    running.stop().await;
}

/// `listener.idleTimeoutSeconds` on an ingress connection: closed once it
/// has gone that long without a request, counted as an idle refusal; a
/// connection that keeps sending requests stays open past it.
#[tokio::test]
async fn an_ingress_connection_without_requests_is_closed_after_the_idle_timeout() {
    use tokio::io::AsyncReadExt;

    let upstream = head_echo().await;
    let port = free_port();
    let nginx = format!(
        r#"events {{}} http {{
upstream app {{ server {upstream}; }}
server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://app; }} }}
}}"#
    );
    let config = config_from_nginx(&nginx, "listener:\n  idleTimeoutSeconds: 1\n");
    let running = Running::start(config).await;
    let addr = running.addr;
    let idle_refusals = || {
        running
            .stats
            .metrics()
            .refusals(crate::stats::Refusal::Idle)
    };

    // Busy: a request every 300 ms for 2 s, on one kept-alive connection.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    for _ in 0..7 {
        let req = Request::get("/")
            .header("host", "app.test")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.expect("connection still open");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert_eq!(idle_refusals(), 0);

    // Quiet: closed about a second after its last request.
    let started = std::time::Instant::now();
    tokio::time::timeout(std::time::Duration::from_secs(5), conn)
        .await
        .expect("closed by the gateway")
        .unwrap()
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(500),
        "closed {waited:?} after the last request"
    );
    assert_eq!(idle_refusals(), 1);

    // A connection that never sends anything goes the same way.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed by the gateway");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert_eq!(idle_refusals(), 2);
    running.stop().await;
}

/// nginx's `send_timeout`: a client that asks for a large answer and then
/// reads nothing is cut off once the gateway's writes to it have waited
/// that long, counted as `send_timeout`, and the upstream connection the
/// answer held goes with it (the upstream's own writes fail), where before
/// nothing ended such a connection.
#[tokio::test]
async fn a_client_that_reads_nothing_is_cut_off_after_send_timeout_and_frees_its_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Far more than the sockets between the three can hold.
    const ANSWER: usize = 64 << 20;
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = tcp.local_addr().unwrap();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = tcp.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        let wrote = async {
            s.write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {ANSWER}\r\n\r\n").as_bytes())
                .await?;
            let chunk = vec![b'x'; 64 << 10];
            for _ in 0..ANSWER / chunk.len() {
                s.write_all(&chunk).await?;
            }
            Ok::<_, std::io::Error>(())
        };
        let _ = done_tx.send(wrote.await);
    });
    let port = free_port();
    let nginx = format!(
        r#"events {{}} http {{
send_timeout 1s;
upstream app {{ server {upstream}; }}
server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://app; }} }}
}}"#
    );
    let running = Running::start(config_from_nginx(&nginx, "")).await;
    let mut client = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    client
        .write_all(b"GET /big HTTP/1.1\r\nhost: app.test\r\n\r\n")
        .await
        .unwrap();
    // The client reads nothing: the upstream's writes end once the gateway
    // has given up on the client and dropped the answer.
    let wrote = tokio::time::timeout(std::time::Duration::from_secs(30), done)
        .await
        .expect("the upstream's connection is closed under its writes")
        .unwrap();
    assert!(wrote.is_err(), "the whole answer went out: {wrote:?}");
    assert_eq!(
        running
            .stats
            .metrics()
            .refusals(crate::stats::Refusal::SendTimeout),
        1
    );
    // What the client then reads ends short of the answer.
    let mut got = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read_to_end(&mut got),
    )
    .await
    .expect("the connection is closed");
    assert!(got.len() < ANSWER, "{read:?}: {} bytes", got.len());
    running.stop().await;
}

/// The HTTP/2 settings an ingress connection opens with, as the first
/// SETTINGS frame a client reads after its preface.
async fn server_settings(addr: std::net::SocketAddr) -> Vec<(u16, u32)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The preface and an empty SETTINGS frame (prior knowledge, h2c).
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    loop {
        let mut head = [0u8; 9];
        tcp.read_exact(&mut head).await.unwrap();
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).await.unwrap();
        // SETTINGS without ACK.
        if head[3] == 4 && head[4] & 1 == 0 {
            return payload
                .chunks_exact(6)
                .map(|s| {
                    (
                        u16::from_be_bytes([s[0], s[1]]),
                        u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                    )
                })
                .collect();
        }
    }
}

/// An ingress client without an agent's identity may open nginx's 128
/// streams at once (`http2_max_concurrent_streams`), not the thousands the
/// listener allows an agent; a listener set lower keeps its own bound.
#[tokio::test]
async fn ingress_clients_get_nginx_stream_bound_over_http2() {
    const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    let upstream = head_echo().await;
    let nginx = |port: u16| {
        format!(
            r#"events {{}} http {{
upstream app {{ server {upstream}; }}
server {{ listen 127.0.0.1:{port} http2; location / {{ proxy_pass http://app; }} }}
}}"#
        )
    };
    let running = Running::start(config_from_nginx(&nginx(free_port()), "")).await;
    let settings = server_settings(running.addr).await;
    assert!(
        settings.contains(&(
            MAX_CONCURRENT_STREAMS,
            crate::listener::ingress::INGRESS_MAX_CONCURRENT_STREAMS
        )),
        "{settings:?}"
    );
    running.stop().await;
    let running = Running::start(config_from_nginx(
        &nginx(free_port()),
        "listener:\n  maxConcurrentStreams: 7\n",
    ))
    .await;
    let settings = server_settings(running.addr).await;
    assert!(
        settings.contains(&(MAX_CONCURRENT_STREAMS, 7)),
        "{settings:?}"
    );
    running.stop().await;
}

#[test]
fn converted_certificate_paths_are_absolute_against_the_conf_prefix() {
    let parsed = parse_str(
        "events {} http { server { listen 443 ssl; ssl_certificate certs/a.crt; ssl_certificate_key /abs/a.key;
         ssl_client_certificate ca.crt; ssl_verify_client optional; location / { proxy_pass http://127.0.0.1:9; } } }",
        "t.conf",
        &Options::new(),
    )
    .unwrap();
    let yaml =
        from_nginx::config_yaml(&parsed.ingress, std::path::Path::new("/etc/nginx")).unwrap();
    assert!(
        yaml.contains("certificate: /etc/nginx/certs/a.crt"),
        "{yaml}"
    );
    assert!(yaml.contains("key: /abs/a.key"), "{yaml}");
    assert!(
        yaml.contains("clientCertificate: /etc/nginx/ca.crt"),
        "{yaml}"
    );
}

/// Outcome of one request over TLS: the status and `grpc-status`, or `None`
/// when the connection failed.
async fn tls_request(
    addr: std::net::SocketAddr,
    name: &str,
    pki: &spinlink_tls::dev::DevPki,
    identity: Option<&str>,
    path: &str,
) -> Option<(StatusCode, Option<String>)> {
    let (cert, key) = identity.map(|i| (pki.cert(i), pki.key(i))).unzip();
    let files = spinlink_tls::config::ClientFiles {
        ca: &pki.ca_cert(),
        identity: cert.as_deref().zip(key.as_deref()),
    };
    let config = spinlink_tls::config::client_config(files, &[b"h2"]).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await
        .ok()?;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .ok()?;
    tokio::spawn(conn);
    let req = Request::post(format!("https://{name}{path}"))
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.ok()?;
    let grpc = resp
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    Some((resp.status(), grpc))
}

/// Ingress and agents on one TLS listener: a name an ingress server claims is
/// served by it (certificate optional, judged per request); a connection
/// without such a name gets the agent path, client certificate required.
#[tokio::test]
async fn ingress_and_agent_tunnel_share_a_tls_listener() {
    let dir = tempfile::tempdir().unwrap();
    let pki = spinlink_tls::dev::DevPki::ensure(dir.path(), &["a1"]).unwrap();
    let upstream = head_echo().await;
    let port = free_port();
    let d = dir.path().display();
    let nginx = format!(
        r#"events {{}} http {{
server {{
    listen 127.0.0.1:{port} ssl http2;
    server_name localhost;
    ssl_certificate {d}/gateway.crt;
    ssl_certificate_key {d}/gateway.key;
    ssl_client_certificate {d}/ca.crt;
    ssl_verify_client optional;
    location /ui/ {{ proxy_pass http://{upstream}; }}
}}
}}"#
    );
    let parsed = parse_str(&nginx, "t.conf", &Options::new()).unwrap();
    let mut yaml = from_nginx::config_yaml(&parsed.ingress, dir.path()).unwrap();
    yaml.push_str(&format!(
        "upstreams:\n  - url: http://127.0.0.1:9\nshutdownGraceSeconds: 1\ntls:\n  certFile: {d}/gateway.crt\n  keyFile: {d}/gateway.key\n  clientCaFile: {d}/ca.crt\n",
    ));
    let config = crate::Config::from_yaml_str(&yaml, "t").unwrap();
    let running = Running::start(config).await;
    let addr = running.addr;

    // The ingress name, no certificate: the UI route answers.
    let ui = tls_request(addr, "localhost", &pki, None, "/ui/x").await;
    assert_eq!(ui, Some((StatusCode::OK, None)));
    // …and the tunnel path is refused there without a certificate,
    let t = tls_request(addr, "localhost", &pki, None, "/spinlink.v1.Tunnel/Nope").await;
    assert_eq!(t, Some((StatusCode::OK, Some("16".into()))));
    // …but reached with a verified agent certificate (unknown method: 12).
    let t = tls_request(
        addr,
        "localhost",
        &pki,
        Some("agent-a1"),
        "/spinlink.v1.Tunnel/Nope",
    )
    .await;
    assert_eq!(t, Some((StatusCode::OK, Some("12".into()))));
    // No SNI (an IP address): the agent path, certificate required.
    assert_eq!(
        tls_request(addr, "127.0.0.1", &pki, None, "/spinlink.v1.Tunnel/Nope").await,
        None
    );
    let t = tls_request(
        addr,
        "127.0.0.1",
        &pki,
        Some("agent-a1"),
        "/spinlink.v1.Tunnel/Nope",
    )
    .await;
    assert_eq!(t, Some((StatusCode::OK, Some("12".into()))));
    // The agent path serves the tunnel only, not the ingress routes.
    let t = tls_request(addr, "127.0.0.1", &pki, Some("agent-a1"), "/ui/x").await;
    assert_eq!(t, Some((StatusCode::OK, Some("12".into()))));

    running.stop().await;
}

/// A TLS upstream answering `<client-cert or ->\n<method> <path>`, serving
/// HTTP/1.1 or, with `h2`, HTTP/2 (ALPN), and asking for an optional client
/// certificate signed by the dev CA.
async fn tls_echo(pki: &spinlink_tls::dev::DevPki, name: &str, h2: bool) -> std::net::SocketAddr {
    use spinlink_tls::config::{ClientAuth, ServerFiles, server_config};
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let config = server_config(
        ServerFiles {
            cert: &pki.cert(name),
            key: &pki.key(name),
            client_ca: Some(&pki.ca_cert()),
        },
        ClientAuth::Optional,
        alpn,
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let client = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map_or("-", |_| "client-cert");
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let text = format!("{client}\n{} {}\n", req.method(), req.uri().path());
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            text,
                        ))))
                    }
                });
                let io = TokioIo::new(tls);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(io, svc)
                    .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                }
            });
        }
    });
    addr
}

/// `proxy_pass https://` and `grpc_pass grpcs://`: the upstream certificate
/// verified against `proxy_ssl_trusted_certificate` under `proxy_ssl_name`
/// (or the upstream block's name), refused with 502 when it does not match
/// unless `proxy_ssl_verify off`, and the gateway's client certificate
/// presented when configured.
#[tokio::test]
async fn tls_upstreams_are_verified_and_can_present_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = spinlink_tls::dev::DevPki::ensure(dir.path(), &[]).unwrap();
    let ca = pki.ca_cert();
    // The dev PKI's sidecar certificate names `localhost` and 127.0.0.1; the
    // gateway's is a client certificate too.
    let (server_name, client_name) = ("sidecar", "gateway");
    let h1 = tls_echo(&pki, server_name, false).await;
    let h2 = tls_echo(&pki, server_name, true).await;
    let (cert, key) = (pki.cert(client_name), pki.key(client_name));
    let port = free_port();
    let nginx = format!(
        r#"events {{}} http {{
upstream localhost {{ server {h1}; }}
upstream wrong {{ server {h1}; }}
upstream grpc_up {{ server {h2}; }}
proxy_ssl_trusted_certificate {ca};
grpc_ssl_trusted_certificate {ca};
server {{
    listen 127.0.0.1:{port};
    location /named/ {{ proxy_pass https://localhost; }}
    location /cert/ {{ proxy_pass https://wrong; proxy_ssl_name localhost;
        proxy_ssl_certificate {cert}; proxy_ssl_certificate_key {key}; }}
    location /wrong/ {{ proxy_pass https://wrong; }}
    location /unverified/ {{ proxy_pass https://wrong; proxy_ssl_verify off; }}
    location /grpc/ {{ grpc_pass grpcs://grpc_up; grpc_ssl_name localhost; }}
}}
}}"#,
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    );
    let running = Running::start(config_from_nginx(&nginx, "shutdownGraceSeconds: 1\n")).await;
    let addr = running.addr;

    let get = |path: &str| {
        Request::get(path)
            .header("host", "app.test")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (status, _, body) = http1(addr, get("/named/x")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "-\nGET /named/x\n")
    );
    let (status, _, body) = http1(addr, get("/cert/x")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "client-cert\nGET /cert/x\n"),
        "the client certificate reaches the upstream"
    );
    let (status, _, body) = http1(addr, get("/wrong/x")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let (status, _, body) = http1(addr, get("/unverified/x")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "-\nGET /unverified/x\n")
    );
    let req = Request::post("/grpc/Echo")
        .header("host", "app.test")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = http1(addr, req).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "-\nPOST /grpc/Echo\n")
    );

    running.stop().await;
}

/// The certificate a TLS handshake with `addr` under `name` is served.
async fn served_cert(addr: std::net::SocketAddr, pki: &spinlink_tls::dev::DevPki) -> Vec<u8> {
    let files = spinlink_tls::config::ClientFiles {
        ca: &pki.ca_cert(),
        identity: None,
    };
    let config = spinlink_tls::config::client_config(files, &[b"http/1.1"]).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn cert_der(path: &std::path::Path) -> Vec<u8> {
    spinlink_tls::pem::load_certs(path).unwrap()[0].to_vec()
}

/// Swaps `dir/serve.{crt,key}` for `name`'s files the way a Secret mount
/// does: new files beside, then one rename each.
fn install(pki: &spinlink_tls::dev::DevPki, dir: &std::path::Path, name: &str) {
    for (from, to) in [(pki.cert(name), "serve.crt"), (pki.key(name), "serve.key")] {
        let tmp = dir.join(format!("{to}.tmp"));
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join(to)).unwrap();
    }
}

#[test]
fn a_server_certificate_reloads_when_its_files_change_and_bad_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = spinlink_tls::dev::DevPki::ensure(dir.path(), &[]).unwrap();
    install(&pki, dir.path(), "gateway");
    let tls = spinlink_nginx_compat::Tls {
        certificates: vec![spinlink_nginx_compat::CertificateKey {
            certificate: dir.path().join("serve.crt").display().to_string(),
            key: dir.path().join("serve.key").display().to_string(),
        }],
        client_certificate: None,
        verify_client: VerifyClient::Off,
        protocols: vec![spinlink_nginx_compat::TlsProtocol::TlsV1_3],
    };
    let reloading = tls::ReloadingServerTls::load(&tls, true).unwrap();
    let first = reloading.current();
    assert_eq!(reloading.reload(), Reload::Unchanged);
    assert!(Arc::ptr_eq(&first, &reloading.current()));

    std::fs::write(dir.path().join("serve.crt"), "not a certificate").unwrap();
    assert!(matches!(reloading.reload(), Reload::Refused(_)));
    assert!(
        Arc::ptr_eq(&first, &reloading.current()),
        "garbage keeps the old"
    );
    assert_eq!(
        reloading.reload(),
        Reload::Unchanged,
        "refused once, not again"
    );

    install(&pki, dir.path(), "sidecar");
    assert_eq!(reloading.reload(), Reload::Reloaded);
    assert!(!Arc::ptr_eq(&first, &reloading.current()));
}

/// The gateway's reload task: a rotated ingress certificate is served to the
/// next handshake while an established connection keeps working.
#[tokio::test]
async fn a_rotated_ingress_certificate_is_served_to_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let pki = spinlink_tls::dev::DevPki::ensure(dir.path(), &[]).unwrap();
    install(&pki, dir.path(), "gateway");
    let upstream = head_echo().await;
    let port = free_port();
    let d = dir.path().display();
    let nginx = format!(
        r#"events {{}} http {{
server {{
    listen 127.0.0.1:{port} ssl;
    server_name localhost;
    ssl_certificate {d}/serve.crt;
    ssl_certificate_key {d}/serve.key;
    location / {{ proxy_pass http://{upstream}; }}
}}
}}"#
    );
    let parsed = parse_str(&nginx, "t.conf", &Options::new()).unwrap();
    let yaml = from_nginx::config_yaml(&parsed.ingress, dir.path()).unwrap();
    let config =
        crate::Config::from_yaml_str(&format!("{yaml}shutdownGraceSeconds: 1\n"), "t").unwrap();
    let running = Running::start(config).await;
    let addr = running.addr;

    assert_eq!(
        served_cert(addr, &pki).await,
        cert_der(&pki.cert("gateway"))
    );
    // An established connection, used before and after the rotation.
    let files = spinlink_tls::config::ClientFiles {
        ca: &pki.ca_cert(),
        identity: None,
    };
    let config = spinlink_tls::config::client_config(files, &[b"http/1.1"]).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let get = || {
        Request::get("/x")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    assert_eq!(
        send.send_request(get()).await.unwrap().status(),
        StatusCode::OK
    );

    install(&pki, dir.path(), "sidecar");
    let want = cert_der(&pki.cert("sidecar"));
    // The reload interval is 2 s by default; give it ten.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if served_cert(addr, &pki).await == want {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let resp = send.send_request(get()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "the old connection stays up");

    running.stop().await;
}

/// The host a request names, as server selection and `$host` read it. The
/// oracle is nginx 1.22.1's `ngx_http_validate_host`
/// (src/http/ngx_http_request.c), and the real nginx in
/// `tests/nginx_diff.rs` for the refusals: the name before the port (an
/// IPv6 literal up to its `]`), one trailing dot dropped, lowercase; two
/// dots in a row, a `/` or a NUL, or nothing left, is refused (400).
#[test]
fn the_request_host_is_the_name_without_port_or_trailing_dot_in_lowercase() {
    let by_host = |h: &[u8]| {
        let value = http::HeaderValue::from_bytes(h).unwrap();
        let req = Request::get("/").header("host", value).body(()).unwrap();
        super::request_host(&req)
    };
    let named = |h: &str| by_host(h.as_bytes()).unwrap();
    assert_eq!(named("App.Test:8443").as_deref(), Some("app.test"));
    assert_eq!(named(" app.test. ").as_deref(), Some("app.test"));
    assert_eq!(named("[::1]:8443").as_deref(), Some("[::1]"));
    assert_eq!(named("[FE80::1]").as_deref(), Some("[fe80::1]"));
    // An unclosed literal is taken whole, as nginx takes it.
    assert_eq!(named("[::1").as_deref(), Some("[::1"));
    assert_eq!(named(".app.test").as_deref(), Some(".app.test"));
    for refused in [
        &b":8443"[..],
        b".",
        b"app..test",
        b"app.test..",
        b"app.test/x",
        b"app.test:80/",
        b"[::1]..",
    ] {
        assert_eq!(
            by_host(refused),
            Err(super::InvalidHost),
            "{}",
            String::from_utf8_lossy(refused)
        );
    }
    let req = Request::get("https://API.test./x")
        .header("host", "other.test")
        .body(())
        .unwrap();
    assert_eq!(
        super::request_host(&req).unwrap().as_deref(),
        Some("api.test"),
        "the authority wins"
    );
    let req = Request::get("/").body(()).unwrap();
    assert_eq!(super::request_host(&req), Ok(None));
}
