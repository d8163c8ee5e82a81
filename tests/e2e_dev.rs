//! `spinlink dev` as a newcomer runs it: one process, mTLS on every hop, the
//! simulated cluster behind it, and kubectl through the kubeconfig it writes.

mod support;

use support::{Kubectl, Proc, http};

#[test]
fn dev_serves_kubectl_through_the_whole_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let state = dir.join("state");
    let mut dev = Proc::start(
        "dev",
        dir,
        &[
            "dev",
            "--state-dir",
            state.to_str().unwrap(),
            "--gateway-listen",
            "127.0.0.1:0",
            "--facade-listen",
            "127.0.0.1:0",
        ],
    );
    let ready = dev.wait_line("ready: ");
    let kubeconfig = state.join("kubeconfig");
    assert!(ready.starts_with(kubeconfig.to_str().unwrap()), "{ready}");
    let k = Kubectl::new(dir, "dev", &kubeconfig);

    let pods = k.ok(&["get", "pods", "-A"]);
    assert!(pods.contains("demo"), "{pods}");
    let deploys = k.ok(&["get", "deployments", "-n", "demo", "-o", "name"]);
    let first = deploys
        .lines()
        .next()
        .expect("the demo workload has deployments");
    let one = k.ok(&["get", "-n", "demo", first, "-o", "yaml"]);
    assert!(one.contains("kind: Deployment"), "{one}");

    k.ok_with_input(
        &["apply", "-f", "-"],
        Some(&support::deployment("demo", "dev-new")),
    );
    k.ok(&[
        "scale",
        "deployment",
        "dev-new",
        "-n",
        "demo",
        "--replicas=3",
    ]);
    support::wait_for("the scaled deployment", || {
        let out = k.run_with_input(
            &[
                "get",
                "deployment",
                "dev-new",
                "-n",
                "demo",
                "-o",
                "jsonpath={.spec.replicas}",
            ],
            None,
        );
        (out.stdout == b"3").then_some(())
    });
    k.ok(&["delete", "deployment", "dev-new", "-n", "demo"]);
    support::wait_for("the deleted deployment to be gone", || {
        let out = k.run_with_input(&["get", "deployment", "dev-new", "-n", "demo"], None);
        (!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"))
            .then_some(())
    });

    // The cluster's own answer has secret values; the chain's keeps each
    // key with a filler of the value's length (for `describe` and the DATA
    // column) and no byte of any value.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let values = |k: &Kubectl| -> Vec<((String, String, String), Vec<u8>)> {
        let list: serde_json::Value =
            serde_json::from_str(&k.ok(&["get", "secrets", "-A", "-o", "json"])).unwrap();
        let mut out = Vec::new();
        for item in list["items"].as_array().unwrap() {
            let meta = &item["metadata"];
            for (key, value) in item["data"].as_object().into_iter().flatten() {
                let id = (
                    meta["namespace"].as_str().unwrap().to_owned(),
                    meta["name"].as_str().unwrap().to_owned(),
                    key.clone(),
                );
                out.push((id, b64.decode(value.as_str().unwrap()).unwrap()));
            }
        }
        out.sort();
        out
    };
    let direct = Kubectl::new(dir, "direct", &state.join("kube-sim.kubeconfig"));
    let in_cluster = values(&direct);
    assert!(
        in_cluster
            .iter()
            .any(|(_, v)| !v.is_empty() && v.iter().any(|b| *b != b'*')),
        "the demo secret has data: {in_cluster:?}"
    );
    let through = values(&k);
    let fillers: Vec<_> = in_cluster
        .iter()
        .map(|(id, v)| (id.clone(), vec![b'*'; v.len()]))
        .collect();
    assert_eq!(through, fillers, "secret values left the cluster");

    // The simulated API server is served over TLS, so the agent carries
    // every list and watch of the account on one HTTP/2 connection.
    let admin = dev.listening("agent-admin");
    let (code, metrics) = http(admin, "GET", "/metrics", &[]);
    assert_eq!(code, 200);
    let connections = metrics
        .lines()
        .find(|l| l.starts_with("spinlink_agent_apiserver_connections{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        connections.is_some_and(|n| (1.0..=4.0).contains(&n)),
        "{connections:?} connections to the API server\n{metrics}"
    );

    let status = dev.interrupt();
    assert!(
        status.success(),
        "spinlink dev did not stop cleanly: {status:?}\n{}",
        dev.log_tail()
    );
}

/// A kubectl with a cold cache discovers the cluster through the facade in
/// as many requests as against the API server itself: the aggregated
/// discovery documents (`apidiscovery.k8s.io/v2`) the agent fetched are
/// served as the server served them, instead of the plain ones that make
/// kubectl ask for every group version (26 requests).
#[test]
fn a_cold_kubectl_discovers_through_the_facade_as_fast_as_directly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let state = dir.join("state");
    let _dev = support::dev(dir, &state, Some(&sim_kubeconfig));
    // The GETs a cold `kubectl get pods` makes, besides the pods themselves.
    let discovery = |k: &Kubectl| -> Vec<String> {
        let out = k.run_with_input(&["get", "pods", "-n", "demo", "-v=6"], None);
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{log}");
        log.lines()
            .filter(|l| l.contains("verb=\"GET\"") && !l.contains("/pods"))
            .map(str::to_owned)
            .collect()
    };
    let direct = discovery(&Kubectl::new(dir, "direct", &sim_kubeconfig));
    let via = discovery(&Kubectl::new(dir, "via", &state.join("kubeconfig")));
    assert!(
        (1..=3).contains(&direct.len()),
        "the API server serves aggregated discovery: {direct:#?}"
    );
    assert_eq!(via.len(), direct.len(), "through the facade: {via:#?}");
}

/// A large cluster takes a while to list: `spinlink dev` says how far the
/// initial listing has got, once a second while it moves, and how long it
/// took once the account is ready.
#[test]
fn dev_shows_the_initial_listing_of_a_large_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_sim, sim_kubeconfig) =
        support::kube_sim_with(dir, &["--empty", "--seed-objects", "40000"]);
    let mut dev = support::dev(dir, &dir.join("state"), Some(&sim_kubeconfig));
    let synced = dev.wait_line("synced: ");
    let progress = dev.seen("syncing: ");
    assert!(
        !progress.is_empty(),
        "no progress shown:\n{:?}",
        dev.seen("")
    );
    // Each line a step further: objects never go back.
    let objects = |l: &str| -> u64 {
        let words: Vec<&str> = l.split_whitespace().collect();
        words
            .iter()
            .position(|w| w.starts_with("objects"))
            .and_then(|i| words.get(i.checked_sub(1)?))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no object count in {l:?}"))
    };
    let counts: Vec<u64> = progress.iter().map(|l| objects(l)).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    let total = objects(&synced);
    assert!(total >= 40_000, "{synced}");
    assert!(
        counts.iter().all(|c| *c <= total),
        "{progress:?} then {synced}"
    );
}
