use std::path::Path;

use super::*;
use crate::{MemorySource, load_from, parse_str};

const FILE: &str = "/etc/nginx/nginx.conf";

/// Wraps `http_body` in a minimal complete nginx.conf; its first line is
/// line 3.
fn conf(http_body: &str) -> String {
    format!("events {{}}\nhttp {{\n{http_body}\n}}\n")
}

fn parse_with(http_body: &str, options: &Options) -> Result<Parsed> {
    parse_str(&conf(http_body), FILE, options)
}

fn ok(http_body: &str) -> Parsed {
    parse_with(http_body, &Options::new()).unwrap()
}

fn err(http_body: &str) -> String {
    parse_with(http_body, &Options::new())
        .unwrap_err()
        .to_string()
}

/// The first server.
fn server(http_body: &str) -> Server {
    ok(http_body).ingress.servers.remove(0)
}

/// The first location of the first server.
fn location(server_body: &str) -> Location {
    server(&format!("server {{ listen 80; {server_body} }}"))
        .locations
        .remove(0)
}

fn at(line: u32) -> String {
    format!("in {FILE}:{line}")
}

// ---- listen -------------------------------------------------------------

#[test]
fn listen_forms_and_flags() {
    let s = server(
        "server {
            listen 8080;
            listen 127.0.0.1:8443 ssl http2 proxy_protocol default_server;
            listen [::]:443 ssl default;
            listen localhost;
            ssl_certificate c.pem; ssl_certificate_key k.pem;
        }",
    );
    let l = &s.listens;
    assert_eq!((l[0].address.as_str(), l[0].port), ("*", 8080));
    assert!(!l[0].ssl && !l[0].default_server);
    assert_eq!((l[1].address.as_str(), l[1].port), ("127.0.0.1", 8443));
    assert!(l[1].ssl && l[1].http2 && l[1].proxy_protocol && l[1].default_server);
    assert_eq!((l[2].address.as_str(), l[2].port), ("::", 443));
    assert!(l[2].default_server && !l[2].http2);
    assert_eq!((l[3].address.as_str(), l[3].port), ("localhost", 80));
    assert!(s.http2, "listen … http2 enables HTTP/2 for the server");
}

#[test]
fn server_without_listen_gets_port_80() {
    let s = server("server { }");
    assert_eq!(s.listens.len(), 1);
    assert_eq!(
        (s.listens[0].address.as_str(), s.listens[0].port),
        ("*", 80)
    );
    assert_eq!(s.server_names, vec![String::new()]);
}

#[test]
fn listen_errors() {
    assert_eq!(
        err("server { listen 0; }"),
        format!(
            "invalid port in \"0\" of the \"listen\" directive {}",
            at(3)
        )
    );
    assert_eq!(
        err("server { listen 80 bogus; }"),
        format!("invalid parameter \"bogus\" {}", at(3))
    );
    assert!(err("server { listen unix:/run/x.sock; }").contains("outside the subset"));
    assert_eq!(
        err("server {\nlisten;\n}"),
        format!(
            "invalid number of arguments in \"listen\" directive {}",
            at(4)
        )
    );
    assert_eq!(
        err("listen 80;"),
        format!("\"listen\" directive is not allowed here {}", at(3))
    );
}

#[test]
fn listen_socket_options_are_accepted_with_a_warning() {
    let p = ok("server { listen 80 reuseport backlog=511; }");
    assert_eq!(p.warnings.len(), 2);
    assert!(p.warnings[0].message.contains("reuseport"));
}

#[test]
fn duplicate_default_server_is_refused() {
    assert_eq!(
        err("server { listen 80 default_server; }\nserver { listen 80 default_server; }"),
        format!("a duplicate default server for 0.0.0.0:80 {}", at(4))
    );
    // Different ports are fine.
    ok("server { listen 80 default_server; } server { listen 81 default_server; }");
}

// ---- http2, server_name -------------------------------------------------

#[test]
fn http2_directive() {
    assert!(server("server { http2 on; }").http2);
    assert!(!server("server { http2 off; }").http2);
    assert!(server("http2 on; server { }").http2, "inherited from http");
    assert_eq!(
        err("server { http2 yes; }"),
        format!(
            "invalid value \"yes\" in \"http2\" directive, it must be \"on\" or \"off\" {}",
            at(3)
        )
    );
    assert_eq!(
        err("server { http2 on; http2 off; }"),
        format!("\"http2\" directive is duplicate {}", at(3))
    );
}

#[test]
fn server_names() {
    let s = server(
        "server { server_name Spinnaker.Example.com *.example.org www.example.* .example.net \"\"; server_name more; }",
    );
    assert_eq!(
        s.server_names,
        [
            "spinnaker.example.com",
            "*.example.org",
            "www.example.*",
            ".example.net",
            "",
            "more"
        ]
    );
    assert!(err("server { server_name ~^(?<x>.+)$; }").contains("regex server name"));
    assert_eq!(
        err("server { server_name a.*.b; }"),
        format!("invalid server name or wildcard \"a.*.b\" {}", at(3))
    );
}

#[test]
fn conflicting_server_names_warn_like_nginx() {
    let p = ok("server { listen 80; server_name a; }\nserver { listen 80; server_name a; }");
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(
        p.warnings[0].to_string(),
        format!(
            "conflicting server name \"a\" on 0.0.0.0:80, ignored {}",
            at(4)
        )
    );
}

// ---- TLS ----------------------------------------------------------------

