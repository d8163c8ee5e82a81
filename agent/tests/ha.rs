//! Several agent replicas for one cluster: a Lease per account elects the
//! one that caches, every replica relays, and when the leader dies (no
//! release: its task is aborted) another takes over within the lease
//! duration and resumes from the sidecar's resourceVersions instead of
//! listing.

mod chain_support;

use chain_support::{RELISTS, WAIT, chain, configmap, metric, start_gateway, wait_until};
use serde_json::json;

fn holder(sim: &spinlink_kube_sim::Sim) -> Option<String> {
    sim.list("leases", Some("default"))
        .iter()
        .find(|l| l["metadata"]["name"] == "spinlink-agent-dev")
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_holder_caches_and_a_survivor_takes_over() {
    let chain = chain().await;
    let gw = start_gateway(chain.dir(), &chain.pki, "gw", chain.tunnel, json!({})).await;
    let election = |identity: &str| {
        json!({"leaderElection": {"enabled": true, "leaseDurationSeconds": 2,
            "namespace": "default", "identity": identity}})
    };
    let r1 = chain.agent_with(gw.addr.port(), election("r1"));
    let r1_metrics = r1.metrics();
    let r1_task = tokio::spawn(r1.run(chain.stop.clone()));
    wait_until("r1 to lead and sync", || {
        holder(&chain.sim).as_deref() == Some("r1") && chain.cached() == chain.in_sim()
    })
    .await;
    let r2 = chain.agent_with(gw.addr.port(), election("r2"));
    let r2_metrics = r2.metrics();
    let r2_state = r2.state();
    let r2_task = tokio::spawn(r2.run(chain.stop.clone()));

    // r2 relays (its relay stream is the newest, so the sidecar uses it) but
    // does not cache.
    let relayed =
        "spinlink_agent_relays_total{account=\"dev\",verb=\"watch\",outcome=\"relayed\"} ";
    tokio::time::timeout(WAIT, async {
        loop {
            let (status, _) = chain
                .get("/api/v1/namespaces/demo/secrets?watch=1&timeoutSeconds=1")
                .await
                .unwrap();
            assert!(status.contains("200"), "{status}");
            if metric(&r2_metrics.encode(), relayed) > 0 {
                break;
            }
        }
    })
    .await
    .expect("r2 relays");
    chain.sim.create(configmap("while-r1-leads")).unwrap();
    wait_until("r1 to cache it", || chain.cached() == chain.in_sim()).await;
    assert_eq!(holder(&chain.sim).as_deref(), Some("r1"));
    assert_eq!(metric(&r2_metrics.encode(), RELISTS), 0, "r2 lists nothing");
    assert_eq!(
        r2_state.borrow().accounts.get("dev"),
        Some(&spinlink_agent::AccountState::Standby)
    );
    assert!(metric(&r1_metrics.encode(), RELISTS) >= 1);

    // r1 dies without releasing the Lease.
    r1_task.abort();
    let _ = r1_task.await;
    chain.sim.create(configmap("after-r1-died")).unwrap();
    wait_until("r2 to take over", || {
        holder(&chain.sim).as_deref() == Some("r2")
    })
    .await;
    wait_until("the cache to follow under r2", || {
        chain.cached() == chain.in_sim()
    })
    .await;
    assert!(chain.cached().contains(&"after-r1-died".to_owned()));
    assert_ne!(
        r2_state.borrow().accounts.get("dev"),
        Some(&spinlink_agent::AccountState::Standby)
    );
    // Resumed from the sidecar's resourceVersions: nothing listed again.
    assert_eq!(
        metric(&r2_metrics.encode(), RELISTS),
        0,
        "{}",
        r2_metrics.encode()
    );
    chain.sim.create(configmap("later")).unwrap();
    wait_until("later changes", || chain.cached() == chain.in_sim()).await;

    chain.stop.cancel();
    gw.stop.cancel();
    tokio::time::timeout(WAIT, r2_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
