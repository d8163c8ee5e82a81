//! The listener names agents from the places `identity.sources` lists, in
//! that order: a gateway told to read the common name matches its policy
//! on CNs, and one told to read only DNS SANs refuses the dev agents'
//! certificates (URI SAN and CN, no DNS SAN) as naming nobody.

mod common;

use common::*;
use spinlink_gateway::admin::AuthFailure;

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
