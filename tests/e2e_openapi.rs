//! OpenAPI through the whole chain (kube-sim, agent, gateway, sidecar as
//! separate `spinlink` processes) with real kubectl: `kubectl explain` run
//! twice fetches the OpenAPI documents from the cluster once, a second
//! account of the same cluster fetches its own but the sidecar holds one copy
//! of each, and after a CRD is created and the agent's next discovery refresh
//! reaches the sidecar, the next run fetches them again.

mod support;

use std::net::SocketAddr;

use spinlink_tls::dev::{DevPki, dev_agent_identity};
use support::{Kubectl, Proc, http, wait_for, write_kubeconfig};

const CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
metadata:\n  name: gadgets.e2e.spinlink.dev\nspec:\n  group: e2e.spinlink.dev\n  scope: Namespaced\n  \
names: {plural: gadgets, singular: gadget, kind: Gadget}\n  versions:\n  - name: v1\n    served: true\n    \
storage: true\n    schema:\n      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n";

/// The value of the sidecar's metric line starting with `prefix`.
fn metric(facade: SocketAddr, prefix: &str) -> u64 {
    let (status, metrics) = http(facade, "GET", "/metrics", &[]);
    assert_eq!(status, 200);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The sidecar's count of OpenAPI requests for `account` answered from
/// `source` (`cache`, `relay`).
fn openapi_requests(facade: SocketAddr, account: &str, source: &str) -> u64 {
    metric(
        facade,
        &format!(
            "spinlink_sidecar_facade_requests_total{{account=\"{account}\",verb=\"openapi\",source=\"{source}\"}}"
        ),
    )
}

fn explain(kubectl: &Kubectl) {
    let out = kubectl.ok(&["explain", "deployment.spec.replicas"]);
    assert!(out.contains("replicas"), "{out}");
}

#[test]
fn explain_fetches_openapi_once_and_again_after_a_crd() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let p = |path: std::path::PathBuf| path.display().to_string();
    let yaml = |name: &str, text: String| support::write_file(dir, name, &text);

    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);

    let sidecar_cfg = yaml(
        "sidecar.yaml",
        format!(
            "instanceId: e2e-sidecar\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\n\
             facade:\n  listen: 127.0.0.1:0\nstore:\n  url: sqlite://{}\n",
            dir.join("sidecar.db").display()
        ),
    );
    let mut sidecar = Proc::start("sidecar", dir, &["sidecar", "--config", &sidecar_cfg]);
    let tunnel = sidecar.listening("sidecar-tunnel");
    let facade = sidecar.listening("sidecar-facade");

    let gateway_cfg = yaml(
        "gateway.yaml",
        format!(
            "gatewayId: e2e-gateway\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
             policy:\n- identities: [\"{}\"]\n  accounts: [e2e, e2e-2]\nupstreams:\n- url: http://{tunnel}\n",
            p(pki.cert("gateway")),
            p(pki.key("gateway")),
            p(pki.ca_cert()),
            dev_agent_identity("agent-1"),
        ),
    );
    let mut gateway = Proc::start("gateway", dir, &["gateway", "--config", &gateway_cfg]);
    let gateway_addr = gateway.listening("gateway");

    // Discovery refreshed every second, so the CRD reaches the sidecar soon.
    let agent_cfg = yaml(
        "agent.yaml",
        format!(
            "agentId: agent-1\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
             cache:\n  discoveryIntervalSeconds: 1\n\
             kubernetes:\n  accounts:\n  - name: e2e\n    kubeconfigFile: {sim}\n  - name: e2e-2\n    kubeconfigFile: {sim}\n",
            gateway_addr.port(),
            p(pki.ca_cert()),
            p(pki.cert("agent-agent-1")),
            p(pki.key("agent-agent-1")),
            sim = sim_kubeconfig.display()
        ),
    );
    let _agent = Proc::start("agent", dir, &["agent", "--config", &agent_cfg]);

    for account in ["e2e", "e2e-2"] {
        wait_for("the accounts to be ready", || {
            let (status, body) = http(facade, "GET", &format!("/v1/accounts/{account}"), &[]);
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (status == 200 && v["online"] == true && v["relay"] == true && v["discovery"] == true)
                .then_some(())
        });
    }
    let facade_kubeconfig = dir.join("facade.kubeconfig");
    write_kubeconfig(&facade_kubeconfig, &format!("http://{facade}/accounts/e2e"));
    let via = Kubectl::new(dir, "facade", &facade_kubeconfig);
    // A second client with its own disk cache: what it is spared comes from
    // the sidecar, not from kubectl's cache directory.
    let other = Kubectl::new(dir, "facade-2", &facade_kubeconfig);

    explain(&via);
    let relayed = openapi_requests(facade, "e2e", "relay");
    assert!(
        relayed > 0,
        "the first explain fetched OpenAPI from the cluster"
    );
    let cached = openapi_requests(facade, "e2e", "cache");
    explain(&via);
    explain(&other);
    assert_eq!(
        openapi_requests(facade, "e2e", "relay"),
        relayed,
        "the later explains were answered from the sidecar's memory"
    );
    assert!(openapi_requests(facade, "e2e", "cache") > cached);

    // Another account of the same cluster fetches through its own agent
    // stream, and the sidecar keeps one copy of each document.
    let bytes = metric(facade, "spinlink_sidecar_openapi_cache_bytes ");
    let documents = metric(facade, "spinlink_sidecar_openapi_cache_documents ");
    assert!(documents > 0 && bytes > 0);
    let second_kubeconfig = dir.join("facade-2.kubeconfig");
    write_kubeconfig(
        &second_kubeconfig,
        &format!("http://{facade}/accounts/e2e-2"),
    );
    explain(&Kubectl::new(dir, "second-account", &second_kubeconfig));
    assert_eq!(openapi_requests(facade, "e2e-2", "relay"), relayed);
    assert_eq!(
        metric(facade, "spinlink_sidecar_openapi_cache_documents "),
        documents
    );
    let shared = metric(facade, "spinlink_sidecar_openapi_cache_bytes ");
    assert!(
        shared - bytes < bytes / 100,
        "{bytes} bytes for one account, {shared} for two: the documents were stored twice"
    );
    eprintln!(
        "OpenAPI cache: {documents} documents, {bytes} bytes for one account, {shared} for two"
    );

    // A CRD is created; the agent's next discovery refresh carries it.
    direct.ok_with_input(&["apply", "-f", "-"], Some(CRD));
    wait_for("the CRD in the facade's discovery", || {
        let (status, body) = http(facade, "GET", "/accounts/e2e/apis", &[]);
        (status == 200 && body.contains("e2e.spinlink.dev")).then_some(())
    });
    explain(&via);
    assert!(
        openapi_requests(facade, "e2e", "relay") > relayed,
        "after the CRD the OpenAPI index was fetched from the cluster again"
    );
    let after = openapi_requests(facade, "e2e", "relay");
    explain(&other);
    assert_eq!(openapi_requests(facade, "e2e", "relay"), after);
}
