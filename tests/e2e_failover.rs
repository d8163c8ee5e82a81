//! Failover of each scaled-out component, with the real binary and kubectl.
//! Sidecars share one store: PostgreSQL, in a schema of its own per test,
//! when `SPINLINK_TEST_POSTGRES_URL` is set; a SQLite file otherwise.
//!
//! - A gateway: two behind a TCP balancer (the test kit's stand-in for an
//!   NLB), one sidecar, one agent. The gateway the agent is on is killed;
//!   reads keep being served from the cache throughout, and writes work again
//!   once the agent has reconnected through the balancer to the survivor.
//! - A sidecar: two sharing one store behind one gateway; the owner of the
//!   account is killed and the survivor takes the account over. With three,
//!   kubectl keeps running through both survivors while the owner dies.
//! - A planned move (a drain) hands the cache over warm, and an account that
//!   comes back to a sidecar still holding its cache resumes from the
//!   freshest cache the store's record points at: neither lists again.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use spinlink_tls::dev::{DevPki, dev_agent_identity};
use support::balancer::Balancer;
use support::scale::{self, agent_yaml, gateway_yaml, ready_at, start_agent, start_gateway};
use support::store::SharedStore;
use support::{Kubectl, Proc, http, wait_for, workload, write_kubeconfig};

fn yaml(dir: &Path, name: &str, text: String) -> String {
    support::write_file(dir, name, &text)
}

#[test]
fn a_dead_gateway_is_replaced_through_the_balancer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let p = |path: std::path::PathBuf| path.display().to_string();

    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);

    let sidecar_cfg = yaml(
        dir,
        "sidecar.yaml",
        "instanceId: failover\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\nfacade:\n  listen: 127.0.0.1:0\n"
            .to_owned(),
    );
    let mut sidecar = Proc::start("sidecar", dir, &["sidecar", "--config", &sidecar_cfg]);
    let tunnel = sidecar.listening("sidecar-tunnel");
    let facade = sidecar.listening("sidecar-facade");

    let gateway_yaml = |id: &str| {
        format!(
            "gatewayId: {id}\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
             policy:\n- identities: [\"{}\"]\n  accounts: [prod]\nupstreams:\n- url: http://{tunnel}\n",
            p(pki.cert("gateway")),
            p(pki.key("gateway")),
            p(pki.ca_cert()),
            dev_agent_identity("agent-1"),
        )
    };
    let mut gateways: Vec<Proc> = ["gw-1", "gw-2"]
        .iter()
        .map(|id| {
            let cfg = yaml(dir, &format!("{id}.yaml"), gateway_yaml(id));
            Proc::start(id, dir, &["gateway", "--config", &cfg])
        })
        .collect();
    let addrs: Vec<_> = gateways
        .iter_mut()
        .map(|g| g.listening("gateway"))
        .collect();
    let balancer = Balancer::start(&addrs, None);

    let agent_cfg = yaml(
        dir,
        "agent.yaml",
        format!(
            "agentId: agent-1\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
             reconnect:\n  initialBackoffMillis: 100\n  maxBackoffMillis: 1000\n\
             kubernetes:\n  accounts:\n  - name: prod\n    kubeconfigFile: {}\n",
            balancer.addr.port(),
            p(pki.ca_cert()),
            p(pki.cert("agent-agent-1")),
            p(pki.key("agent-agent-1")),
            sim_kubeconfig.display()
        ),
    );
    let _agent = Proc::start("agent", dir, &["agent", "--config", &agent_cfg]);

    let ready = || {
        let (status, body) = http(facade, "GET", "/v1/accounts/prod", &[]);
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200
            && v["online"] == true
            && v["relay"] == true
            && v["kindsSynced"] == v["kindsTotal"]
            && v["kindsTotal"].as_u64().unwrap_or(0) > 0)
            .then_some(())
    };
    wait_for("account prod to be ready", ready);
    let kubeconfig = dir.join("facade.kubeconfig");
    write_kubeconfig(&kubeconfig, &format!("http://{facade}/accounts/prod"));
    let via = Kubectl::new(dir, "facade", &kubeconfig);
    via.ok_with_input(
        &["apply", "-f", "-"],
        Some(&support::deployment("demo", "before")),
    );

    // Kill the gateway the agent is on.
    let on = wait_for("the agent's connection through the balancer", || {
        addrs.iter().position(|a| balancer.open_to(*a) > 0)
    });
    gateways[on].kill();
    let killed = Instant::now();

    // Reads come from the sidecar's cache: they never stop working.
    let pods = via.ok(&["get", "pods", "-n", "demo", "-o", "name"]);
    assert!(!pods.is_empty());

    // Writes need the agent: they work again once it is back through the
    // surviving gateway.
    let recovered = wait_for("a write through the surviving gateway", || {
        let out = via.run_with_input(
            &["apply", "-f", "-"],
            Some(&support::deployment("demo", "after")),
        );
        out.status.success().then(|| killed.elapsed())
    });
    eprintln!("writes recovered {recovered:?} after the gateway was killed");
    assert!(
        balancer.open_to(addrs[1 - on]) > 0,
        "the agent moved to the other gateway"
    );
    let image = direct.ok(&[
        "get",
        "deployment",
        "after",
        "-n",
        "demo",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, "nginx:1.27");
    // And the cache follows the cluster again.
    direct.ok_with_input(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: after-failover\n  namespace: demo\ndata:\n  k: v\n"),
    );
    wait_for("a change in the cluster through the facade", || {
        via.run_with_input(&["get", "configmap", "after-failover", "-n", "demo"], None)
            .status
            .success()
            .then_some(())
    });
    let _ = Duration::ZERO;
}

