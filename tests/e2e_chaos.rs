//! A seeded, bounded chaos test of the whole scaled-out chain, with the real
//! binary and kubectl.
//!
//! Two gateways behind a TCP balancer, three sidecars on one store
//! (PostgreSQL when `SPINLINK_TEST_POSTGRES_URL` is set, in a schema of its
//! own per run; SQLite otherwise), each behind a balancer of its own on the
//! gateways' side (the hop a network between gateway and sidecar pods
//! would be), three agents with one account each, all against one kube-sim
//! that churns configmaps. A seeded RNG picks faults: SIGKILL and restart of
//! a gateway, a sidecar or an agent; every agent connection cut at the
//! agents' balancer, or stalled for a few seconds; the gateways' connections
//! to one sidecar cut, or stalled; and (PostgreSQL) the sidecars' database
//! connections terminated again and again for a few seconds. Only a fault
//! that did something counts (a cut when no connection was open is
//! reported and another is picked). Then churn stops and, within
//! a bound, every account's cache — read through every sidecar's facade,
//! answered from the owner's cache — must equal kube-sim: no object missing,
//! none that kube-sim does not have (phantom), none with another uid or
//! resourceVersion (stale).
//!
//! The suite runs the short form (8 faults that did something). The long
//! form:
//!
//! ```text
//! SPINLINK_CHAOS_FAULTS=200 cargo test -p spinlink --test e2e_chaos -- --nocapture
//! ```
//!
//! (plain `cargo test`: 200 faults outlast nextest's per-test budget).
//! `SPINLINK_CHAOS_SEED=<n>` replays a run's choices (the seed is printed;
//! process timing still varies).

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use spinlink_tls::dev::DevPki;
use support::balancer::Balancer;
use support::scale::{self, Policy, Sidecar};
use support::store::SharedStore;
use support::workload::{self, Objects};
use support::{Kubectl, Proc, Rng, try_http, write_kubeconfig};

/// Faults in the short form.
const DEFAULT_FAULTS: usize = 8;
/// How long the caches may take to match kube-sim after the last fault.
const CONVERGE: Duration = Duration::from_secs(120);
const AGENTS: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillGateway(usize),
    KillSidecar(usize),
    KillAgent(usize),
    CutConnections,
    Stall(Duration),
    /// The gateways' connections to one sidecar.
    CutHop(usize),
    StallHop(usize, Duration),
    DropDatabase(Duration),
}

