//! The agent listener's mTLS: certificates from another CA, or none at all,
//! never get an HTTP/2 connection, and each refusal is counted.

mod common;

use common::*;
use spinlink_tls::dev::{DevCa, Leaf};

async fn hello_over(
    gw: &RunningGateway,
    pki: &spinlink_tls::dev::DevPki,
    agent: Option<(&std::path::Path, &std::path::Path)>,
) -> anyhow::Result<()> {
    let channel = agent_channel(gw.addr, pki, agent).await?;
    hello(&channel, &["dev-1"]).await?;
    Ok(())
}

#[tokio::test]
async fn client_cert_from_another_ca_is_refused() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!("upstreams: [{{url: '{}'}}]\n", sidecar.url()),
    ))
    .await;

    // Same identity, same names, signed by a CA the gateway does not trust.
    let foreign = DevCa::generate("foreign CA").unwrap();
    let issued = foreign
        .issue(&Leaf::client("agent-a1").with_uri(A1))
        .unwrap();
    let (cert, key) = issued.write(pki.dir.path(), "foreign-a1").unwrap();

    let result = tokio::time::timeout(WAIT, hello_over(&gw, &pki.pki, Some((&cert, &key)))).await;
    assert!(
        matches!(result, Ok(Err(_))),
        "foreign certificate accepted: {result:?}"
    );
    let stats = tokio::time::timeout(WAIT, gw.stats.wait_for(|s| s.handshake_failures >= 1))
        .await
        .unwrap();
    assert_eq!(stats.accounts_granted, 0);
    assert!(sidecar.streams().is_empty());
}

#[tokio::test]
async fn missing_client_cert_is_refused() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    let result = tokio::time::timeout(WAIT, hello_over(&gw, &pki.pki, None)).await;
    assert!(
        matches!(result, Ok(Err(_))),
        "no certificate accepted: {result:?}"
    );
    let stats = tokio::time::timeout(WAIT, gw.stats.wait_for(|s| s.handshake_failures >= 1))
        .await
        .unwrap();
    assert_eq!(stats.accounts_granted, 0);
}

#[tokio::test]
async fn dev_ca_agent_is_accepted() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    let a1 = (pki.pki.cert("agent-a1"), pki.pki.key("agent-a1"));
    tokio::time::timeout(WAIT, hello_over(&gw, &pki.pki, Some((&a1.0, &a1.1))))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(gw.stats.snapshot().handshake_failures, 0);
}
