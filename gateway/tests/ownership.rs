//! An account already served by one identity is refused to another, with a
//! reason, a metric and a log line; it is released when the first identity's
//! last connection is gone.

mod common;

use common::*;
use spinlink_gateway::stats::Refusal;

async fn agent(addr: std::net::SocketAddr, pki: &Pki, name: &str) -> tonic::transport::Channel {
    agent_channel(
        addr,
        &pki.pki,
        Some((&pki.pki.cert(name), &pki.pki.key(name))),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn second_identity_is_refused_until_the_first_is_gone() {
    capture_logs();
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    let a1 = agent(gw.addr, &pki, "agent-a1").await;
    let a1_again = agent(gw.addr, &pki, "agent-a1").await;
    let a2 = agent(gw.addr, &pki, "agent-a2").await;

    let resp = hello(&a1, &["dev-1", "staging"]).await.unwrap();
    assert_eq!(resp.granted.len(), 2);
    // The same identity on a second connection (make-before-break) is fine.
    assert_eq!(hello(&a1_again, &["dev-1"]).await.unwrap().granted.len(), 1);

    let resp = hello(&a2, &["dev-1", "dev-2"]).await.unwrap();
    let granted: Vec<_> = resp.granted.iter().map(|g| g.account.as_str()).collect();
    assert_eq!(granted, ["dev-2"]);
    assert_eq!(resp.refused.len(), 1);
    assert_eq!(resp.refused[0].account, "dev-1");
    assert_eq!(
        resp.refused[0].reason,
        "account dev-1 is already served by another identity on this gateway"
    );
    assert_eq!(gw.stats.metrics().refusals(Refusal::AccountOwned), 1);
    let text = gw.stats.metrics().encode();
    assert!(
        text.contains("spinlink_gateway_refusals_total{reason=\"account_owned\"} 1"),
        "{text}"
    );
    // The operator's log line names both: the identity refused and the owner.
    wait_log_line(&[
        "already served by another identity",
        "account=\"dev-1\"",
        "identity=\"spiffe://spinlink.dev/agent/a2\"",
        "owner=\"spiffe://spinlink.dev/agent/a1\"",
    ])
    .await;

    // One of a1's connections gone: a1 still owns dev-1.
    drop(a1);
    wait_open_connections(&gw, 2).await;
    let resp = hello(&a2, &["dev-1"]).await.unwrap();
    assert!(resp.granted.is_empty(), "{resp:?}");
    assert_eq!(gw.stats.metrics().refusals(Refusal::AccountOwned), 2);

    // Its last connection gone: released, and a2 takes dev-1 over.
    drop(a1_again);
    wait_open_connections(&gw, 1).await;
    let resp = hello(&a2, &["dev-1"]).await.unwrap();
    assert_eq!(resp.granted.len(), 1, "{resp:?}");
    // Now a1 is the one refused.
    let a1 = agent(gw.addr, &pki, "agent-a1").await;
    let resp = hello(&a1, &["dev-1", "staging"]).await.unwrap();
    let refused: Vec<_> = resp.refused.iter().map(|r| r.account.as_str()).collect();
    assert_eq!(refused, ["dev-1"]);
}

async fn wait_open_connections(gw: &RunningGateway, n: i64) {
    tokio::time::timeout(
        WAIT,
        gw.stats
            .wait_until(|s| s.metrics().connections_open.get() == n),
    )
    .await
    .expect("connections did not close");
}
