//! The documented example (`tests/fixtures/spinnaker`): Deck, Gate and the
//! agents' gRPC port, read from disk with its includes, into the model the
//! gateway will serve. `tests/nginx_differential.rs` checks the same files with
//! real nginx.

use std::path::PathBuf;

use spinlink_nginx_compat::*;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spinnaker")
}

fn p(rel: &str) -> String {
    fixture().join(rel).to_string_lossy().into_owned()
}

fn h(name: &str, value: &str) -> Header {
    Header {
        name: name.into(),
        value: value.into(),
    }
}

fn listen(
    address: &str,
    port: u16,
    ssl: bool,
    proxy_protocol: bool,
    default_server: bool,
) -> Listen {
    Listen {
        address: address.into(),
        port,
        ssl,
        http2: true,
        proxy_protocol,
        default_server,
    }
}

#[test]
fn spinnaker_example_parses_into_the_expected_model() -> anyhow::Result<()> {
    let main = fixture().join("nginx.conf");
    let parsed = load(&main, &Options::new())?;
    assert_eq!(parsed.warnings, vec![], "the example needs no lenient mode");
    let ingress = parsed.ingress;

    let real_ip = Some(RealIp {
        trusted: vec!["10.0.0.0/8".into(), "192.168.0.0/16".into()],
        header: RealIpHeader::ProxyProtocol,
    });
    let http_headers = vec![
        h("Host", "$host"),
        h("X-Real-IP", "$remote_addr"),
        h("X-Forwarded-For", "$proxy_add_x_forwarded_for"),
        h("X-Forwarded-Proto", "$scheme"),
    ];
    let tls12_13 = vec![TlsProtocol::TlsV1_2, TlsProtocol::TlsV1_3];
    let spinnaker_cert = vec![CertificateKey {
        certificate: p("certs/spinnaker.crt"),
        key: p("certs/spinnaker.key"),
    }];

    let deck = Server {
        listens: vec![
            listen("*", 443, true, true, true),
            listen("::", 443, true, true, true),
        ],
        server_names: vec!["spinnaker.example.com".into()],
        http2: true,
        tls: Some(Tls {
            certificates: spinnaker_cert.clone(),
            client_certificate: None,
            verify_client: VerifyClient::Off,
            protocols: tls12_13.clone(),
        }),
        real_ip: real_ip.clone(),
        locations: vec![Location {
            match_kind: MatchKind::Prefix,
            path: "/".into(),
            target: Some(Target {
                protocol: Protocol::Http,
                backend: Backend::Upstream {
                    name: "deck".into(),
                },
                uri: None,
            }),
            headers: http_headers.clone(),
            read_timeout_ms: 120_000,
            connect_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            client_max_body_size: Some(8 << 20),
            request_buffering: true,
            client_body_buffer_size: 16 * 1024,
            client_body_timeout_ms: 60_000,
            upstream_tls: None,
            locations: vec![],
            source: format!("{}:10", p("conf.d/10-deck.conf")),
        }],
        source: format!("{}:2", p("conf.d/10-deck.conf")),
    };

    let gate_headers = vec![
        h("Host", "$host"),
        h("X-Forwarded-For", "$proxy_add_x_forwarded_for"),
        h("X-Forwarded-Proto", "$scheme"),
        h("X-SSL-Client-Cert", "$ssl_client_escaped_cert"),
    ];
    let gate = Server {
        listens: vec![
            listen("*", 443, true, true, false),
            listen("::", 443, true, true, false),
        ],
        server_names: vec!["api.spinnaker.example.com".into()],
        http2: true,
        tls: Some(Tls {
            certificates: spinnaker_cert,
            client_certificate: Some(p("certs/clients-ca.crt")),
            verify_client: VerifyClient::Optional,
            protocols: tls12_13.clone(),
        }),
        real_ip: real_ip.clone(),
        locations: vec![
            Location {
                match_kind: MatchKind::Prefix,
                path: "/".into(),
                target: Some(Target {
                    protocol: Protocol::Http,
                    backend: Backend::Upstream {
                        name: "gate".into(),
                    },
                    uri: None,
                }),
                headers: gate_headers.clone(),
                read_timeout_ms: 300_000,
                connect_timeout_ms: 60_000,
                send_timeout_ms: 60_000,
                client_max_body_size: Some(100 << 20),
                request_buffering: true,
                client_body_buffer_size: 16 * 1024,
                client_body_timeout_ms: 60_000,
                upstream_tls: None,
                locations: vec![],
                source: format!("{}:18", p("conf.d/20-gate.conf")),
            },
            Location {
                match_kind: MatchKind::Exact,
                path: "/health".into(),
                target: Some(Target {
                    protocol: Protocol::Http,
                    backend: Backend::Upstream {
                        name: "gate".into(),
                    },
                    uri: Some("/health".into()),
                }),
                headers: gate_headers,
                read_timeout_ms: 5_000,
                connect_timeout_ms: 60_000,
                send_timeout_ms: 60_000,
                client_max_body_size: Some(8 << 20),
                request_buffering: true,
                client_body_buffer_size: 16 * 1024,
                client_body_timeout_ms: 60_000,
                upstream_tls: None,
                locations: vec![],
                source: format!("{}:26", p("conf.d/20-gate.conf")),
            },
        ],
        source: format!("{}:2", p("conf.d/20-gate.conf")),
    };

    let agents = Server {
        listens: vec![Listen {
            address: "*".into(),
            port: 8443,
            ssl: true,
            http2: true,
            proxy_protocol: false,
            default_server: false,
        }],
        server_names: vec!["agents.spinnaker.example.com".into()],
        http2: true,
        tls: Some(Tls {
            certificates: vec![CertificateKey {
                certificate: p("certs/agents.crt"),
                key: p("certs/agents.key"),
            }],
            client_certificate: Some(p("certs/agents-ca.crt")),
            verify_client: VerifyClient::On,
            protocols: tls12_13,
        }),
        real_ip,
        locations: vec![Location {
            match_kind: MatchKind::Prefix,
            path: "/spinlink.v1.Tunnel/".into(),
            target: Some(Target {
                protocol: Protocol::Grpcs,
                backend: Backend::Upstream {
                    name: "spinlink_sidecar".into(),
                },
                uri: None,
            }),
            headers: vec![h("X-Client-Cert", "$ssl_client_escaped_cert")],
            read_timeout_ms: 3_600_000,
            connect_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            client_max_body_size: None,
            request_buffering: false,
            client_body_buffer_size: 16 * 1024,
            client_body_timeout_ms: 60_000,
            upstream_tls: Some(UpstreamTls::default()),
            locations: vec![],
            source: format!("{}:11", p("conf.d/30-agents.conf")),
        }],
        source: format!("{}:2", p("conf.d/30-agents.conf")),
    };

    let upstream_server =
        |port: u16, backup: bool, max_fails: u32, fail_timeout_ms: u64| UpstreamServer {
            host: "127.0.0.1".into(),
            port,
            weight: 1,
            max_fails,
            fail_timeout_ms,
            backup,
            down: false,
        };
    let main_file = p("nginx.conf");
    let upstreams = vec![
        Upstream {
            name: "deck".into(),
            servers: vec![upstream_server(9000, false, 1, 10_000)],
            source: format!("{main_file}:43"),
        },
        Upstream {
            name: "gate".into(),
            servers: vec![
                upstream_server(8084, false, 3, 30_000),
                upstream_server(8085, true, 1, 10_000),
            ],
            source: format!("{main_file}:47"),
        },
        Upstream {
            name: "spinlink_sidecar".into(),
            servers: vec![upstream_server(7443, false, 1, 10_000)],
            source: format!("{main_file}:53"),
        },
    ];

    assert_eq!(ingress.upstreams, upstreams);
    assert_eq!(ingress.servers.len(), 3);
    assert_eq!(ingress.servers[0], deck);
    assert_eq!(ingress.servers[1], gate);
    assert_eq!(ingress.servers[2], agents);

    // Routing as nginx would route: the agents' streams, Gate's exact
    // health check, everything else of Gate.
    let agent_route = ingress.servers[2]
        .select_location("/spinlink.v1.Tunnel/Relay")
        .map(|l| l.path.as_str());
    assert_eq!(agent_route, Some("/spinlink.v1.Tunnel/"));
    assert_eq!(
        ingress.servers[1]
            .select_location("/health")
            .map(|l| l.match_kind),
        Some(MatchKind::Exact)
    );
    assert_eq!(
        ingress.servers[1]
            .select_location("/health/x")
            .map(|l| l.path.as_str()),
        Some("/")
    );

    // Every upstream a location names is there.
    for server in &ingress.servers {
        for location in &server.locations {
            if let Some(Target {
                backend: Backend::Upstream { name },
                ..
            }) = &location.target
            {
                assert!(ingress.upstream(name).is_some(), "{name}");
            }
        }
    }

    // It prints as YAML (what `spinlink nginx convert` will show) and reads back.
    let yaml = serde_norway::to_string(&ingress)?;
    let back: Ingress = serde_norway::from_str(&yaml)?;
    assert_eq!(back, ingress);
    Ok(())
}