/// Two sidecars sharing one store behind one gateway. The sidecar that owns
/// the account is killed (its lease is not released); the gateway takes it
/// out of rotation, the agent's streams move to the survivor, which claims
/// the account once the dead owner's lease expires, lists it again, and
/// serves kubectl — reads and writes — through its own facade.
#[test]
fn a_dead_sidecar_is_replaced_by_a_survivor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let p = |path: std::path::PathBuf| path.display().to_string();

    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);

    let store = SharedStore::new(dir, "spinlink_failover");
    let mut sidecars: Vec<(Proc, std::net::SocketAddr, std::net::SocketAddr)> = ["s1", "s2"]
        .iter()
        .map(|id| {
            let cfg = yaml(
                dir,
                &format!("{id}.yaml"),
                format!(
                    "instanceId: {id}\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\n\
                     facade:\n  listen: 127.0.0.1:0\nstore:\n  url: \"{}\"\n\
                     ownership:\n  leaseSeconds: 2\n{}",
                    store.url(id),
                    scale::peer_yaml(dir),
                ),
            );
            let mut proc = Proc::start(id, dir, &["sidecar", "--config", &cfg]);
            let tunnel = proc.listening("sidecar-tunnel");
            let facade = proc.listening("sidecar-facade");
            (proc, tunnel, facade)
        })
        .collect();

    // Health checks bring instances back here; outlier ejection (streams
    // the cut hop broke) is kept short so that it never outlasts a wait.
    let gateway_cfg = yaml(
        dir,
        "gateway.yaml",
        format!(
            "gatewayId: gw\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
             policy:\n- identities: [\"{}\"]\n  accounts: [prod]\n\
             upstreams:\n- url: http://{}\n- url: http://{}\n\
             upstreamPool:\n  healthCheck:\n    intervalSeconds: 1\n    unhealthyThreshold: 1\n  \
             outlier:\n    ejectionSeconds: 5\n",
            p(pki.cert("gateway")),
            p(pki.key("gateway")),
            p(pki.ca_cert()),
            dev_agent_identity("agent-1"),
            sidecars[0].1,
            sidecars[1].1,
        ),
    );
    let mut gateway = Proc::start("gateway", dir, &["gateway", "--config", &gateway_cfg]);
    let gateway_addr = gateway.listening("gateway");
    let agent_cfg = yaml(
        dir,
        "agent.yaml",
        format!(
            "agentId: agent-1\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
             reconnect:\n  initialBackoffMillis: 100\n  maxBackoffMillis: 1000\n\
             kubernetes:\n  accounts:\n  - name: prod\n    kubeconfigFile: {}\n",
            gateway_addr.port(),
            p(pki.ca_cert()),
            p(pki.cert("agent-agent-1")),
            p(pki.key("agent-agent-1")),
            sim_kubeconfig.display()
        ),
    );
    let _agent = Proc::start("agent", dir, &["agent", "--config", &agent_cfg]);

    let online_at = |facade: std::net::SocketAddr| {
        let (status, body) = http(facade, "GET", "/v1/accounts/prod", &[]);
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200
            && v["online"] == true
            && v["relay"] == true
            && v["kindsTotal"].as_u64().unwrap_or(0) > 0
            && v["kindsSynced"] == v["kindsTotal"])
            .then_some(())
    };
    let owner = wait_for("account prod online on a sidecar", || {
        (0..2).find(|&i| online_at(sidecars[i].2).is_some())
    });
    let survivor = 1 - owner;
    // Through the survivor's facade the request is forwarded to the owner.
    let kubeconfig = dir.join("survivor.kubeconfig");
    write_kubeconfig(
        &kubeconfig,
        &format!("http://{}/accounts/prod", sidecars[survivor].2),
    );
    let via = Kubectl::new(dir, "survivor", &kubeconfig);
    via.ok_with_input(
        &["apply", "-f", "-"],
        Some(&support::deployment("demo", "before")),
    );

    sidecars[owner].0.kill();
    let killed = Instant::now();
    wait_for("the survivor to own and serve prod", || {
        online_at(sidecars[survivor].2)
    });
    let moved = killed.elapsed();
    // A crash is no planned move: the dead owner cannot hand its cache
    // over, so the survivor has the agent list everything again.
    let (_, metrics) = http(sidecars[survivor].2, "GET", "/metrics", &[]);
    assert_eq!(
        counter_sum(
            &metrics,
            "spinlink_sidecar_handovers_total",
            "outcome=\"cold\""
        ),
        1.0,
        "{metrics}"
    );
    assert!(metrics.contains("reason=\"unreachable\""), "{metrics}");
    via.ok_with_input(
        &["apply", "-f", "-"],
        Some(&support::deployment("demo", "after")),
    );
    let names = via.ok(&["get", "deployments", "-n", "demo", "-o", "name"]);
    assert!(
        names.contains("deployment.apps/before") && names.contains("deployment.apps/after"),
        "{names}"
    );
    let image = direct.ok(&[
        "get",
        "deployment",
        "after",
        "-n",
        "demo",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, "nginx:1.27");
    eprintln!("the survivor served prod {moved:?} after its owner was killed");
}

