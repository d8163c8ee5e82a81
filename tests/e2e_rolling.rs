//! Rolling restarts with zero failed requests, with the real binary and
//! kubectl, and agents of two releases.
//!
//! Two gateways behind a TCP balancer (the test kit's NLB), three sidecars on
//! one shared store (PostgreSQL in a schema of its own when
//! `SPINLINK_TEST_POSTGRES_URL` is set, SQLite otherwise), and two agents
//! dialling the balancer: today's agent with account `prod` (kube-sim behind
//! it), and an agent of the last release with account `released` — written
//! by hand, speaking only the released `spinlink.v1`
//! (`support/released_agent.rs`), serving ConfigMaps of a cluster it holds
//! in memory. kubectl reaches the sidecars through a second balancer in
//! front of their facades — in a cluster, the Kubernetes Service
//! Clouddriver's kubeconfig names. While two background threads run steady,
//! bounded loops — on `prod` reads (`get pods -o json`, `get deploy`) and
//! writes (`apply` of a ConfigMap with a changing value, `scale`); on
//! `released` reads from the cache (`get configmaps`, `get configmap -o
//! jsonpath`) and a relayed write (`patch` of a ConfigMap) — every gateway
//! and then every sidecar is restarted the way a Deployment's rolling update
//! does it: the new gateway process comes up and joins the balancer before
//! the old one gets SIGTERM (it sends the agents `Reconnect` and GOAWAY;
//! each agent opens its new connection before letting the old one go); a
//! sidecar gets SIGTERM, drains, and starts again on the same addresses. No
//! kubectl command may fail, and each cluster must end in the state the
//! writes made, the released agent's as its account's cache shows it too.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use spinlink_tls::dev::DevPki;
use support::balancer::Balancer;
use support::released_agent::{Cluster, ReleasedAgent, Stats};
use support::scale::{self, Sidecar};
use support::store::SharedStore;
use support::workload::{self, Step, Workload, configmap};
use support::{Kubectl, wait_for, write_kubeconfig};

/// The account of the agent of the last release, and its agent id.
const RELEASED: &str = "released";
const RELEASED_AGENT: &str = "agent-released";

/// The value ConfigMap `demo/rolling` holds: the round that wrote it.
const READ_ROUND: [&str; 7] = [
    "get",
    "configmap",
    "rolling",
    "-n",
    "demo",
    "-o",
    "jsonpath={.data.round}",
];

/// A round on the released agent's account: a list and a read of one
/// object, both from the cache, and a merge patch of ConfigMap `rolling`,
/// relayed to the agent.
fn released_round(round: usize) -> Vec<Step> {
    let patch = format!(r#"{{"data":{{"round":"{round}"}}}}"#);
    vec![
        Step::read(&["get", "configmaps", "-n", "demo"]),
        Step::write(
            &[
                "patch",
                "configmap",
                "rolling",
                "-n",
                "demo",
                "--type=merge",
                "-p",
                &patch,
            ],
            None,
        ),
        Step::read(&READ_ROUND),
    ]
}

/// A kubectl loop on its own thread and the rounds it has completed.
struct Loop {
    rounds: Arc<AtomicUsize>,
    thread: JoinHandle<Workload>,
}

impl Loop {
    fn start(kubectl: Kubectl, stop: &Arc<AtomicBool>, round: fn(usize) -> Vec<Step>) -> Loop {
        let rounds = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, rounds) = (stop.clone(), rounds.clone());
            std::thread::spawn(move || workload::run_rounds(&kubectl, &stop, &rounds, round))
        };
        Loop { rounds, thread }
    }

    /// Stops waiting once it has done `n` more rounds than `from` (or ended).
    fn done(&self, from: usize, n: usize) -> bool {
        self.rounds.load(Ordering::Relaxed) >= from + n || self.thread.is_finished()
    }

    /// Its results, which must hold no failed command.
    fn finish(self, account: &str) -> Workload {
        let w = self.thread.join().expect("the workload thread");
        eprintln!(
            "{account}: {} rounds, {} kubectl commands, {} failed",
            w.rounds,
            w.commands,
            w.failures.len(),
        );
        assert!(
            w.failures.is_empty(),
            "kubectl commands on {account} failed during the rolling restarts:\n{}",
            w.failures.join("\n")
        );
        assert!(
            w.rounds >= 10,
            "the workload on {account} kept running ({} rounds)",
            w.rounds
        );
        w
    }
}

/// Which sidecar `account` is ready on (its owner), waiting for one.
fn ready(sidecars: &[Sidecar], account: &str) -> usize {
    wait_for(&format!("account {account} ready on a sidecar"), || {
        sidecars
            .iter()
            .position(|s| scale::ready_at(s.facade, account))
    })
}

/// A kubectl for `account` through the facades' balancer at `service`.
fn kubectl_for(dir: &std::path::Path, service: SocketAddr, account: &str) -> Kubectl {
    let kubeconfig = dir.join(format!("{account}.kubeconfig"));
    write_kubeconfig(&kubeconfig, &format!("http://{service}/accounts/{account}"));
    Kubectl::new(dir, account, &kubeconfig)
}

