//! The listener names agents from the places `identity.sources` lists, in
//! that order: a gateway told to read the common name matches its policy
//! on CNs, and one told to read only DNS SANs refuses the dev agents'
//! certificates (URI SAN and CN, no DNS SAN) as naming nobody.

mod common;

use common::*;
use spinlink_gateway::stats::AuthFailure;

#[tokio::test]
async fn common_name_source_is_matched_by_the_policy() {
    let pki = pki();
    let yaml = tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\nidentity: {sources: [commonName]}\n",
    )
    // The dev agent certificates' CN is `agent-<id>`.
    .replace("'spiffe://spinlink.dev/agent/*'", "'agent-*'");
    let gw = start_gateway(&yaml).await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let resp = hello(&channel, &["dev-1"]).await.unwrap();
    assert_eq!(resp.granted.len(), 1, "{resp:?}");
    // The identity in refusals is the CN, not the URI SAN.
    let resp = hello(&channel, &["prod"]).await.unwrap();
    assert_eq!(
        resp.refused[0].reason,
        "identity agent-a1 may not serve account prod"
    );
}

#[tokio::test]
async fn certificate_without_the_configured_source_names_nobody() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\nidentity: {sources: [dnsSan]}\n",
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    assert!(hello(&channel, &["dev-1"]).await.is_err());
    tokio::time::timeout(
        WAIT,
        gw.stats.wait_for(|s| s.connections_without_identity >= 1),
    )
    .await
    .expect("connection without identity not counted");
    let metrics = gw.stats.metrics();
    assert_eq!(metrics.auth_failures(AuthFailure::NoIdentity), 1);
    assert_eq!(metrics.auth_failures(AuthFailure::Handshake), 0);
    let stats = gw.stats.snapshot();
    assert_eq!((stats.handshake_failures, stats.accounts_granted), (0, 0));
}

/// By default a certificate is named by its SANs only: one whose subject
/// CN merely says `spiffe://spinlink.dev/agent/a1` (free text, which any
/// certificate of the CA can carry) names nobody and gets no account.
#[tokio::test]
async fn a_common_name_is_not_an_identity_unless_configured() {
    let pki = pki();
    let ca = spinlink_tls::dev::DevCa::load(&pki.pki.dir).unwrap();
    ca.issue(&spinlink_tls::dev::Leaf::client(
        "spiffe://spinlink.dev/agent/a1",
    ))
    .unwrap()
    .write(&pki.pki.dir, "cn-only")
    .unwrap();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    let cn_only = (pki.pki.cert("cn-only"), pki.pki.key("cn-only"));
    let channel = agent_channel(gw.addr, &pki.pki, Some((&cn_only.0, &cn_only.1)))
        .await
        .unwrap();
    assert!(hello(&channel, &["dev-1"]).await.is_err());
    assert_eq!(gw.stats.metrics().auth_failures(AuthFailure::NoIdentity), 1);
    // The URI SAN of the real a1 still names it.
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    assert_eq!(hello(&a1, &["dev-1"]).await.unwrap().granted.len(), 1);
}

/// TLS 1.3 only by default (`tls.minVersion`); `"1.2"` lets older clients in.
#[tokio::test]
async fn tls_1_2_is_refused_unless_allowed() {
    let pki = pki();
    use rustls::pki_types::pem::PemObject;
    let tls12 = |pki: &spinlink_tls::dev::DevPki| {
        let mut roots = rustls::RootCertStore::empty();
        let ca = std::fs::read(pki.ca_cert()).unwrap();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
            roots.add(c.unwrap()).unwrap();
        }
        let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(pki.cert("agent-a1"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(pki.key("agent-a1")).unwrap();
        let mut config =
            rustls::ClientConfig::builder_with_provider(spinlink_tls::config::provider())
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
    };
    for (extra, accepted) in [("", false), ("  minVersion: '1.2'\n", true)] {
        let yaml = tls_gateway_yaml(&pki.pki, "upstreams: [{url: 'http://127.0.0.1:9'}]\n")
            .replacen("tls:\n", &format!("tls:\n{extra}"), 1);
        let gw = start_gateway(&yaml).await;
        let tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let handshake = tls12(&pki.pki)
            .connect("localhost".try_into().unwrap(), tcp)
            .await;
        assert_eq!(
            handshake.is_ok(),
            accepted,
            "minVersion {extra:?}: {handshake:?}"
        );
    }
}