/// The dev PKI for agent `agent-1`, and kube-sim (the demo workload, with
/// `sim_args`) in `dir` with the kubeconfig it wrote.
fn cluster(dir: &Path, sim_args: &[&str]) -> (DevPki, Proc, std::path::PathBuf) {
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let (sim, kubeconfig) = support::kube_sim_with(dir, sim_args);
    (pki, sim, kubeconfig)
}

/// A gateway and an agent serving account `prod` through it.
struct Chain {
    gateway: Proc,
    _agent: Proc,
    /// The agent's admin port.
    admin: SocketAddr,
    /// Which of the sidecars owns `prod`.
    owner: usize,
}

/// Starts gateway `gw` in front of `tunnels` (with `gateway_extra` YAML)
/// and agent `agent-1` serving `prod` from `kubeconfig`, with an admin
/// port, and waits until one of `sidecars` serves `prod`.
fn serve_prod(
    dir: &Path,
    pki: &DevPki,
    kubeconfig: &Path,
    tunnels: &[SocketAddr],
    gateway_extra: &str,
    sidecars: &[scale::Sidecar],
) -> Chain {
    let policy = vec![("agent-1".to_owned(), vec!["prod".to_owned()])];
    let gateway = gateway_yaml("gw", pki, &policy, tunnels) + gateway_extra;
    let (gateway, gateway_addr) = start_gateway(dir, "gw", &gateway);
    let agent = format!(
        "{}admin:\n  listen: 127.0.0.1:0\n",
        agent_yaml("agent-1", pki, gateway_addr.port(), &[("prod", kubeconfig)])
    );
    let mut agent = start_agent(dir, "agent", &agent);
    let admin = agent.listening("agent-admin");
    let owner = wait_for("account prod ready on a sidecar", || {
        (0..sidecars.len()).find(|&i| ready_at(sidecars[i].facade, "prod"))
    });
    Chain {
        gateway,
        _agent: agent,
        admin,
        owner,
    }
}