#[test]
fn rolling_restarts_of_gateways_and_sidecars_fail_no_request() {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1", RELEASED_AGENT]).unwrap();
    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);

    let store = SharedStore::new(dir, "spinlink_rolling");
    let mut sidecars = scale::start_sidecars(dir, &store, &["s1", "s2", "s3"], 3);
    let tunnels: Vec<_> = sidecars.iter().map(|s| s.tunnel).collect();
    let facades: Vec<_> = sidecars.iter().map(|s| s.facade).collect();
    let policy = vec![
        ("agent-1".to_owned(), vec!["prod".to_owned()]),
        (RELEASED_AGENT.to_owned(), vec![RELEASED.to_owned()]),
    ];

    let mut gateways: Vec<_> = ["gw-1", "gw-2"]
        .iter()
        .map(|id| {
            let yaml = scale::gateway_yaml(id, &pki, &policy, &tunnels);
            scale::start_gateway(dir, &format!("{id}.1"), &yaml)
        })
        .collect();
    let balancer = Balancer::start(&gateways.iter().map(|g| g.1).collect::<Vec<_>>(), None);
    let _agent = scale::start_agent(
        dir,
        "agent-1",
        &scale::agent_yaml(
            "agent-1",
            &pki,
            balancer.addr.port(),
            &[("prod", &sim_kubeconfig)],
        ),
    );
    let cluster = Cluster::new(&[("rolling", &[("round", "0")])]);
    let released = ReleasedAgent::new(&pki, RELEASED_AGENT, RELEASED, cluster);
    let released_run = released.spawn(balancer.addr.port());
    // kubectl's Service: every sidecar's facade; a restarting one refuses
    // connections and is skipped.
    let service = Balancer::start(&facades, None);
    let owners = |sidecars: &[Sidecar]| {
        let prod = ready(sidecars, "prod");
        let old = ready(sidecars, RELEASED);
        format!(
            "prod is owned by {}, {RELEASED} by {}",
            sidecars[prod].id, sidecars[old].id
        )
    };
    eprintln!("{}", owners(&sidecars));

    let client = kubectl_for(dir, service.addr, "prod");
    let released_client = kubectl_for(dir, service.addr, RELEASED);
    // Warm kubectl's discovery caches and create what the prod loop changes.
    client.ok_with_input(&["apply", "-f", "-"], Some(&configmap(0)));
    released_client.ok(&["get", "configmaps", "-n", "demo"]);

    let stop = Arc::new(AtomicBool::new(false));
    let loops = [
        Loop::start(client, &stop, workload::demo_round),
        Loop::start(released_client, &stop, released_round),
    ];
    // Each step waits for both loops to get a few rounds done, so every
    // restart happens under load and the next one only once it has settled.
    let progress = |what: &str| {
        let from: Vec<usize> = loops
            .iter()
            .map(|l| l.rounds.load(Ordering::Relaxed))
            .collect();
        wait_for(&format!("two workload rounds after {what}"), || {
            loops
                .iter()
                .zip(&from)
                .all(|(l, from)| l.done(*from, 2))
                .then_some(())
        });
    };
    progress("the start");

    for (i, gateway) in gateways.iter_mut().enumerate() {
        let id = format!("gw-{}", i + 1);
        let yaml = scale::gateway_yaml(&id, &pki, &policy, &tunnels);
        // Surge first, as a Deployment's rolling update does: the new
        // gateway is in the balancer before the old one drains.
        let (new, addr) = scale::start_gateway(dir, &format!("{id}.2"), &yaml);
        let mut backends = balancer.backends();
        backends.retain(|b| *b != gateway.1);
        backends.push(addr);
        balancer.set_backends(&backends);
        let (mut old, old_addr) = std::mem::replace(gateway, (new, addr));
        let t = Instant::now();
        let status = old.terminate();
        eprintln!("{id} drained in {:?} ({status})", t.elapsed());
        assert_eq!(balancer.open_to(old_addr), 0, "the agents left {id}");
        eprintln!("{}", owners(&sidecars));
        progress(&format!("restarting {id}"));
    }

    for i in 0..sidecars.len() {
        let t = Instant::now();
        sidecars[i].terminate();
        eprintln!("{} drained in {:?}", sidecars[i].id, t.elapsed());
        sidecars[i].restart();
        eprintln!("{} restarted; {}", sidecars[i].id, owners(&sidecars));
        progress(&format!("restarting {}", sidecars[i].id));
    }

    stop.store(true, Ordering::Relaxed);
    let [prod, old] = loops;
    let (prod, old) = (prod.finish("prod"), old.finish(RELEASED));
    let stats = &released.stats;
    eprintln!("released agent: {stats:?}; all in {:?}", started.elapsed());

    // kube-sim holds what the last writes wrote.
    let round = prod.last.expect("at least one round wrote");
    let value = direct.ok(&READ_ROUND);
    assert_eq!(value, round.to_string());
    let scaled = direct.ok(&[
        "get",
        "deployment",
        "web",
        "-n",
        "demo",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert_eq!(scaled, workload::replicas(round).to_string());

    // So does the released agent's cluster, and its account's cache (the
    // write's answer and its watch event), read through the facades.
    let round = old.last.expect("at least one round wrote").to_string();
    assert_eq!(
        released.cluster.data("rolling", "round"),
        Some(round.clone())
    );
    let reader = kubectl_for(dir, service.addr, RELEASED);
    let cached = reader.ok(&READ_ROUND);
    assert_eq!(cached, round);
    // Its gateway (one of the two drained) asked it to move, and every such
    // move was made before the old connection went — also when the new
    // gateway sent its streams to another sidecar, which waited for the old
    // one to let the account go — and the sidecars resumed its cache
    // streams rather than have it list again.
    assert!(Stats::get(&stats.reconnects) >= 1, "{stats:?}");
    assert_eq!(
        Stats::get(&stats.moves),
        Stats::get(&stats.reconnects),
        "{stats:?}"
    );
    assert!(Stats::get(&stats.resumed) >= 1, "{stats:?}");
    drop(released_run);
}
