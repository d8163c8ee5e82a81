//! An agent coming back to the gateway resumes its TLS session from the
//! ticket the gateway gave it — the gateway then counts it among returning
//! agents (their reserved share of handshakes in a storm) and skips the
//! certificate exchange — until its certificate files change, when it
//! makes a full handshake with the new certificate.

use std::sync::Arc;

use spinlink_agent::GatewayConfig;
use spinlink_proto::v1::{AccountInfo, HelloRequest};
use spinlink_tls::dev::{DevCa, DevPki, Leaf, dev_agent_identity};

#[tokio::test]
async fn a_returning_agent_resumes_its_tls_session_until_its_certificate_changes() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::ensure(dir.path(), &["a1"]).unwrap();
    let yaml = format!(
        "gatewayId: gw\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
         policy:\n  - identities: ['{}']\n    accounts: ['dev']\nupstreams: [{{url: 'http://127.0.0.1:9'}}]\n",
        pki.cert("gateway").display(),
        pki.key("gateway").display(),
        pki.ca_cert().display(),
        dev_agent_identity("a1"),
    );
    let config = spinlink_gateway::Config::from_yaml_str(&yaml, "gw.yaml").unwrap();
    let gateway = spinlink_gateway::Gateway::bind(config).await.unwrap();
    let addr = gateway.local_addr();
    let stats = gateway.stats();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(gateway.run(stop.clone()));

    let cfg = GatewayConfig {
        url: format!("https://localhost:{}", addr.port()),
        ca_file: Some(pki.ca_cert()),
        cert_file: Some(pki.cert("agent-a1")),
        key_file: Some(pki.key("agent-a1")),
        ..GatewayConfig::default()
    };
    let store: Arc<dyn rustls::client::ClientSessionStore> =
        Arc::new(rustls::client::ClientSessionMemoryCache::new(4));
    let resumed = || stats.metrics().handshakes_resumed.get();
    let dial = || async {
        let mut client =
            spinlink_agent::connection::connect_with_sessions(&cfg, Some(store.clone()))
                .await
                .unwrap();
        let hello = HelloRequest {
            agent_id: "a1".into(),
            accounts: vec![AccountInfo {
                name: "dev".into(),
                ..AccountInfo::default()
            }],
            ..HelloRequest::default()
        };
        // Granted: the identity is a1's, resumed or not.
        let granted = client.hello(hello).await.unwrap().into_inner().granted;
        assert_eq!(granted.len(), 1);
    };

    dial().await;
    assert_eq!(resumed(), 0, "the first connection is a full handshake");
    dial().await;
    dial().await;
    assert_eq!(resumed(), 2, "returning connections resume");

    // A renewed certificate in place: a full handshake, presenting it.
    let renewed = DevCa::load(dir.path())
        .and_then(|ca| ca.issue(&Leaf::client("agent-a1").with_uri(&dev_agent_identity("a1"))))
        .unwrap();
    renewed.write(dir.path(), "agent-a1").unwrap();
    dial().await;
    assert_eq!(
        resumed(),
        2,
        "a new certificate does not resume the old one's session"
    );
    dial().await;
    assert_eq!(resumed(), 3);

    stop.cancel();
    let _ = task.await;
}