/// Waits until every kind the agent (admin port `admin`) watches for
/// `prod` is watching and synced at the sidecar whose facade is `facade`.
/// The sidecar counts the kinds whose listing began; the agent starts them
/// as its budget allows.
fn every_kind_synced(admin: SocketAddr, facade: SocketAddr) {
    wait_for("every kind the agent watches synced at the owner", || {
        let status = scale::account(facade, "prod")?;
        let (_, watches) = http(admin, "GET", "/watches", &[]);
        let watches: serde_json::Value = serde_json::from_str(&watches).ok()?;
        let rows = watches["watches"].as_array()?;
        (!rows.is_empty()
            && rows.iter().all(|r| r["phase"] == "watching")
            && status["kindsSynced"] == status["kindsTotal"]
            && status["kindsTotal"].as_u64() == Some(rows.len() as u64))
        .then_some(())
    });
}

/// How many listings the agent (admin port `admin`) made for `prod`.
fn listings(admin: SocketAddr) -> f64 {
    let (status, text) = http(admin, "GET", "/metrics", &[]);
    assert_eq!(status, 200);
    counter_sum(&text, "spinlink_agent_relists_total", "account=\"prod\"")
}

/// The sum of a Prometheus counter's series whose labels contain `with`.
fn counter_sum(metrics: &str, name: &str, with: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `namespace/name@resourceVersion` of every object of `kind`, sorted.
fn versions(kubectl: &Kubectl, kind: &str) -> Vec<String> {
    let out = kubectl.ok(&[
        "get",
        kind,
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}@{.metadata.resourceVersion}{\"\\n\"}{end}",
    ]);
    let mut lines: Vec<String> = out.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

fn config_map(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\ndata:\n  k: \"{value}\"\n"
    )
}

/// A planned move: two sidecars sharing one store, the owner of the account
/// drained (SIGTERM). The survivor loads the owner's cache snapshot and the
/// agent resumes its watches from it: no kind is listed again, and the
/// survivor's cache ends equal to the cluster, changes made during the move
/// included.
#[test]
fn a_drained_sidecar_hands_its_cache_over_without_a_relist() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (pki, _sim, sim_kubeconfig) = cluster(dir, &[]);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    direct.ok_with_input(&["apply", "-f", "-"], Some(&config_map("before", "1")));

    let store = SharedStore::new(dir, "spinlink_drain");
    let mut sidecars = scale::start_sidecars(dir, &store, &["s1", "s2"], 2);
    let tunnels = [sidecars[0].tunnel, sidecars[1].tunnel];
    let chain = serve_prod(dir, &pki, &sim_kubeconfig, &tunnels, "", &sidecars);
    let (admin, owner) = (chain.admin, chain.owner);
    let survivor = 1 - owner;
    every_kind_synced(admin, sidecars[owner].facade);
    let listings = || listings(admin);
    let listed = listings();
    assert!(listed > 0.0, "the first listing is counted");

    // Changes just before the drain (in the old owner's cache, or in the
    // agent's unacknowledged window) and during the move.
    direct.ok_with_input(&["apply", "-f", "-"], Some(&config_map("before", "2")));
    direct.ok_with_input(&["apply", "-f", "-"], Some(&config_map("draining", "1")));
    let draining = Instant::now();
    sidecars[owner].terminate();
    let drained = draining.elapsed();
    direct.ok_with_input(&["apply", "-f", "-"], Some(&config_map("moving", "1")));
    direct.ok(&["delete", "configmap", "draining", "-n", "default"]);
    let facade = sidecars[survivor].facade;
    wait_for("the survivor to own and serve prod", || {
        ready_at(facade, "prod").then_some(())
    });
    eprintln!(
        "the owner drained in {drained:?}; the survivor served prod {:?} after the drain began",
        draining.elapsed()
    );

    let (_, metrics) = http(facade, "GET", "/metrics", &[]);
    assert_eq!(
        counter_sum(
            &metrics,
            "spinlink_sidecar_handovers_total",
            "outcome=\"warm\""
        ),
        1.0,
        "{metrics}"
    );
    let kubeconfig = dir.join("survivor.kubeconfig");
    write_kubeconfig(&kubeconfig, &format!("http://{facade}/accounts/prod"));
    let via = Kubectl::new(dir, "survivor", &kubeconfig);
    for kind in ["configmaps", "namespaces", "serviceaccounts"] {
        wait_for(
            &format!("the survivor's {kind} to equal the cluster's"),
            || (versions(&via, kind) == versions(&direct, kind)).then_some(()),
        );
    }
    let names = versions(&via, "configmaps").join(" ");
    assert!(
        names.contains("default/moving@") && !names.contains("default/draining@"),
        "{names}"
    );
    let (_, metrics) = http(facade, "GET", "/metrics", &[]);
    assert!(
        counter_sum(
            &metrics,
            "spinlink_sidecar_facade_requests_total",
            "verb=\"list\",source=\"cache\""
        ) >= 3.0,
        "the lists were answered from the survivor's cache\n{metrics}"
    );
    // The agent resumed every kind from the snapshot's resourceVersions.
    assert_eq!(listings(), listed, "no kind was listed again");
    let (_, watches) = http(admin, "GET", "/watches", &[]);
    let watches: serde_json::Value = serde_json::from_str(&watches).unwrap();
    let rows = watches["watches"].as_array().expect("a list of watches");
    assert!(!rows.is_empty());
    for row in rows {
        assert_eq!(row["relists"], 0, "{row}");
    }
}

