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
use std::path::Path;

use spinlink_tls::dev::{DevPki, dev_agent_identity};
use support::{Kubectl, Proc, http, send_json, wait_for, write_kubeconfig};

/// The bearer token of the posted kubeconfig (kube-sim accepts any): it
/// must never be seen outside the request and the agent's memory.
const TOKEN: &str = "e2e-dynamic-token-7f3b1c9e5a";

fn yaml(dir: &Path, name: &str, text: String) -> String {
    support::write_file(dir, name, &text)
}

fn account_ready(facade: SocketAddr, name: &str) -> Option<()> {
    let (status, body) = http(facade, "GET", &format!("/v1/accounts/{name}"), &[]);
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let ready = status == 200
        && v["online"] == true
        && v["relay"] == true
        && v["kindsTotal"].as_u64().unwrap_or(0) > 0
        && v["kindsSynced"] == v["kindsTotal"];
    ready.then_some(())
}

fn agent_accounts(admin: SocketAddr) -> serde_json::Value {
    let (status, body) = http(admin, "GET", "/accounts", &[]);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn posted_account_comes_online_without_restart_and_delete_takes_it_away() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let p = |path: std::path::PathBuf| path.display().to_string();

    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    // kube-sim's kubeconfig with our marker token.
    let posted = std::fs::read_to_string(&sim_kubeconfig)
        .unwrap()
        .replace("\"kube-sim\"\n", &format!("\"{TOKEN}\"\n"));
    assert!(
        posted.contains(TOKEN),
        "kube-sim's kubeconfig changed shape"
    );

    // 32 raw bytes (a fixed test key).
    let key_path = dir.join("accounts.key");
    std::fs::write(
        &key_path,
        (0u8..32).map(|b| b.wrapping_mul(37)).collect::<Vec<_>>(),
    )
    .unwrap();
    let key_file = key_path.display().to_string();
    let db = dir.join("sidecar.db");
    let sidecar_cfg = yaml(
        dir,
        "sidecar.yaml",
        format!(
            "instanceId: e2e-sidecar\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\n\
             facade:\n  listen: 127.0.0.1:0\nstore:\n  url: sqlite://{}\n\
             accounts:\n  encryptionKeyFile: {key_file}\n",
            db.display()
        ),
    );
    let mut sidecar = Proc::start("sidecar", dir, &["sidecar", "--config", &sidecar_cfg]);
    let tunnel = sidecar.listening("sidecar-tunnel");
    let facade = sidecar.listening("sidecar-facade");

    let gateway_cfg = yaml(
        dir,
        "gateway.yaml",
        format!(
            "gatewayId: e2e-gateway\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
             policy:\n- identities: [\"{}\"]\n  accounts: [static, \"dyn-*\"]\n\
             upstreams:\n- url: http://{tunnel}\n",
            p(pki.cert("gateway")),
            p(pki.key("gateway")),
            p(pki.ca_cert()),
            dev_agent_identity("agent-1"),
        ),
    );
    let mut gateway = Proc::start("gateway", dir, &["gateway", "--config", &gateway_cfg]);
    let gateway_addr = gateway.listening("gateway");

    let admin: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let agent_cfg = yaml(
        dir,
        "agent.yaml",
        format!(
            "agentId: agent-1\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
             admin:\n  listen: {admin}\n\
             kubernetes:\n  accounts:\n  - name: static\n    kubeconfigFile: {}\n\
             dynamicAccounts:\n  enabled: true\n  zone: eu\n",
            gateway_addr.port(),
            p(pki.ca_cert()),
            p(pki.cert("agent-agent-1")),
            p(pki.key("agent-agent-1")),
            sim_kubeconfig.display(),
        ),
    );
    let mut agent = Proc::start("agent", dir, &["agent", "--config", &agent_cfg]);
    wait_for("account static to be ready", || {
        account_ready(facade, "static")
    });
    let connections_before = agent.log().matches("Hello answered").count();

    // Another zone's account is not this agent's.
    let other_zone = serde_json::json!({"name": "dyn-us", "kubeconfig": posted, "zone": "us"});
    let (status, body) = send_json(facade, "POST", "/v1/accounts", &other_zone.to_string());
    assert_eq!(status, 201, "{body}");
    // This zone's.
    let create = serde_json::json!({"name": "dyn-1", "kubeconfig": posted, "zone": "eu"});
    let (status, body) = send_json(facade, "POST", "/v1/accounts", &create.to_string());
    assert_eq!(status, 201, "{body}");
    assert!(!body.contains(TOKEN), "{body}");

    wait_for("account dyn-1 to come online", || {
        account_ready(facade, "dyn-1")
    });
    assert!(agent.running(), "the agent restarted");
    assert_eq!(
        agent.log().matches("Hello answered").count(),
        connections_before,
        "the agent reconnected instead of adding the account on its connection"
    );
    let facade_kubeconfig = dir.join("facade-dyn-1.kubeconfig");
    write_kubeconfig(
        &facade_kubeconfig,
        &format!("http://{facade}/accounts/dyn-1"),
    );
    let via = Kubectl::new(dir, "facade", &facade_kubeconfig);
    let names = |k: &Kubectl| {
        let mut v: Vec<String> = k
            .ok(&["get", "pods", "-A", "-o", "name"])
            .lines()
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
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
    assert!(agent.running(), "the agent restarted");
    // The configured account never noticed.
    assert!(account_ready(facade, "static").is_some());

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
        ("sidecar", sidecar.log()),
        ("gateway", gateway.log()),
        ("agent", agent.log()),
    ] {
        assert!(!log.contains(TOKEN), "{name} logged the kubeconfig:\n{log}");
    }
}
