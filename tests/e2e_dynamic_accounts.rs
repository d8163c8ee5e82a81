//! Dynamic accounts end to end, every component the real `spinlink`
//! binary: kube-sim, a sidecar with an encryption key, a gateway and an
//! infrastructure-mode agent that starts with one configured account and
//! `dynamicAccounts` on. `POST /v1/accounts` with kube-sim's kubeconfig
//! brings a new account online on the running agent (no restart) and
//! kubectl lists its pods through the facade; `DELETE` takes it away: the
//! facade answers 404 and the agent no longer serves it. The kubeconfig's
//! token never appears in the store file, the API's answers or any log.

mod support;

use std::net::SocketAddr;

use support::chain::dynamic_chain;
use support::{Kubectl, http, send_json, wait_for};

/// The bearer token of the posted kubeconfig (kube-sim accepts any): it
/// must never be seen outside the request and the agent's memory.
const TOKEN: &str = "e2e-dynamic-token-7f3b1c9e5a";

fn agent_accounts(admin: SocketAddr) -> serde_json::Value {
    let (status, body) = http(admin, "GET", "/accounts", &[]);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn posted_account_comes_online_without_restart_and_delete_takes_it_away() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    let (posted, mut chain, admin) = dynamic_chain(dir, &sim_kubeconfig, TOKEN, "");
    let facade = chain.facade;
    let connections_before = chain.agent.log().matches("Hello answered").count();

    // Another zone's account is not this agent's.
    let other_zone = serde_json::json!({"name": "dyn-us", "kubeconfig": posted, "zone": "us"});
    let (status, body) = send_json(facade, "POST", "/v1/accounts", &other_zone.to_string());
    assert_eq!(status, 201, "{body}");
    // This zone's.
    let create = serde_json::json!({"name": "dyn-1", "kubeconfig": posted, "zone": "eu"});
    let (status, body) = send_json(facade, "POST", "/v1/accounts", &create.to_string());
    assert_eq!(status, 201, "{body}");
    assert!(!body.contains(TOKEN), "{body}");

    chain.wait_ready("dyn-1");
    assert!(chain.agent.running(), "the agent restarted");
    assert_eq!(
        chain.agent.log().matches("Hello answered").count(),
        connections_before,
        "the agent reconnected instead of adding the account on its connection"
    );
    let via = chain.kubectl("dyn-1");
    let names = |k: &Kubectl| k.sorted_lines(&["get", "pods", "-A", "-o", "name"]);
    let pods = names(&direct);
    assert!(!pods.is_empty(), "the simulated cluster has pods");
    assert_eq!(names(&via), pods);

    let (status, list) = http(facade, "GET", "/v1/dynamic-accounts", &[]);
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let of = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(of("dyn-1")["agentId"], "agent-1");
    assert_eq!(of("dyn-1")["zone"], "eu");
    assert_eq!(of("dyn-us")["agentId"], "");
    assert!(!list.to_string().contains(TOKEN));
    let served = agent_accounts(admin);
    assert!(served["accounts"].get("dyn-1").is_some(), "{served}");
    assert!(served["accounts"].get("dyn-us").is_none(), "{served}");

    let (status, body) = send_json(facade, "DELETE", "/v1/accounts/dyn-1", "");
    assert_eq!(status, 200, "{body}");
    wait_for("the facade to answer 404 for dyn-1", || {
        let (status, _) = http(facade, "GET", "/accounts/dyn-1/api/v1/pods", &[]);
        (status == 404).then_some(())
    });
    wait_for("the agent to stop serving dyn-1", || {
        agent_accounts(admin)["accounts"]
            .get("dyn-1")
            .is_none()
            .then_some(())
    });
    assert!(chain.agent.running(), "the agent restarted");
    // The configured account never noticed.
    chain.wait_ready("static");

    // Sealed at rest; never logged.
    // The database and its WAL and journal files.
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().contains("sidecar.db") {
            let stored = std::fs::read(&path).unwrap();
            assert!(
                !support::contains(&stored, TOKEN.as_bytes()),
                "kubeconfig stored in clear in {}",
                path.display()
            );
        }
    }
    for (name, log) in [
        ("sidecar", chain.sidecar.log()),
        ("gateway", chain.gateway.log()),
        ("agent", chain.agent.log()),
    ] {
        assert!(!log.contains(TOKEN), "{name} logged the kubeconfig:\n{log}");
    }
}
