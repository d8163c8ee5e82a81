//! Make-before-break through the real chain: kube-sim → agent → balancer →
//! two gateways → sidecar. A gateway that drains, or a connection past its
//! maximum age, sends `Reconnect`; the agent dials again (the balancer sends
//! it to the other replica), moves every account there, and lets the old
//! connection go only when its relayed requests have finished: a relayed
//! watch in flight across the move completes, and the cache stream continues
//! without a gap (no listing again, the sidecar's cache follows kube-sim).

mod chain_support;

use std::time::Duration;

use chain_support::{
    MOVES, RELISTS, WAIT, WATCHES_RELAYED, balancer, chain, configmap, metric, secret,
    start_gateway, wait_until,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_gateway_hands_over_without_failing_a_relay() {
    let chain = chain().await;
    let gw1 = start_gateway(chain.dir(), &chain.pki, "gw1", chain.tunnel, json!({})).await;
    let gw2 = start_gateway(chain.dir(), &chain.pki, "gw2", chain.tunnel, json!({})).await;
    let lb = balancer::Balancer::start(&[gw1.addr], None);
    let agent = chain.agent(lb.addr.port());
    let metrics = agent.metrics();
    let agent_task = tokio::spawn(agent.run(chain.stop.clone()));
    wait_until("the first sync", || {
        chain.accounts.status("dev").is_some_and(|s| s.ready()) && chain.cached() == chain.in_sim()
    })
    .await;
    let relists = metric(&metrics.encode(), RELISTS);
    assert_eq!(relists, 1, "{}", metrics.encode());

    // A relayed watch, in flight on gw1's connection while gw1 drains.
    let rv = chain.sim.resource_version();
    let watch = chain.get(&format!(
        "/api/v1/namespaces/demo/secrets?watch=1&timeoutSeconds=4&resourceVersion={rv}"
    ));
    wait_until("the watch to be relayed", || {
        metric(&metrics.encode(), WATCHES_RELAYED) == 1
    })
    .await;
    // The balancer takes the draining replica out, as a failed readiness
    // check would; the drain sends `Reconnect{"draining"}`.
    lb.set_backends(&[gw2.addr]);
    gw1.stop.cancel();
    wait_until("the move", || metric(&metrics.encode(), MOVES) == 1).await;
    chain.sim.create(configmap("during-move")).unwrap();
    chain.sim.create(secret("during-move")).unwrap();

    let (status, body) = watch.await.unwrap();
    assert!(status.contains("200"), "{status}\n{body}");
    assert!(
        body.contains("during-move"),
        "the old stream kept relaying: {body}"
    );
    assert!(
        body.ends_with("0\r\n\r\n"),
        "the watch ended normally: {body:?}"
    );

    // The cache stream continued on gw2: new objects arrive, nothing listed
    // again (a sequence gap would have made the sidecar ask for a resync).
    chain.sim.create(configmap("after-move")).unwrap();
    wait_until("the cache to follow", || chain.cached() == chain.in_sim()).await;
    assert_eq!(
        metric(&metrics.encode(), RELISTS),
        relists,
        "{}",
        metrics.encode()
    );
    assert!(lb.open_to(gw2.addr) >= 1);
    // New relayed requests go over the new connection.
    let (status, _) = chain
        .get("/api/v1/namespaces/demo/secrets?watch=1&timeoutSeconds=1")
        .await
        .unwrap();
    assert!(status.contains("200"), "{status}");
    wait_until("the old TCP connection to close", || {
        lb.open_to(gw1.addr) == 0
    })
    .await;
    // The old connection was let go once its relayed watch had finished, long
    // before the gateway's 25 s grace would have cut it.
    tokio::time::timeout(Duration::from_secs(15), gw1.task)
        .await
        .expect("gw1's drain ends when the agent has left")
        .unwrap();

    chain.stop.cancel();
    gw2.stop.cancel();
    tokio::time::timeout(WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_their_maximum_age_are_replaced_without_a_gap() {
    let chain = chain().await;
    let age = json!({"listener": {"maxConnectionAgeSeconds": 2,
        "maxConnectionAgeJitterPercent": 0, "maxConnectionAgeGraceSeconds": 5,
        "controlHeartbeatSeconds": 1}});
    let gw1 = start_gateway(chain.dir(), &chain.pki, "gw1", chain.tunnel, age.clone()).await;
    let gw2 = start_gateway(chain.dir(), &chain.pki, "gw2", chain.tunnel, age).await;
    let lb = balancer::Balancer::start(&[gw1.addr, gw2.addr], None);
    let agent = chain.agent(lb.addr.port());
    let metrics = agent.metrics();
    let agent_task = tokio::spawn(agent.run(chain.stop.clone()));
    wait_until("the first sync", || {
        chain.accounts.status("dev").is_some_and(|s| s.ready()) && chain.cached() == chain.in_sim()
    })
    .await;
    let relists = metric(&metrics.encode(), RELISTS);

    // Relayed watches and changes run across several moves.
    let mut n = 0;
    while metric(&metrics.encode(), MOVES) < 3 {
        let watch = chain.get("/api/v1/namespaces/demo/secrets?watch=1&timeoutSeconds=1");
        chain.sim.create(configmap(&format!("churn-{n}"))).unwrap();
        chain.sim.create(secret(&format!("churn-{n}"))).unwrap();
        n += 1;
        let (status, body) = watch.await.unwrap();
        assert!(status.contains("200"), "relay {n} failed: {status}\n{body}");
        assert!(body.ends_with("0\r\n\r\n"), "relay {n} cut: {body:?}");
        assert!(n < 60, "no moves: {}", metrics.encode());
    }
    wait_until("the cache to follow", || chain.cached() == chain.in_sim()).await;
    let text = metrics.encode();
    assert_eq!(metric(&text, RELISTS), relists, "{text}");
    // Every connection was replaced by a move, never by a failure.
    assert_eq!(
        metric(&text, "spinlink_agent_connections_total "),
        metric(&text, MOVES) + 1,
        "{text}"
    );
    // The gateways' `Control` heartbeats reached the agent.
    assert!(
        metric(&text, "spinlink_agent_control_heartbeats_total ") >= 1,
        "{text}"
    );

    chain.stop.cancel();
    gw1.stop.cancel();
    gw2.stop.cancel();
    tokio::time::timeout(WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
