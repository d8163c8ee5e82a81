//! Rolling restarts with zero failed requests, with the real binary and
//! kubectl.
//!
//! Two gateways behind a TCP balancer (the test kit's NLB), three sidecars on
//! one shared store (PostgreSQL in a schema of its own when
//! `SPINLINK_TEST_POSTGRES_URL` is set, SQLite otherwise), one agent with
//! account `prod`. kubectl reaches the
//! sidecars through a second balancer in front of their facades — in a
//! cluster, the Kubernetes Service Clouddriver's kubeconfig names. While a
//! background thread runs a steady, bounded loop of reads (`get pods -o
//! json`, `get deploy`) and writes (`apply` of a ConfigMap with a changing
//! value, `scale`), every gateway and then every sidecar is restarted the way
//! a Deployment's rolling update does it: the new gateway process comes up
//! and joins the balancer before the old one gets SIGTERM (it sends the
//! agent `Reconnect` and GOAWAY; the agent opens its new connection before
//! letting the old one go); a sidecar gets SIGTERM, drains, and starts again
//! on the same addresses. No kubectl command may fail, and kube-sim must end
//! in the state the writes made.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use spinlink_tls::dev::DevPki;
use support::balancer::Balancer;
use support::scale::{self, Sidecar};
use support::store::SharedStore;
use support::workload::{self, configmap};
use support::{Kubectl, wait_for, write_kubeconfig};

#[test]
fn rolling_restarts_of_gateways_and_sidecars_fail_no_request() {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);

    let store = SharedStore::new(dir, "spinlink_rolling");
    let mut sidecars = scale::start_sidecars(dir, &store, &["s1", "s2", "s3"], 3);
    let tunnels: Vec<_> = sidecars.iter().map(|s| s.tunnel).collect();
    let facades: Vec<_> = sidecars.iter().map(|s| s.facade).collect();
    let policy = vec![("agent-1".to_owned(), vec!["prod".to_owned()])];

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
    // kubectl's Service: every sidecar's facade; a restarting one refuses
    // connections and is skipped.
    let service = Balancer::start(&facades, None);
    let ready = |sidecars: &[Sidecar]| {
        wait_for("account prod ready on a sidecar", || {
            sidecars
                .iter()
                .position(|s| scale::ready_at(s.facade, "prod"))
        })
    };
    let owner = ready(&sidecars);
    eprintln!("prod is owned by {}", sidecars[owner].id);

    let kubeconfig = dir.join("service.kubeconfig");
    write_kubeconfig(
        &kubeconfig,
        &format!("http://{}/accounts/prod", service.addr),
    );
    let client = Kubectl::new(dir, "client", &kubeconfig);
    // Warm kubectl's discovery cache and create what the loop changes.
    client.ok_with_input(&["apply", "-f", "-"], Some(&configmap(0)));

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let runner = {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        std::thread::spawn(move || workload::run(&client, &stop, &rounds))
    };
    // Each step waits for the loop to get a few rounds done, so every
    // restart happens under load and the next one only once it has settled.
    let progress = |what: &str| {
        let from = rounds.load(Ordering::Relaxed);
        wait_for(&format!("two workload rounds after {what}"), || {
            (rounds.load(Ordering::Relaxed) >= from + 2 || runner.is_finished()).then_some(())
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
        assert_eq!(balancer.open_to(old_addr), 0, "the agent left {id}");
        ready(&sidecars);
        progress(&format!("restarting {id}"));
    }

    for i in 0..sidecars.len() {
        let t = Instant::now();
        sidecars[i].terminate();
        eprintln!("{} drained in {:?}", sidecars[i].id, t.elapsed());
        sidecars[i].restart();
        let owner = ready(&sidecars);
        eprintln!(
            "{} restarted; prod is owned by {}",
            sidecars[i].id, sidecars[owner].id
        );
        progress(&format!("restarting {}", sidecars[i].id));
    }

    stop.store(true, Ordering::Relaxed);
    let w = runner.join().expect("the workload thread");
    eprintln!(
        "{} rounds, {} kubectl commands, {} failed, in {:?}",
        w.rounds,
        w.commands,
        w.failures.len(),
        started.elapsed()
    );
    assert!(
        w.failures.is_empty(),
        "kubectl commands failed during the rolling restarts:\n{}",
        w.failures.join("\n")
    );
    assert!(
        w.rounds >= 10,
        "the workload kept running ({} rounds)",
        w.rounds
    );

    // kube-sim holds what the last writes wrote.
    let (round, replicas) = w.last.expect("at least one round wrote");
    let value = direct.ok(&[
        "get",
        "configmap",
        "rolling",
        "-n",
        "demo",
        "-o",
        "jsonpath={.data.round}",
    ]);
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
    assert_eq!(scaled, replicas.to_string());
}
