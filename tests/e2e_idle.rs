//! An agent behind a load balancer that cuts idle connections, as an NLB
//! does after 350 s: application heartbeats on the cache streams keep the
//! connection from ever looking idle. The test kit's balancer cuts after
//! 3 s here; one agent heartbeats every second, a control agent (same
//! balancer, heartbeats and HTTP/2 PINGs slower than the cut) shows the cut
//! is real. Over the same window the first keeps its one connection and the
//! control reconnects.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use spinlink_tls::dev::{DevPki, dev_agent_identity};
use support::balancer::Balancer;
use support::{Proc, http, try_http, wait_for};

/// The balancer's idle cut.
const IDLE_CUT: Duration = Duration::from_secs(3);
/// How long the connections are watched: a few idle cuts.
const WINDOW: Duration = Duration::from_secs(10);

fn yaml(dir: &Path, name: &str, text: String) -> String {
    support::write_file(dir, name, &text)
}

/// `spinlink_agent_connections_total` from the agent's admin port.
fn connections(admin: SocketAddr) -> Option<u64> {
    let (status, body) = try_http(admin, "GET", "/metrics", &[])?;
    (status == 200).then_some(())?;
    body.lines()
        .find(|l| l.starts_with("spinlink_agent_connections_total "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

#[test]
fn heartbeats_keep_an_agent_connection_through_an_idle_cutting_balancer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["steady", "quiet"]).unwrap();
    let p = |path: std::path::PathBuf| path.display().to_string();

    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let sidecar_cfg = yaml(
        dir,
        "sidecar.yaml",
        "instanceId: idle\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\nfacade:\n  listen: 127.0.0.1:0\n"
            .to_owned(),
    );
    let mut sidecar = Proc::start("sidecar", dir, &["sidecar", "--config", &sidecar_cfg]);
    let tunnel = sidecar.listening("sidecar-tunnel");
    let facade = sidecar.listening("sidecar-facade");
    let gateway_cfg = yaml(
        dir,
        "gateway.yaml",
        format!(
            "gatewayId: gw\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
             policy:\n- identities: [\"{}\"]\n  accounts: [steady]\n- identities: [\"{}\"]\n  accounts: [quiet]\n\
             upstreams:\n- url: http://{tunnel}\n",
            p(pki.cert("gateway")),
            p(pki.key("gateway")),
            p(pki.ca_cert()),
            dev_agent_identity("steady"),
            dev_agent_identity("quiet"),
        ),
    );
    let mut gateway = Proc::start("gateway", dir, &["gateway", "--config", &gateway_cfg]);
    let gateway_addr = gateway.listening("gateway");
    let balancer = Balancer::start(&[gateway_addr], Some(IDLE_CUT));

    let agent = |id: &str, heartbeat: u64, ping: u64| {
        let cfg = yaml(
            dir,
            &format!("agent-{id}.yaml"),
            format!(
                "agentId: {id}\nheartbeatSeconds: {heartbeat}\nadmin:\n  listen: 127.0.0.1:0\n\
                 gateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
                 \x20 keepaliveIntervalSeconds: {ping}\n\
                 reconnect:\n  initialBackoffMillis: 100\n  maxBackoffMillis: 500\n\
                 kubernetes:\n  accounts:\n  - name: {id}\n    kubeconfigFile: {}\n    kinds: [ConfigMap]\n",
                balancer.addr.port(),
                p(pki.ca_cert()),
                p(pki.cert(&format!("agent-{id}"))),
                p(pki.key(&format!("agent-{id}"))),
                sim_kubeconfig.display()
            ),
        );
        let mut proc = Proc::start(id, dir, &["agent", "--config", &cfg]);
        let admin = proc.listening("agent-admin");
        (proc, admin)
    };
    // Heartbeats three times per idle cut; the control's heartbeats and
    // PINGs come long after it.
    let (_steady, steady_admin) = agent("steady", 1, 60);
    let (_quiet, quiet_admin) = agent("quiet", 60, 60);
    for account in ["steady", "quiet"] {
        wait_for(&format!("account {account} to be online"), || {
            let (status, body) = http(facade, "GET", &format!("/v1/accounts/{account}"), &[]);
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (status == 200 && v["online"] == true && v["kindsSynced"] == v["kindsTotal"])
                .then_some(())
        });
    }
    let steady_before = wait_for("the steady agent's metrics", || connections(steady_admin));
    let quiet_before = wait_for("the quiet agent's metrics", || connections(quiet_admin));

    // Nothing to synchronise on: the point is what does not happen while
    // time passes.
    std::thread::sleep(WINDOW);

    let steady_after = wait_for("the steady agent's metrics", || connections(steady_admin));
    let quiet_after = wait_for("the quiet agent's metrics", || connections(quiet_admin));
    assert!(
        quiet_after > quiet_before,
        "the control agent was never cut ({quiet_before} -> {quiet_after} connections): \
         the balancer's idle cut is not exercised"
    );
    assert_eq!(
        steady_after, steady_before,
        "the heartbeating agent's connection was cut as idle"
    );
}
