//! A cluster whose API server stops answering its agent: kubectl through
//! spinlink still reads from the cache, and says — in a Warning it prints —
//! that the answer may be stale and since when; once the API server is back
//! the warning goes.

mod support;

use support::{Kubectl, Proc};

const STALE: &str = "has not reached the cluster's API server since";

/// kube-sim on `port` (0: any), so that it can come back where it was; and
/// its port.
fn kube_sim_at(dir: &std::path::Path, port: u16, name: &str) -> (Proc, u16) {
    let listen = format!("127.0.0.1:{port}");
    let kubeconfig = dir.join("sim.kubeconfig");
    let mut sim = Proc::start(
        name,
        dir,
        &[
            "kube-sim",
            "--listen",
            &listen,
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
        ],
    );
    let port = sim.listening("kube-sim").port();
    (sim, port)
}

/// `kubectl get pods -n demo` through the facade: it succeeds, and its
/// stderr.
fn read(k: &Kubectl) -> Option<String> {
    let out = k.run_with_input(&["get", "pods", "-n", "demo"], None);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn reads_while_the_api_server_is_down_say_they_may_be_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Its port is the one it was given, not one free a moment ago.
    let (mut sim, port) = kube_sim_at(dir, 0, "kube-sim");
    let state = dir.join("state");
    let _dev = support::dev(dir, &state, Some(&dir.join("sim.kubeconfig")));
    let k = Kubectl::new(dir, "facade", &state.join("kubeconfig"));
    let fresh = support::wait_for("a first read", || read(&k));
    assert!(!fresh.contains(STALE), "{fresh}");

    // The API server goes away: reads still answer, with the warning.
    sim.kill();
    let stale = support::wait_for("a read marked stale", || {
        read(&k).filter(|stderr| stderr.contains(STALE))
    });
    assert!(
        stale.contains("Warning:") && stale.contains("may be stale"),
        "{stale}"
    );

    // It comes back: the warning goes.
    let _sim = kube_sim_at(dir, port, "kube-sim-again");
    support::wait_for("a read without the warning", || {
        read(&k).filter(|stderr| !stderr.contains(STALE))
    });
}