#[test]
fn tls_files_resolve_against_the_conf_prefix_and_inherit() {
    let s = server(
        "ssl_certificate certs/http.crt;
         ssl_certificate_key /abs/http.key;
         server { listen 443 ssl; }",
    );
    let tls = s.tls.unwrap();
    assert_eq!(tls.certificates.len(), 1);
    assert_eq!(tls.certificates[0].certificate, "/etc/nginx/certs/http.crt");
    assert_eq!(tls.certificates[0].key, "/abs/http.key");
    assert_eq!(tls.verify_client, VerifyClient::Off);
    assert_eq!(tls.protocols, DEFAULT_TLS_PROTOCOLS.to_vec());
    assert_eq!(tls.client_certificate, None);
}

#[test]
fn tls_only_for_servers_with_an_ssl_listen() {
    let s = server("ssl_certificate a; ssl_certificate_key b; server { listen 80; }");
    assert!(s.tls.is_none());
}

#[test]
fn several_certificates_pair_with_keys_in_order() {
    let tls = server(
        "server { listen 443 ssl;
           ssl_certificate rsa.crt; ssl_certificate_key rsa.key;
           ssl_certificate ec.crt; ssl_certificate_key ec.key; }",
    )
    .tls
    .unwrap();
    assert_eq!(tls.certificates.len(), 2);
    assert_eq!(tls.certificates[1].key, "/etc/nginx/ec.key");
}

#[test]
fn tls_errors() {
    assert_eq!(
        err("server { listen 443 ssl; }"),
        format!(
            "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive {}",
            at(3)
        )
    );
    assert_eq!(
        err("server { listen 443 ssl; ssl_certificate a.crt; }"),
        format!(
            "no \"ssl_certificate_key\" is defined for certificate \"/etc/nginx/a.crt\" {}",
            at(3)
        )
    );
    assert_eq!(
        err(
            "server { listen 443 ssl; ssl_certificate a; ssl_certificate_key b; ssl_verify_client on; }"
        ),
        format!("no ssl_client_certificate for ssl_verify_client {}", at(3))
    );
}

#[test]
fn client_certificate_modes() {
    for (mode, want) in [
        ("on", VerifyClient::On),
        ("optional", VerifyClient::Optional),
        ("off", VerifyClient::Off),
        ("optional_no_ca", VerifyClient::OptionalNoCa),
    ] {
        let tls = server(&format!(
            "server {{ listen 443 ssl; ssl_certificate a; ssl_certificate_key b;
               ssl_client_certificate ca.crt; ssl_verify_client {mode}; }}"
        ))
        .tls
        .unwrap();
        assert_eq!(tls.verify_client, want);
        assert_eq!(tls.client_certificate.as_deref(), Some("/etc/nginx/ca.crt"));
    }
    assert_eq!(
        err("server { ssl_verify_client maybe; }"),
        format!("invalid value \"maybe\" {}", at(3))
    );
    assert_eq!(
        err("server { ssl_client_certificate a; ssl_client_certificate b; }"),
        format!(
            "\"ssl_client_certificate\" directive is duplicate {}",
            at(3)
        )
    );
}

#[test]
fn ssl_protocols() {
    let tls = server(
        "ssl_protocols TLSv1.3 TLSv1.2;
         server { listen 443 ssl; ssl_certificate a; ssl_certificate_key b; }",
    )
    .tls
    .unwrap();
    assert_eq!(tls.protocols, [TlsProtocol::TlsV1_2, TlsProtocol::TlsV1_3]);
    assert_eq!(
        err("ssl_protocols TLSv9;"),
        format!("invalid value \"TLSv9\" {}", at(3))
    );
    assert_eq!(
        err("ssl_protocols;"),
        format!(
            "invalid number of arguments in \"ssl_protocols\" directive {}",
            at(3)
        )
    );
}

// ---- locations ----------------------------------------------------------

#[test]
fn location_match_kinds() {
    let s = server(
        "server {
            location / { }
            location = /exact { }
            location =/glued { }
            location ^~ /nore { }
            location ^~/nore2 { }
        }",
    );
    let got: Vec<(MatchKind, &str)> = s
        .locations
        .iter()
        .map(|l| (l.match_kind, l.path.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (MatchKind::Prefix, "/"),
            (MatchKind::Exact, "/exact"),
            (MatchKind::Exact, "/glued"),
            (MatchKind::Prefix, "/nore"),
            (MatchKind::Prefix, "/nore2"),
        ]
    );
    assert_eq!(s.locations[1].source, format!("{FILE}:5"));
    assert!(s.locations[0].target.is_none());
}

#[test]
fn location_errors() {
    assert!(err("server { location ~ \\.php$ { } }").contains("regex location"));
    assert!(err("server { location ~*/x { } }").contains("regex location"));
    assert!(err("server { location @fallback { } }").contains("named location"));
    assert_eq!(
        err("server { location ~~ /a { } }"),
        format!("invalid location modifier \"~~\" {}", at(3))
    );
    assert_eq!(
        err("server { location / { }\nlocation / { } }"),
        format!("duplicate location \"/\" {}", at(4))
    );
    assert_eq!(
        err("server { location /a { location /b { } } }"),
        format!("location \"/b\" is outside location \"/a\" {}", at(3))
    );
    assert_eq!(
        err("server { location = /a { location /a/b { } } }"),
        format!(
            "location \"/a/b\" cannot be inside the exact location \"/a\" {}",
            at(3)
        )
    );
    assert_eq!(
        err("server { location /a; }"),
        format!("directive \"location\" has no opening \"{{\" {}", at(3))
    );
    assert_eq!(
        err("server { location = /a /b { } }"),
        format!(
            "invalid number of arguments in \"location\" directive {}",
            at(3)
        )
    );
    assert_eq!(
        err("location / { }"),
        format!("\"location\" directive is not allowed here {}", at(3))
    );
}

