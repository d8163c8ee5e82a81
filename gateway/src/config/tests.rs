use super::*;

const FULL: &str = r#"
gatewayId: gw-1
listen: 127.0.0.1:7443
tls:
  certFile: /pki/gateway.crt
  keyFile: /pki/gateway.key
  clientCaFile: /pki/ca.crt
identity:
  sources: [uriSan, commonName]
tokenTtlSeconds: 600
policy:
  - identities: ["spiffe://spinlink.dev/agent/*"]
    accounts: ["dev-*", "staging"]
upstreams:
  - url: https://127.0.0.1:7001
  - url: http://127.0.0.1:7002
upstreamTls:
  caFile: /pki/ca.crt
  certFile: /pki/gateway.crt
  keyFile: /pki/gateway.key
  serverName: localhost
"#;

fn err(yaml: &str) -> String {
    Config::from_yaml_str(yaml, "gw.yaml")
        .unwrap_err()
        .to_string()
}

#[test]
fn full_example_parses() {
    let c = Config::from_yaml_str(FULL, "gw.yaml").unwrap();
    assert_eq!(c.gateway_id, "gw-1");
    assert_eq!(c.listen, "127.0.0.1:7443".parse().unwrap());
    assert_eq!(
        c.identity.sources(),
        [IdentitySource::UriSan, IdentitySource::CommonName]
    );
    assert_eq!(c.token_ttl(), Duration::from_secs(600));
    assert_eq!(c.upstreams.len(), 2);
    assert_eq!(
        c.upstream_tls.unwrap().server_name.as_deref(),
        Some("localhost")
    );
    assert!(!c.insecure);
}

#[test]
fn defaults() {
    let c = Config::from_yaml_str(
        "insecure: true\nupstreams: [{url: 'http://127.0.0.1:1'}]\n",
        "dev.yaml",
    )
    .unwrap();
    assert_eq!(c.token_ttl_seconds, DEFAULT_TOKEN_TTL_SECONDS);
    assert_eq!(c.listen, DEFAULT_LISTEN);
    // The subject's CN only when the configuration names it.
    assert_eq!(
        c.identity.sources(),
        [
            spinlink_tls::identity::IdentitySource::UriSan,
            spinlink_tls::identity::IdentitySource::DnsSan
        ]
    );
    assert_eq!(
        crate::config::TlsConfig::default().min_version,
        crate::config::TlsVersion::V1_3
    );
    assert!(c.policy.is_empty());
    assert_eq!(c.upstream_connections, DEFAULT_UPSTREAM_CONNECTIONS);
    assert_eq!(c.workers, 0, "one per CPU");
    assert_eq!(
        c.listener.preface_timeout_seconds,
        DEFAULT_PREFACE_TIMEOUT_SECONDS
    );
}

#[test]
fn unknown_keys_are_named_with_the_file() {
    let e = err("insecure: true\nupstreams: [{url: 'http://h:1'}]\ntokenTTL: 5\n");
    assert!(e.contains("gw.yaml") && e.contains("tokenTTL"), "{e}");
    let e = err("insecure: true\nupstreams: [{url: 'http://h:1', weight: 2}]\n");
    assert!(e.contains("weight"), "{e}");
}

#[test]
fn invalid_values_name_key_and_file() {
    let cases = [
        ("upstreams: [{url: 'http://h:1'}]\n", "`tls`"),
        ("insecure: true\n", "`upstreams`"),
        (
            "insecure: true\ntokenTtlSeconds: 0\nupstreams: [{url: 'http://h:1'}]\n",
            "`tokenTtlSeconds`",
        ),
        (
            "insecure: true\nidentity: {sources: []}\nupstreams: [{url: 'http://h:1'}]\n",
            "`identity.sources`",
        ),
        (
            "tls: {certFile: c, keyFile: k}\nupstreams: [{url: 'http://h:1'}]\n",
            "`tls.clientCaFile`",
        ),
        (
            "insecure: true\nupstreamConnections: 0\nupstreams: [{url: 'http://h:1'}]\n",
            "`upstreamConnections`",
        ),
        (
            "insecure: true\nworkers: 257\nupstreams: [{url: 'http://h:1'}]\n",
            "`workers`",
        ),
        (
            "insecure: true\nupstreams: [{url: 'http://h:1'}]\nlistener: {handshakeQueueSeconds: -1}\n",
            "handshakeQueueSeconds",
        ),
        (
            "insecure: true\nupstreams: [{url: 'http://h:1'}]\nlistener: {prefaceTimeoutSeconds: 0}\n",
            "`listener.prefaceTimeoutSeconds`",
        ),
    ];
    for (yaml, key) in cases {
        let e = err(yaml);
        assert!(e.contains("gw.yaml") && e.contains(key), "{yaml}: {e}");
    }
}

#[test]
fn unknown_identity_source_refused() {
    let e = err("insecure: true\nidentity: {sources: [email]}\nupstreams: [{url: 'http://h:1'}]\n");
    assert!(e.contains("email"), "{e}");
}

#[test]
fn from_file_names_missing_file() {
    let e = Config::from_file(Path::new("/nonexistent/gw.yaml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/gw.yaml"));
}