/// The value of a gauge or counter line `name{labels}` in `metrics`.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Whether the gateway with admin port `admin` has `upstream` in rotation.
fn in_rotation(admin: SocketAddr, upstream: SocketAddr) -> bool {
    let Some((200, text)) = support::try_http(admin, "GET", "/metrics", &[]) else {
        return false;
    };
    let series = format!("spinlink_gateway_upstream_available{{upstream=\"http://{upstream}\"}}");
    sample(&text, &series) == Some(1.0)
}

/// An account leaves the sidecar that owns it and comes back while that
/// sidecar still holds its cache (the grace period), twice, with no kind
/// listed again:
///
/// - straight back (its streams there are cut and it reconnects): the cache
///   is where the store's record says, and the agent resumes from it;
/// - after another sidecar served it meanwhile and the cluster moved on by
///   more writes than the API server keeps (kube-sim's watch history is 20
///   events): the store's record shows the cache held is behind, so the
///   sidecar loads the other's snapshot instead, and the agent resumes from
///   that. Resuming from the older cache would have made every kind that
///   changed list again (410 Gone).
#[test]
fn an_account_back_on_a_sidecar_still_holding_its_cache_resumes_without_a_listing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (pki, _sim, sim_kubeconfig) = cluster(dir, &["--watch-history", "20"]);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    let store = SharedStore::new(dir, "spinlink_back");
    let mut sidecars = scale::start_sidecars(dir, &store, &["s1", "s2"], 2);
    // Each tunnel behind a balancer of its own, so a sidecar can drop out
    // of the gateway's reach while it keeps running.
    let hops = [
        Balancer::start(&[sidecars[0].tunnel], None),
        Balancer::start(&[sidecars[1].tunnel], None),
    ];
    let mut chain = serve_prod(
        dir,
        &pki,
        &sim_kubeconfig,
        &[hops[0].addr, hops[1].addr],
        "admin:\n  listen: 127.0.0.1:0\n",
        &sidecars,
    );
    let gateway_admin = chain.gateway.listening("gateway-admin");
    let (admin, owner) = (chain.admin, chain.owner);
    let other = 1 - owner;
    every_kind_synced(admin, sidecars[owner].facade);
    let listed = listings(admin);
    let facades = [sidecars[0].facade, sidecars[1].facade];
    let handovers = |i: usize, labels: &str| {
        let (_, text) = http(facades[i], "GET", "/metrics", &[]);
        sample(
            &text,
            &format!("spinlink_sidecar_handovers_total{{{labels}}}"),
        )
        .unwrap_or(0.0)
    };

    // Straight back: the owner ends the agent's streams; they reconnect.
    let identity = dev_agent_identity("agent-1")
        .replace(':', "%3A")
        .replace('/', "%2F");
    let (status, body) = http(
        sidecars[owner].facade,
        "POST",
        &format!("/v1/agents/{identity}/disconnect"),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    wait_for("prod back at its owner, resumed from its cache", || {
        (ready_at(sidecars[owner].facade, "prod")
            && handovers(owner, "outcome=\"resumed\",reason=\"current\"") == 1.0)
            .then_some(())
    });
    assert_eq!(listings(admin), listed, "nothing was listed again");

    // Away: the owner drops out of the gateway's reach, still running with
    // the account's cache; the other sidecar takes it over warm.
    hops[owner].set_backends(&[]);
    hops[owner].cut(None);
    wait_for("the other sidecar to serve prod", || {
        ready_at(sidecars[other].facade, "prod").then_some(())
    });
    // The cluster moves on by more than kube-sim keeps for watches.
    for round in 0..25 {
        direct.ok_with_input(
            &["apply", "-f", "-"],
            Some(&config_map("moving", &round.to_string())),
        );
    }
    let via_other = {
        let path = dir.join("other.kubeconfig");
        write_kubeconfig(
            &path,
            &format!("http://{}/accounts/prod", sidecars[other].facade),
        );
        Kubectl::new(dir, "other", &path)
    };
    wait_for("the other sidecar's cache to follow the cluster", || {
        (versions(&via_other, "configmaps") == versions(&direct, "configmaps")).then_some(())
    });
    assert_eq!(listings(admin), listed, "the move was warm");

    // Back: the owner is in reach again; the other drains.
    hops[owner].set_backends(&[sidecars[owner].tunnel]);
    wait_for("the owner back in the gateway's rotation", || {
        in_rotation(gateway_admin, hops[owner].addr).then_some(())
    });
    sidecars[other].terminate();
    wait_for("prod back at its first owner", || {
        ready_at(sidecars[owner].facade, "prod").then_some(())
    });
    let via_owner = {
        let path = dir.join("owner.kubeconfig");
        write_kubeconfig(
            &path,
            &format!("http://{}/accounts/prod", sidecars[owner].facade),
        );
        Kubectl::new(dir, "owner", &path)
    };
    for kind in ["configmaps", "namespaces", "serviceaccounts"] {
        wait_for(
            &format!("the owner's {kind} to equal the cluster's"),
            || (versions(&via_owner, kind) == versions(&direct, kind)).then_some(()),
        );
    }
    assert_eq!(listings(admin), listed, "no kind was listed again");
    let (_, watches) = http(admin, "GET", "/watches", &[]);
    let watches: serde_json::Value = serde_json::from_str(&watches).unwrap();
    for row in watches["watches"].as_array().expect("a list of watches") {
        assert_eq!(row["relists"], 0, "{row}");
        assert_eq!(row["gone"], 0, "{row}");
    }
    assert_eq!(
        handovers(owner, "outcome=\"warm\",reason=\"fresher\""),
        1.0,
        "the owner's older cache was replaced by the other's snapshot"
    );
}