#[test]
fn exact_and_prefix_of_the_same_path_coexist() {
    let s = server("server { location = /a { } location /a { } }");
    assert_eq!(s.locations.len(), 2);
}

#[test]
fn nested_locations_inherit_and_are_searched_after_their_parent() {
    let s = server(
        "server {
            location /api/ {
                proxy_pass http://127.0.0.1:1;
                proxy_read_timeout 10s;
                location /api/upload/ { proxy_pass http://127.0.0.1:2; client_max_body_size 1g; }
            }
            location /api/upload/x/ { proxy_pass http://127.0.0.1:3; }
        }",
    );
    let nested = &s.locations[0].locations[0];
    assert_eq!(nested.read_timeout_ms, 10_000);
    assert_eq!(nested.client_max_body_size, Some(1 << 30));
    // nginx picks the longest prefix at the top level first.
    assert_eq!(
        s.select_location("/api/upload/x/1").unwrap().path,
        "/api/upload/x/"
    );
    assert_eq!(
        s.select_location("/api/upload/1").unwrap().path,
        "/api/upload/"
    );
    assert_eq!(s.select_location("/api/other").unwrap().path, "/api/");
    assert!(s.select_location("/else").is_none());
}

#[test]
fn exact_location_wins_over_prefix() {
    let s = server("server { location / { } location = / { } location /a { } }");
    assert_eq!(s.select_location("/").unwrap().match_kind, MatchKind::Exact);
    assert_eq!(s.select_location("/ab").unwrap().path, "/a");
    assert_eq!(s.select_location("/b").unwrap().path, "/");
}

// ---- proxy_pass / grpc_pass -----------------------------------------------

#[test]
fn proxy_pass_targets() {
    let t = |arg: &str| {
        location(&format!("location / {{ proxy_pass {arg}; }}"))
            .target
            .unwrap()
    };
    assert_eq!(
        t("http://127.0.0.1:8084"),
        Target {
            protocol: Protocol::Http,
            backend: Backend::Address {
                host: "127.0.0.1".into(),
                port: 8084
            },
            uri: None
        }
    );
    assert_eq!(
        t("https://gate.internal"),
        Target {
            protocol: Protocol::Https,
            backend: Backend::Address {
                host: "gate.internal".into(),
                port: 443
            },
            uri: None
        }
    );
    assert_eq!(
        t("HTTP://h").backend,
        Backend::Address {
            host: "h".into(),
            port: 80
        }
    );
    assert_eq!(t("http://h:1/api/").uri.as_deref(), Some("/api/"));
    assert_eq!(
        t("http://[::1]:9000").backend,
        Backend::Address {
            host: "::1".into(),
            port: 9000
        }
    );
}

#[test]
fn proxy_pass_to_an_upstream_block() {
    let p = ok("upstream Gate { server 127.0.0.1:8084; }
                server { location / { proxy_pass http://gate; } }");
    let t = p.ingress.servers[0].locations[0].target.clone().unwrap();
    assert_eq!(
        t.backend,
        Backend::Upstream {
            name: "Gate".into()
        }
    );
    assert_eq!(
        err(
            "upstream gate { server 127.0.0.1:8084; }\nserver { location / { proxy_pass http://gate:80; } }"
        ),
        format!("upstream \"gate\" may not have port 80 {}", at(4))
    );
}

#[test]
fn proxy_pass_errors() {
    assert_eq!(
        err("server { location / { proxy_pass gate; } }"),
        format!("invalid URL prefix {}", at(3))
    );
    assert!(err("server { location / { proxy_pass http://$upstream; } }").contains("variables"));
    assert!(err("server { location / { proxy_pass http://unix:/run/s.sock; } }").contains("unix"));
    assert_eq!(
        err("server { location / { proxy_pass http://a:1; proxy_pass http://b:1; } }"),
        format!("\"proxy_pass\" directive is duplicate {}", at(3))
    );
    assert_eq!(
        err("server { proxy_pass http://a:1; }"),
        format!("\"proxy_pass\" directive is not allowed here {}", at(3))
    );
    assert!(err("server { location / { proxy_pass http://a:99999; } }").contains("invalid port"));
    assert!(
        err("server { location / { proxy_pass http://a:1; grpc_pass grpc://b:2; } }")
            .contains("both")
    );
}

#[test]
fn grpc_pass_targets() {
    let t = |arg: &str| {
        location(&format!("location / {{ grpc_pass {arg}; }}"))
            .target
            .unwrap()
    };
    assert_eq!(t("grpc://127.0.0.1:7443").protocol, Protocol::Grpc);
    assert_eq!(t("grpcs://sidecar:7443").protocol, Protocol::Grpcs);
    assert_eq!(
        t("127.0.0.1:9000"),
        Target {
            protocol: Protocol::Grpc,
            backend: Backend::Address {
                host: "127.0.0.1".into(),
                port: 9000
            },
            uri: None
        }
    );
    assert_eq!(
        err("server { location / { grpc_pass grpc://127.0.0.1; } }"),
        format!("no port in upstream \"127.0.0.1\" {}", at(3))
    );
    let p = ok("upstream sidecar { server 127.0.0.1:7443; }
                server { location / { grpc_pass grpcs://sidecar; } }");
    assert_eq!(
        p.ingress.servers[0].locations[0]
            .target
            .as_ref()
            .unwrap()
            .backend,
        Backend::Upstream {
            name: "sidecar".into()
        }
    );
}

// ---- headers, timeouts, body size: inheritance -----------------------------

fn header_pairs(l: &Location) -> Vec<(&str, &str)> {
    l.headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_str()))
        .collect()
}

#[test]
fn proxy_set_header_inherits_only_into_levels_without_their_own() {
    let p = ok("proxy_set_header Host $host;
                proxy_set_header X-Real-IP $remote_addr;
                server {
                    location /inherit { proxy_pass http://a:1; }
                    location /own { proxy_pass http://a:1; proxy_set_header X-Own 1; }
                }
                server {
                    proxy_set_header X-Server $scheme;
                    location / { proxy_pass http://a:1; }
                }");
    let s = &p.ingress.servers;
    assert_eq!(
        header_pairs(&s[0].locations[0]),
        [("Host", "$host"), ("X-Real-IP", "$remote_addr")]
    );
    assert_eq!(header_pairs(&s[0].locations[1]), [("X-Own", "1")]);
    assert_eq!(header_pairs(&s[1].locations[0]), [("X-Server", "$scheme")]);
}

#[test]
fn grpc_locations_take_grpc_set_header_not_proxy_set_header() {
    let l = location(
        "proxy_set_header X-Proxy 1; grpc_set_header X-Grpc 2;
         location / { grpc_pass grpc://a:1; }",
    );
    assert_eq!(header_pairs(&l), [("X-Grpc", "2")]);
}

#[test]
fn header_directive_arity() {
    assert_eq!(
        err("proxy_set_header Host;"),
        format!(
            "invalid number of arguments in \"proxy_set_header\" directive {}",
            at(3)
        )
    );
}

#[test]
fn read_timeouts() {
    assert_eq!(
        location("location / { proxy_pass http://a:1; }").read_timeout_ms,
        DEFAULT_READ_TIMEOUT_MS
    );
    assert_eq!(
        location("proxy_read_timeout 5m; location / { proxy_pass http://a:1; }").read_timeout_ms,
        300_000
    );
    assert_eq!(
        location("location / { proxy_pass http://a:1; proxy_read_timeout 90; }").read_timeout_ms,
        90_000
    );
    // A grpc location uses grpc_read_timeout, whatever proxy_read_timeout says.
    assert_eq!(
        location("proxy_read_timeout 5s; location / { grpc_pass a:1; grpc_read_timeout 1h; }")
            .read_timeout_ms,
        3_600_000
    );
    assert_eq!(
        err("proxy_read_timeout 5x;"),
        format!("\"proxy_read_timeout\" directive invalid value {}", at(3))
    );
    assert_eq!(
        err("grpc_read_timeout 1s;\ngrpc_read_timeout 2s;"),
        format!("\"grpc_read_timeout\" directive is duplicate {}", at(4))
    );
}

#[test]
fn connect_timeouts() {
    let connect = |conf: &str| location(conf).connect_timeout_ms;
    assert_eq!(
        connect("location / { proxy_pass http://a:1; }"),
        DEFAULT_CONNECT_TIMEOUT_MS
    );
    assert_eq!(
        connect("proxy_connect_timeout 5s; location / { proxy_pass http://a:1; }"),
        5_000
    );
    assert_eq!(
        connect(
            "proxy_connect_timeout 5s; location / { proxy_pass http://a:1; proxy_connect_timeout 250ms; }"
        ),
        250
    );
    // A grpc location uses grpc_connect_timeout, a proxy one never does.
    assert_eq!(
        connect("proxy_connect_timeout 5s; location / { grpc_pass a:1; grpc_connect_timeout 2s; }"),
        2_000
    );
    assert_eq!(
        connect("grpc_connect_timeout 2s; location / { proxy_pass http://a:1; }"),
        DEFAULT_CONNECT_TIMEOUT_MS
    );
    // Read and connect timeouts are apart.
    let l = location(
        "location / { proxy_pass http://a:1; proxy_connect_timeout 1s; proxy_read_timeout 30s; }",
    );
    assert_eq!((l.connect_timeout_ms, l.read_timeout_ms), (1_000, 30_000));
    assert_eq!(
        err("proxy_connect_timeout soon;"),
        format!(
            "\"proxy_connect_timeout\" directive invalid value {}",
            at(3)
        )
    );
    assert_eq!(
        err("grpc_connect_timeout 1s;\ngrpc_connect_timeout 2s;"),
        format!("\"grpc_connect_timeout\" directive is duplicate {}", at(4))
    );
}

#[test]
fn send_timeouts() {
    let send = |conf: &str| location(conf).send_timeout_ms;
    assert_eq!(
        send("location / { proxy_pass http://a:1; }"),
        DEFAULT_SEND_TIMEOUT_MS
    );
    assert_eq!(
        send("proxy_send_timeout 2m; location / { proxy_pass http://a:1; }"),
        120_000
    );
    assert_eq!(
        send("location / { proxy_pass http://a:1; proxy_send_timeout 5s; }"),
        5_000
    );
    // HTTP/2 upstreams have none of their own: grpc_send_timeout is
    // outside the subset, and proxy_send_timeout is not theirs.
    assert_eq!(
        send("proxy_send_timeout 5s; location / { grpc_pass a:1; }"),
        DEFAULT_SEND_TIMEOUT_MS
    );
    assert!(
        err("grpc_send_timeout 5s;").contains("grpc_send_timeout"),
        "{}",
        err("grpc_send_timeout 5s;")
    );
    assert_eq!(
        err("proxy_send_timeout 1s;\nproxy_send_timeout 2s;"),
        format!("\"proxy_send_timeout\" directive is duplicate {}", at(4))
    );
}

#[test]
fn request_buffering_with_its_buffer_and_timeout() {
    let l = location("location / { proxy_pass http://a:1; }");
    assert!(l.request_buffering);
    assert_eq!(
        (l.client_body_buffer_size, l.client_body_timeout_ms),
        (
            DEFAULT_CLIENT_BODY_BUFFER_SIZE,
            DEFAULT_CLIENT_BODY_TIMEOUT_MS
        )
    );
    // Inherited from http and server, a location's own wins.
    let p = ok("proxy_request_buffering off; client_body_buffer_size 64k;
                server { listen 80; client_body_timeout 5s;
                    location / { proxy_pass http://a:1; }
                    location /up/ { proxy_pass http://a:1; proxy_request_buffering on;
                        client_body_buffer_size 1m; client_body_timeout 1s; } }");
    let s = &p.ingress.servers[0].locations;
    assert_eq!(
        (
            s[0].request_buffering,
            s[0].client_body_buffer_size,
            s[0].client_body_timeout_ms
        ),
        (false, 64 << 10, 5_000)
    );
    assert_eq!(
        (
            s[1].request_buffering,
            s[1].client_body_buffer_size,
            s[1].client_body_timeout_ms
        ),
        (true, 1 << 20, 1_000)
    );
    // gRPC streams are never read ahead, whatever the setting.
    assert!(
        !location("proxy_request_buffering on; location / { grpc_pass a:1; }").request_buffering
    );
    assert_eq!(
        err("client_body_buffer_size lots;"),
        format!(
            "\"client_body_buffer_size\" directive invalid value {}",
            at(3)
        )
    );
    assert_eq!(
        err("client_body_timeout 1s;\nclient_body_timeout 2s;"),
        format!("\"client_body_timeout\" directive is duplicate {}", at(4))
    );
    assert_eq!(
        err("proxy_request_buffering on;\nproxy_request_buffering off;"),
        format!(
            "\"proxy_request_buffering\" directive is duplicate {}",
            at(4)
        )
    );
}

#[test]
fn send_timeout_is_the_http_blocks() {
    let p = ok("server { listen 80; location / { proxy_pass http://a:1; } }");
    assert_eq!(p.ingress.client_send_timeout_ms, None);
    let p = ok("send_timeout 2m; server { listen 80; location / { proxy_pass http://a:1; } }");
    assert_eq!(p.ingress.client_send_timeout_ms, Some(120_000));
    // nginx takes it in a server or location too; the gateway times every
    // connection alike, so it says so rather than ignore it.
    for conf in [
        "server { listen 80; send_timeout 5s; }",
        "server { listen 80; location / { send_timeout 5s; } }",
    ] {
        let e = err(conf);
        assert!(
            e.contains("send_timeout in a server or location block") && e.contains("outside"),
            "{e}"
        );
    }
    assert_eq!(
        err("send_timeout soon;"),
        format!("\"send_timeout\" directive invalid value {}", at(3))
    );
    assert_eq!(
        err("send_timeout 1s;\nsend_timeout 2s;"),
        format!("\"send_timeout\" directive is duplicate {}", at(4))
    );
}

#[test]
fn a_model_without_newer_settings_gets_nginx_defaults() {
    let p = ok("server { listen 80; location / { proxy_pass http://a:1; \
                proxy_connect_timeout 3s; proxy_send_timeout 4s; proxy_request_buffering off; \
                client_body_buffer_size 1k; client_body_timeout 2s; } }");
    let yaml = serde_norway::to_string(&p.ingress).unwrap();
    let newer = [
        "connectTimeoutMs: 3000",
        "sendTimeoutMs: 4000",
        "requestBuffering: false",
        "clientBodyBufferSize: 1024",
        "clientBodyTimeoutMs: 2000",
    ];
    for line in newer {
        assert!(yaml.contains(line), "{yaml}");
    }
    let older: String = yaml
        .lines()
        .filter(|l| !newer.contains(&l.trim()))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(older, yaml);
    let back: Ingress = serde_norway::from_str(&older).unwrap();
    let l = &back.servers[0].locations[0];
    assert_eq!(
        (l.connect_timeout_ms, l.send_timeout_ms),
        (DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_SEND_TIMEOUT_MS)
    );
    assert_eq!(
        (
            l.request_buffering,
            l.client_body_buffer_size,
            l.client_body_timeout_ms
        ),
        (
            true,
            DEFAULT_CLIENT_BODY_BUFFER_SIZE,
            DEFAULT_CLIENT_BODY_TIMEOUT_MS
        )
    );
}

#[test]
fn client_max_body_size_inherits_and_zero_means_unlimited() {
    assert_eq!(
        location("location / { }").client_max_body_size,
        Some(1024 * 1024)
    );
    let p = ok("client_max_body_size 8m;
                server { location / { } location /up { client_max_body_size 0; } }
                server { client_max_body_size 512k; location / { } }");
    let s = &p.ingress.servers;
    assert_eq!(s[0].locations[0].client_max_body_size, Some(8 << 20));
    assert_eq!(s[0].locations[1].client_max_body_size, None);
    assert_eq!(s[1].locations[0].client_max_body_size, Some(512 << 10));
    assert_eq!(
        err("client_max_body_size 1x;"),
        format!("\"client_max_body_size\" directive invalid value {}", at(3))
    );
}

#[test]
fn upstream_tls_settings_inherit_per_family() {
    // Plain targets carry none.
    assert_eq!(
        location("proxy_ssl_verify off; location / { proxy_pass http://a:1; }").upstream_tls,
        None
    );
    // Nothing written: nginx's defaults, `verify` left unset.
    assert_eq!(
        location("location / { proxy_pass https://a:1; }").upstream_tls,
        Some(UpstreamTls::default())
    );
    let p = ok("proxy_ssl_server_name on;
                proxy_ssl_trusted_certificate ca.pem;
                grpc_ssl_name grpc.internal;
                server { listen 80;
                    location /a { proxy_pass https://a:1; proxy_ssl_verify on; proxy_ssl_name a.internal; }
                    location /g { grpc_pass grpcs://g:1; grpc_ssl_certificate c.pem; grpc_ssl_certificate_key k.pem; }
                    location /off { proxy_pass https://a:1; proxy_ssl_verify off; }
                }");
    let l = &p.ingress.servers[0].locations;
    assert_eq!(
        l[0].upstream_tls,
        Some(UpstreamTls {
            verify: Some(true),
            trusted_certificate: Some("/etc/nginx/ca.pem".into()),
            server_name: true,
            name: Some("a.internal".into()),
            certificate: None,
            certificate_key: None,
        })
    );
    // A grpcs location reads the grpc_ssl_* family only.
    assert_eq!(
        l[1].upstream_tls,
        Some(UpstreamTls {
            verify: None,
            trusted_certificate: None,
            server_name: false,
            name: Some("grpc.internal".into()),
            certificate: Some("/etc/nginx/c.pem".into()),
            certificate_key: Some("/etc/nginx/k.pem".into()),
        })
    );
    assert_eq!(l[2].upstream_tls.as_ref().unwrap().verify, Some(false));
}

#[test]
fn upstream_tls_errors() {
    assert_eq!(
        err("server { location / { proxy_pass https://a:1; proxy_ssl_verify on; } }"),
        format!(
            "no proxy_ssl_trusted_certificate for proxy_ssl_verify {}",
            at(3)
        )
    );
    assert_eq!(
        err("server { location / { grpc_pass grpcs://a:1; grpc_ssl_certificate c.pem; } }"),
        format!(
            "no \"grpc_ssl_certificate_key\" is defined for certificate \"/etc/nginx/c.pem\" {}",
            at(3)
        )
    );
    assert_eq!(
        err("proxy_ssl_verify on;\nproxy_ssl_verify on;"),
        format!("\"proxy_ssl_verify\" directive is duplicate {}", at(4))
    );
    assert!(err("proxy_ssl_name $host;").contains("variables in \"proxy_ssl_name\""));
    // Checked only where TLS is spoken, as nginx does.
    assert!(
        parse_with(
            "proxy_ssl_verify on; server { location / { proxy_pass http://a:1; } }",
            &Options::new()
        )
        .is_ok()
    );
}

#[test]
fn settings_after_a_nested_block_still_apply_to_it() {
    let l = location("location / { proxy_pass http://a:1; } proxy_read_timeout 7s;");
    assert_eq!(l.read_timeout_ms, 7_000);
}

// ---- upstream -------------------------------------------------------------

#[test]
fn upstream_servers_and_parameters() {
    let p = ok("upstream gate {
                    server 127.0.0.1:8084 weight=5 max_fails=3 fail_timeout=30s;
                    server gate-2.internal backup;
                    server [::1]:8086 down;
                    keepalive 16;
                }");
    let u = &p.ingress.upstreams[0];
    assert_eq!(u.name, "gate");
    assert_eq!(u.source, format!("{FILE}:3"));
    let s = &u.servers;
    assert_eq!(
        (s[0].host.as_str(), s[0].port, s[0].weight, s[0].max_fails),
        ("127.0.0.1", 8084, 5, 3)
    );
    assert_eq!(s[0].fail_timeout_ms, 30_000);
    assert_eq!(
        (s[1].host.as_str(), s[1].port, s[1].backup),
        ("gate-2.internal", 80, true)
    );
    assert_eq!(s[1].fail_timeout_ms, 10_000);
    assert!(s[2].down);
}

#[test]
fn upstream_errors() {
    assert_eq!(
        err("upstream u { }"),
        format!("no servers are inside upstream {}", at(3))
    );
    assert_eq!(
        err("upstream u { server a:1; }\nupstream U { server a:1; }"),
        format!("duplicate upstream \"U\" {}", at(4))
    );
    assert_eq!(
        err("upstream u { server a:1 weight=0; }"),
        format!("invalid parameter \"weight=0\" {}", at(3))
    );
    assert_eq!(
        err("upstream u { server a:1 fail_timeout=5ms; }"),
        format!("invalid parameter \"fail_timeout=5ms\" {}", at(3))
    );
    assert_eq!(
        err("upstream u { listen 80; }"),
        format!("\"listen\" directive is not allowed here {}", at(3))
    );
    assert_eq!(
        err("upstream u { server a:1 { } }"),
        format!("directive \"server\" is not terminated by \";\" {}", at(3))
    );
}

// ---- real ip --------------------------------------------------------------

#[test]
fn real_ip_settings() {
    let s = server(
        "set_real_ip_from 10.1.0.0/16; set_real_ip_from 192.168.1.1;
                    real_ip_header proxy_protocol; server { }",
    );
    let r = s.real_ip.unwrap();
    assert_eq!(r.trusted, ["10.1.0.0/16", "192.168.1.1/32"]);
    assert_eq!(r.header, RealIpHeader::ProxyProtocol);
    let r = server("server { set_real_ip_from ::1; }").real_ip.unwrap();
    assert_eq!(r.header, RealIpHeader::Header("X-Real-IP".into()));
    assert!(
        server("real_ip_header X-Forwarded-For; server { }")
            .real_ip
            .is_none()
    );
    assert_eq!(
        err("set_real_ip_from 10.0.0.0/99;"),
        format!(
            "host not found in set_real_ip_from \"10.0.0.0/99\" {}",
            at(3)
        )
    );
    assert!(err("set_real_ip_from lb.internal;").contains("outside the subset"));
    assert!(err("server { location / { real_ip_header X-Real-IP; } }").contains("inside location"));
}

// ---- the rest of a complete nginx.conf ------------------------------------

#[test]
fn ignored_directives_are_checked_then_skipped() {
    let src = "user www-data; worker_processes auto; pid /run/nginx.pid;
               error_log /var/log/nginx/error.log warn;
               events { worker_connections 768; multi_accept on; }
               http {
                   sendfile on; tcp_nopush on; types_hash_max_size 2048;
                   include_not_here_because_types_follow off;
               }";
    // The made-up directive is unknown: strict fails, lenient skips it.
    let e = parse_str(src, FILE, &Options::new())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "unknown directive \"include_not_here_because_types_follow\" {}",
            at(6)
        )
    );
    let p = parse_str(src, FILE, &Options::new().lenient(true)).unwrap();
    assert_eq!(p.warnings.len(), 1);
    assert!(directives::is_ignored("sendfile"));
    assert!(directives::ignored_names().any(|n| n == "worker_connections"));
}

#[test]
fn types_block_contents_are_skipped() {
    ok("types { text/html html htm; application/json json; } default_type text/plain;");
}

#[test]
fn ignored_flags_are_still_validated() {
    assert_eq!(
        err("sendfile maybe;"),
        format!(
            "invalid value \"maybe\" in \"sendfile\" directive, it must be \"on\" or \"off\" {}",
            at(3)
        )
    );
}

#[test]
fn unknown_and_outside_subset_directives() {
    assert_eq!(
        err("server {\n  location / {\n    fancy_thing on;\n  }\n}"),
        format!("unknown directive \"fancy_thing\" {}", at(5))
    );
    assert_eq!(
        err("server { location / { return 301 https://x; } }"),
        format!("directive \"return\" is outside the subset {}", at(3))
    );
}

#[test]
fn lenient_mode_skips_unknown_directives_and_their_blocks() {
    let p = parse_with(
        "map $a $b { default 1; }
         server { listen 80; location / { proxy_pass http://a:1; rewrite ^ /x; } }",
        &Options::new().lenient(true),
    )
    .unwrap();
    assert_eq!(p.warnings.len(), 2);
    assert_eq!(
        p.warnings[0].to_string(),
        format!("directive \"map\" is outside the subset, skipped {}", at(3))
    );
    assert!(p.ingress.servers[0].locations[0].target.is_some());
    // Lenient does not excuse a directive in the wrong place or a bad value.
    assert!(parse_with("listen 80;", &Options::new().lenient(true)).is_err());
    assert!(parse_with("proxy_read_timeout x;", &Options::new().lenient(true)).is_err());
}

#[test]
fn block_and_semicolon_mismatches() {
    assert_eq!(
        parse_str("events {}\nhttp;", FILE, &Options::new())
            .unwrap_err()
            .to_string(),
        format!("directive \"http\" has no opening \"{{\" {}", at(2))
    );
    assert_eq!(
        err("server { listen 80 { } }"),
        format!("directive \"listen\" is not terminated by \";\" {}", at(3))
    );
}

#[test]
fn events_is_required_and_blocks_are_single() {
    let e = parse_str("http { }", FILE, &Options::new())
        .unwrap_err()
        .to_string();
    assert_eq!(e, "no \"events\" section in configuration");
    let e = parse_str("events { }\nevents { }", FILE, &Options::new())
        .unwrap_err()
        .to_string();
    assert_eq!(e, format!("\"events\" directive is duplicate {}", at(2)));
    let e = parse_str("events { }\nhttp { }\nhttp { }", FILE, &Options::new())
        .unwrap_err()
        .to_string();
    assert_eq!(e, format!("\"http\" directive is duplicate {}", at(3)));
    // No http block: nothing to serve, not an error.
    let p = parse_str("events { }", FILE, &Options::new()).unwrap();
    assert!(p.ingress.servers.is_empty());
}

// ---- include --------------------------------------------------------------

fn mem(files: &[(&str, &str)]) -> MemorySource {
    files.iter().fold(MemorySource::new(), |m, (p, c)| {
        m.with_file(*p, c.as_bytes().to_vec())
    })
}

#[test]
fn include_globs_relative_to_the_conf_prefix_in_byte_order() {
    let src = mem(&[
        (
            "/etc/nginx/nginx.conf",
            "events {}\nhttp { include conf.d/*.conf; include /abs/extra; }",
        ),
        ("/etc/nginx/conf.d/b.conf", "server { server_name b; }"),
        ("/etc/nginx/conf.d/a.conf", "server { server_name a; }"),
        (
            "/etc/nginx/conf.d/.hidden.conf",
            "server { server_name hidden; }",
        ),
        (
            "/etc/nginx/conf.d/c.conf.off",
            "server { server_name off; }",
        ),
        ("/abs/extra", "upstream u { server 127.0.0.1:1; }"),
    ]);
    let p = load_from(FILE, &Options::new(), &src).unwrap();
    let names: Vec<&str> = p
        .ingress
        .servers
        .iter()
        .map(|s| s.server_names[0].as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(p.ingress.upstreams[0].name, "u");
    assert_eq!(p.ingress.servers[0].source, "/etc/nginx/conf.d/a.conf:1");
}

#[test]
fn include_in_a_server_block_splices_in_context() {
    let src = mem(&[
        (
            "/etc/nginx/nginx.conf",
            "events {}\nhttp { server { include snippets/tls.conf; } }",
        ),
        (
            "/etc/nginx/snippets/tls.conf",
            "listen 443 ssl;\nssl_certificate a;\nssl_certificate_key b;",
        ),
    ]);
    let p = load_from(FILE, &Options::new(), &src).unwrap();
    assert!(p.ingress.servers[0].tls.is_some());
}

#[test]
fn include_errors() {
    let missing = mem(&[(
        "/etc/nginx/nginx.conf",
        "events {}\nhttp {\ninclude nope.conf; }",
    )]);
    let e = load_from(FILE, &Options::new(), &missing).unwrap_err();
    assert!(matches!(e, Error::ReadFailed { .. }));
    assert!(
        e.to_string()
            .starts_with("open() \"/etc/nginx/nope.conf\" failed")
    );
    assert!(e.to_string().ends_with(&at(3)));

    let no_match = mem(&[(
        "/etc/nginx/nginx.conf",
        "events {}\nhttp { include none/*.conf; }",
    )]);
    load_from(FILE, &Options::new(), &no_match).unwrap();

    let cycle = mem(&[
        (
            "/etc/nginx/nginx.conf",
            "events {}\nhttp { include a.conf; }",
        ),
        ("/etc/nginx/a.conf", "\ninclude b.conf;"),
        ("/etc/nginx/b.conf", "include a.conf;"),
    ]);
    let e = load_from(FILE, &Options::new(), &cycle).unwrap_err();
    assert_eq!(
        e.to_string(),
        "include cycle: \"/etc/nginx/a.conf\" is already being read in /etc/nginx/b.conf:1"
    );

    let self_include = mem(&[("/etc/nginx/nginx.conf", "events {}\ninclude nginx.conf;")]);
    assert!(matches!(
        load_from(FILE, &Options::new(), &self_include),
        Err(Error::IncludeCycle { .. })
    ));

    let unbalanced = mem(&[
        (
            "/etc/nginx/nginx.conf",
            "events {}\nhttp { include a.conf; }",
        ),
        ("/etc/nginx/a.conf", "server {"),
    ]);
    let e = load_from(FILE, &Options::new(), &unbalanced)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "unexpected end of file, expecting \"}\" in /etc/nginx/a.conf:1"
    );

    let arity = mem(&[("/etc/nginx/nginx.conf", "events {}\ninclude a b;")]);
    assert!(
        load_from(FILE, &Options::new(), &arity)
            .unwrap_err()
            .to_string()
            .starts_with("invalid number of arguments in \"include\"")
    );

    // glob(3): an unclosed `[` is literal, so this includes a file named "[".
    let bracket = mem(&[
        ("/etc/nginx/nginx.conf", "events {}\nhttp { include [; }"),
        ("/etc/nginx/[", "upstream u { server 127.0.0.1:1; }"),
    ]);
    let p = load_from(FILE, &Options::new(), &bracket).unwrap();
    assert_eq!(p.ingress.upstreams.len(), 1);
}

#[test]
fn parse_str_leaves_includes_unresolved() {
    assert!(matches!(
        parse_str("events {}\ninclude x.conf;", FILE, &Options::new()),
        Err(Error::UnresolvedInclude { .. })
    ));
}

#[test]
fn conf_prefix_option_overrides_the_main_file_directory() {
    let src = mem(&[
        (
            "/etc/nginx/nginx.conf",
            "events {}\nhttp { include x.conf; }",
        ),
        (
            "/srv/conf/x.conf",
            "server { listen 443 ssl; ssl_certificate c; ssl_certificate_key k; }",
        ),
    ]);
    let p = load_from(FILE, &Options::new().conf_prefix("/srv/conf"), &src).unwrap();
    let tls = p.ingress.servers[0].tls.clone().unwrap();
    assert_eq!(tls.certificates[0].certificate, "/srv/conf/c");
}

#[test]
fn include_depth_is_bounded() {
    // a0 includes a1 includes a2 …: no cycle, just deep.
    let mut src = MemorySource::new().with_file("/etc/nginx/nginx.conf", "events {}\ninclude a0;");
    for i in 0..40 {
        src = src.with_file(format!("/etc/nginx/a{i}"), format!("include a{};", i + 1));
    }
    assert!(matches!(
        load_from(FILE, &Options::new(), &src),
        Err(Error::LimitExceeded { .. })
    ));
}

// ---- the model as data ----------------------------------------------------

#[test]
fn model_round_trips_through_yaml_in_camel_case() {
    let p = ok("upstream gate { server 127.0.0.1:8084; }
                server { listen 443 ssl proxy_protocol; ssl_certificate a; ssl_certificate_key b;
                         location / { proxy_pass http://gate; } }");
    let yaml = serde_norway::to_string(&p.ingress).unwrap();
    assert!(yaml.contains("proxyProtocol: true"), "{yaml}");
    assert!(yaml.contains("readTimeoutMs: 60000"), "{yaml}");
    assert!(yaml.contains("kind: upstream"), "{yaml}");
    let back: Ingress = serde_norway::from_str(&yaml).unwrap();
    assert_eq!(back, p.ingress);
}

#[test]
fn model_refuses_unknown_fields() {
    let yaml = "servers: []\nupstreams: []\nextra: 1\n";
    let e = serde_norway::from_str::<Ingress>(yaml)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `extra`"), "{e}");
}

#[test]
fn files_are_named_as_given() {
    let e = parse_str(
        "events {}\nbogus;",
        Path::new("relative/nginx.conf"),
        &Options::new(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(e, "unknown directive \"bogus\" in relative/nginx.conf:2");
}