impl Fault {
    fn pick(rng: &mut Rng, postgres: bool) -> Fault {
        loop {
            return match rng.below(100) {
                0..15 => Fault::KillGateway(rng.below(2)),
                15..35 => Fault::KillSidecar(rng.below(3)),
                35..47 => Fault::KillAgent(rng.below(AGENTS)),
                47..57 => Fault::CutConnections,
                57..65 => Fault::Stall(rng.millis(1000, 4000)),
                65..77 => Fault::CutHop(rng.below(3)),
                77..87 => Fault::StallHop(rng.below(3), rng.millis(1000, 4000)),
                _ if postgres => Fault::DropDatabase(rng.millis(1000, 4000)),
                _ => continue,
            };
        }
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Every running piece and how to start it again.
struct Chain {
    dir: PathBuf,
    sidecars: Vec<Sidecar>,
    /// In front of each sidecar's tunnel: what the gateways dial.
    hops: Vec<Balancer>,
    gateway_yamls: Vec<String>,
    gateways: Vec<(Proc, SocketAddr)>,
    balancer: Balancer,
    agent_yamls: Vec<String>,
    agents: Vec<Proc>,
    starts: usize,
}

impl Chain {
    fn restart_gateway(&mut self, i: usize) {
        self.starts += 1;
        let name = format!("gw-{}.{}", i + 1, self.starts);
        let (proc, addr) = scale::start_gateway(&self.dir, &name, &self.gateway_yamls[i]);
        let old = std::mem::replace(&mut self.gateways[i], (proc, addr)).1;
        let mut backends = self.balancer.backends();
        backends.retain(|b| *b != old);
        backends.push(addr);
        self.balancer.set_backends(&backends);
    }

    fn restart_agent(&mut self, i: usize) {
        self.starts += 1;
        let name = format!("agent-{}.{}", i + 1, self.starts);
        self.agents[i] = scale::start_agent(&self.dir, &name, &self.agent_yamls[i]);
    }

    /// Injects `fault`; says what it did, and whether it did anything.
    fn inject(&mut self, fault: Fault, store: &SharedStore) -> (String, bool) {
        match fault {
            Fault::KillGateway(i) => {
                self.gateways[i].0.kill();
                self.restart_gateway(i);
                (format!("killed and restarted gateway {}", i + 1), true)
            }
            Fault::KillSidecar(i) => {
                self.sidecars[i].kill();
                self.sidecars[i].restart();
                let id = &self.sidecars[i].id;
                (format!("killed and restarted sidecar {id}"), true)
            }
            Fault::KillAgent(i) => {
                self.agents[i].kill();
                self.restart_agent(i);
                (format!("killed and restarted agent {}", i + 1), true)
            }
            Fault::CutConnections => {
                let n = self.balancer.cut(None);
                (format!("cut {n} agent connections at the balancer"), n > 0)
            }
            Fault::Stall(d) => {
                let n = self.balancer.stall(None, d);
                (format!("stalled {n} agent connections for {d:?}"), n > 0)
            }
            Fault::CutHop(i) => {
                let n = self.hops[i].cut(None);
                let id = &self.sidecars[i].id;
                (
                    format!("cut {n} gateway connections to sidecar {id}"),
                    n > 0,
                )
            }
            Fault::StallHop(i, d) => {
                let n = self.hops[i].stall(None, d);
                let id = &self.sidecars[i].id;
                (
                    format!("stalled {n} gateway connections to sidecar {id} for {d:?}"),
                    n > 0,
                )
            }
            Fault::DropDatabase(d) => {
                let n = store.drop_connections(d);
                (
                    format!("terminated {n} database connections over {d:?}"),
                    n > 0,
                )
            }
        }
    }
}

/// What differs between the cluster and a cache, one line per object.
fn diff(want: &Objects, got: &Objects) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (mut missing, mut phantom, mut stale) = (Vec::new(), Vec::new(), Vec::new());
    for (key, w) in want {
        match got.get(key) {
            None => missing.push(format!("{key:?}")),
            Some(g) if g != w => stale.push(format!("{key:?}: cluster {w:?}, cache {g:?}")),
            Some(_) => {}
        }
    }
    for key in got.keys().filter(|k| !want.contains_key(*k)) {
        phantom.push(format!("{key:?}"));
    }
    (missing, phantom, stale)
}

/// LISTs of `account` every sidecar answered from `source` (`cache`,
/// `relay`), by its metrics.
fn lists(sidecars: &[Sidecar], account: &str, source: &str) -> u64 {
    let prefix = format!(
        "spinlink_sidecar_facade_requests_total{{account=\"{account}\",verb=\"list\",source=\"{source}\"}}"
    );
    sidecars
        .iter()
        .filter_map(|s| try_http(s.facade, "GET", "/metrics", &[]))
        .flat_map(|(_, body)| {
            body.lines()
                .filter_map(|l| l.strip_prefix(&prefix)?.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Per account, LISTs answered from (caches, relays).
fn counted(sidecars: &[Sidecar], accounts: &[String]) -> Vec<(u64, u64)> {
    accounts
        .iter()
        .map(|a| (lists(sidecars, a, "cache"), lists(sidecars, a, "relay")))
        .collect()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn seeded_chaos_converges_to_the_cluster() {
    let seed = env_u64("SPINLINK_CHAOS_SEED").unwrap_or_else(now_nanos);
    let faults = env_u64("SPINLINK_CHAOS_FAULTS").map_or(DEFAULT_FAULTS, |n| n as usize);
    eprintln!("chaos: seed {seed} (replay with SPINLINK_CHAOS_SEED={seed}), {faults} faults");
    let mut rng = Rng(seed);
    let started = Instant::now();

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let names: Vec<String> = (1..=AGENTS).map(|i| format!("agent-{i}")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let pki = DevPki::ensure(&dir.join("pki"), &name_refs).unwrap();

    let kubeconfig = dir.join("sim.kubeconfig");
    let stop_churn = dir.join("stop-churn");
    let mut sim = Proc::start(
        "kube-sim",
        dir,
        &[
            "kube-sim",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
            "--churn-interval-millis",
            "50",
            "--churn-seed",
            &seed.to_string(),
            "--churn-stop-file",
            stop_churn.to_str().unwrap(),
        ],
    );
    sim.listening("kube-sim");
    let direct = Kubectl::new(dir, "direct", &kubeconfig);

    let store = SharedStore::new(dir, "spinlink_chaos");
    let sidecars = scale::start_sidecars(dir, &store, &["s1", "s2", "s3"], 3);
    let hops: Vec<Balancer> = sidecars
        .iter()
        .map(|s| Balancer::start(&[s.tunnel], None))
        .collect();
    let tunnels: Vec<_> = hops.iter().map(|h| h.addr).collect();
    let accounts: Vec<String> = (1..=AGENTS).map(|i| format!("acct-{i}")).collect();
    let policy: Policy = names
        .iter()
        .zip(&accounts)
        .map(|(n, a)| (n.clone(), vec![a.clone()]))
        .collect();
    let gateway_yamls: Vec<String> = ["gw-1", "gw-2"]
        .iter()
        .map(|id| scale::gateway_yaml(id, &pki, &policy, &tunnels))
        .collect();
    let gateways: Vec<_> = gateway_yamls
        .iter()
        .enumerate()
        .map(|(i, y)| scale::start_gateway(dir, &format!("gw-{}.0", i + 1), y))
        .collect();
    let balancer = Balancer::start(&gateways.iter().map(|g| g.1).collect::<Vec<_>>(), None);
    let agent_yamls: Vec<String> = names
        .iter()
        .zip(&accounts)
        .map(|(n, a)| scale::agent_yaml(n, &pki, balancer.addr.port(), &[(a, &kubeconfig)]))
        .collect();
    let agents = names
        .iter()
        .zip(&agent_yamls)
        .map(|(n, y)| scale::start_agent(dir, &format!("{n}.0"), y))
        .collect();
    let mut chain = Chain {
        dir: dir.to_owned(),
        sidecars,
        hops,
        gateway_yamls,
        gateways,
        balancer,
        agent_yamls,
        agents,
        starts: 0,
    };
    for a in &accounts {
        support::wait_for(&format!("{a} ready before the chaos"), || {
            chain
                .sidecars
                .iter()
                .any(|s| scale::ready_at(s.facade, a))
                .then_some(())
        });
    }

    let mut last_fault = Instant::now();
    let (mut done, mut idle) = (0, 0);
    while done < faults {
        std::thread::sleep(rng.millis(300, 2500));
        let fault = Fault::pick(&mut rng, store.postgres());
        let (what, effective) = chain.inject(fault, &store);
        last_fault = Instant::now();
        if effective {
            done += 1;
            eprintln!(
                "chaos: fault {done}/{faults} at {:?}: {what}",
                started.elapsed()
            );
        } else {
            idle += 1;
            eprintln!(
                "chaos: at {:?}: {what}: no effect, not counted",
                started.elapsed()
            );
            assert!(
                idle <= faults * 3,
                "chaos: {idle} faults found nothing to act on, against {done} that did"
            );
        }
    }

    std::fs::write(&stop_churn, "").unwrap();
    sim.wait_line("churn: stopped");

    // Every account through every sidecar's facade: the owner answers from
    // its cache, the others forward to it.
    let clients: Vec<(String, usize, Kubectl)> = accounts
        .iter()
        .flat_map(|a| {
            chain.sidecars.iter().enumerate().map(move |(i, s)| {
                let path = dir.join(format!("{a}-via-{}.kubeconfig", s.id));
                write_kubeconfig(&path, &format!("http://{}/accounts/{a}", s.facade));
                (
                    a.clone(),
                    i,
                    Kubectl::new(dir, &format!("{a}-{}", s.id), &path),
                )
            })
        })
        .collect();
    let deadline = Instant::now() + CONVERGE;
    let mut report = String::new();
    let converged = loop {
        let ready = accounts
            .iter()
            .all(|a| chain.sidecars.iter().any(|s| scale::ready_at(s.facade, a)));
        let want = workload::objects(&direct).expect("listing kube-sim directly");
        let before = counted(&chain.sidecars, &accounts);
        report.clear();
        let mut equal = ready;
        if !ready {
            report.push_str("not every account is online and synced on a sidecar\n");
        }
        for (a, i, kubectl) in &clients {
            if !equal {
                break;
            }
            let via = &chain.sidecars[*i].id;
            match workload::objects(kubectl) {
                None => {
                    equal = false;
                    report.push_str(&format!("{a} via {via}: the list failed\n"));
                }
                Some(got) => {
                    let (missing, phantom, stale) = diff(&want, &got);
                    if !(missing.is_empty() && phantom.is_empty() && stale.is_empty()) {
                        equal = false;
                        report.push_str(&format!(
                            "{a} via {via}: {} missing, {} phantom, {} stale\n  missing: {missing:?}\n  phantom: {phantom:?}\n  stale: {stale:?}\n",
                            missing.len(),
                            phantom.len(),
                            stale.len()
                        ));
                    }
                }
            }
        }
        // The lists compared were the caches', not relayed to kube-sim: each
        // kubectl above made one LIST per kind, through every facade.
        let after = counted(&chain.sidecars, &accounts);
        let per_account = (workload::KINDS.split(',').count() * chain.sidecars.len()) as u64;
        let from_caches = before
            .iter()
            .zip(&after)
            .all(|(b, a)| a.0 >= b.0 + per_account && a.1 == b.1);
        if equal && from_caches {
            break Some((last_fault.elapsed(), want.len()));
        }
        if equal {
            report.push_str("some lists were relayed, not answered from a cache\n");
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    match converged {
        Some((after, objects)) => eprintln!(
            "chaos: seed {seed}, {faults} faults ({idle} more without effect, not counted), \
             store {}: every cache equals kube-sim \
             ({objects} objects × {} accounts × {} facades: 0 missing, 0 phantom, 0 stale), \
             converged {after:?} after the last fault; whole run {:?}",
            store.engine(),
            accounts.len(),
            chain.sidecars.len(),
            started.elapsed()
        ),
        None => panic!(
            "chaos: seed {seed}, {faults} faults: the caches did not converge within \
             {CONVERGE:?} after the last fault:\n{report}"
        ),
    }
}