/// Three sidecars sharing one store behind one gateway; kubectl runs a
/// steady loop of reads and writes through each of the two sidecars that do
/// not own the account (each request forwarded one hop to the owner). The
/// owner is killed (SIGKILL: its lease is not released, its cache cannot be
/// handed over). Until a survivor owns the account the sidecars answer 503
/// with `Retry-After`, which kubectl retries; no kubectl command may fail,
/// through either survivor, and one of them keeps forwarding to the new
/// owner. (Not covered, and not retried by kubectl: a response the dead
/// owner was still streaming when it died is cut. The loop's requests take
/// milliseconds; none has been caught in one.)
#[test]
fn a_dead_sidecar_fails_no_kubectl_command_through_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (pki, _sim, sim_kubeconfig) = cluster(dir, &[]);
    let store = SharedStore::new(dir, "spinlink_dead");
    let mut sidecars = scale::start_sidecars(dir, &store, &["s1", "s2", "s3"], 3);
    let tunnels: Vec<_> = sidecars.iter().map(|s| s.tunnel).collect();
    let chain = serve_prod(dir, &pki, &sim_kubeconfig, &tunnels, "", &sidecars);
    let owner = chain.owner;
    let survivors: Vec<usize> = (0..3).filter(|&i| i != owner).collect();
    eprintln!("prod is owned by {}", sidecars[owner].id);

    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = survivors
        .iter()
        .map(|&i| {
            let path = dir.join(format!("via-{}.kubeconfig", sidecars[i].id));
            write_kubeconfig(
                &path,
                &format!("http://{}/accounts/prod", sidecars[i].facade),
            );
            let kubectl = Kubectl::new(dir, &format!("via-{}", sidecars[i].id), &path);
            // Warms kubectl's discovery cache; creates what the loop changes.
            kubectl.ok_with_input(&["apply", "-f", "-"], Some(&workload::configmap(0)));
            let rounds = Arc::new(AtomicUsize::new(0));
            let thread = {
                let (stop, rounds) = (stop.clone(), rounds.clone());
                std::thread::spawn(move || workload::run(&kubectl, &stop, &rounds))
            };
            (i, rounds, thread)
        })
        .collect();
    let progress = |what: &str, n: usize| {
        let from: Vec<usize> = loops
            .iter()
            .map(|(_, r, _)| r.load(Ordering::Relaxed))
            .collect();
        wait_for(
            &format!("{n} rounds through each survivor after {what}"),
            || {
                loops
                    .iter()
                    .zip(&from)
                    .all(|((_, r, t), f)| r.load(Ordering::Relaxed) >= f + n || t.is_finished())
                    .then_some(())
            },
        );
    };
    progress("the start", 2);
    let facades: Vec<SocketAddr> = sidecars.iter().map(|s| s.facade).collect();
    let ids: Vec<String> = sidecars.iter().map(|s| s.id.clone()).collect();
    let forwarded = |i: usize| {
        let (_, text) = http(facades[i], "GET", "/metrics", &[]);
        counter_sum(
            &text,
            "spinlink_sidecar_facade_requests_total",
            "verb=\"forward\"",
        )
    };
    let before: Vec<f64> = survivors.iter().map(|&i| forwarded(i)).collect();
    assert!(before.iter().all(|n| *n > 0.0), "both loops were forwarded");

    sidecars[owner].kill();
    let killed = Instant::now();
    let new_owner = wait_for("a survivor to own and serve prod", || {
        survivors
            .iter()
            .copied()
            .find(|&i| ready_at(sidecars[i].facade, "prod"))
    });
    let moved = killed.elapsed();
    progress("the new owner took over", 3);
    stop.store(true, Ordering::Relaxed);
    let results: Vec<(usize, workload::Workload)> = loops
        .into_iter()
        .map(|(i, _, t)| (i, t.join().expect("a workload thread")))
        .collect();
    for (i, w) in &results {
        eprintln!(
            "through {}: {} rounds, {} kubectl commands, {} failed",
            ids[*i],
            w.rounds,
            w.commands,
            w.failures.len()
        );
    }
    eprintln!(
        "{} owns prod {moved:?} after {} was killed",
        ids[new_owner], ids[owner]
    );
    let failures: Vec<String> = results
        .iter()
        .flat_map(|(i, w)| {
            let id = &ids[*i];
            w.failures.iter().map(move |f| format!("through {id}: {f}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "kubectl commands failed while the owner died:\n{}",
        failures.join("\n")
    );
    // kubectl's version dispatcher reads `/version` from the disk cache each
    // loop's kubectl kept through the failover; what it was answered while
    // prod moved (a 503) must not be taken from there now: it runs the
    // kubectl a fresh cache picks, not its fallback (a cached 503 cost every
    // later command the dispatcher's 5 s and picked the fallback).
    let version = |kubectl: &Kubectl| -> serde_json::Value {
        serde_json::from_str(&kubectl.ok(&["version", "-o", "json"])).unwrap()
    };
    let fresh = Kubectl::new(
        dir,
        "fresh",
        &dir.join(format!("via-{}.kubeconfig", ids[new_owner])),
    );
    let picked = version(&fresh)["clientVersion"]["gitVersion"].clone();
    for &i in &survivors {
        let id = &ids[i];
        let kubectl = Kubectl::new(
            dir,
            &format!("via-{id}"),
            &dir.join(format!("via-{id}.kubeconfig")),
        );
        assert_eq!(
            version(&kubectl)["clientVersion"]["gitVersion"],
            picked,
            "the kubectl the dispatcher picked through {id}"
        );
    }
    // The survivor that did not become the owner forwarded throughout.
    let still = survivors.iter().position(|&i| i != new_owner).unwrap();
    assert!(
        forwarded(survivors[still]) > before[still],
        "{} forwarded to the new owner",
        ids[survivors[still]]
    );
}
