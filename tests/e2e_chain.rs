//! The whole chain as separate processes: kube-sim, sidecar, gateway and
//! agent, each the real `spinlink` binary, driven with real kubectl.
//!
//! Between the gateway and the sidecar sits a loopback recorder (the tunnel
//! hop runs as h2c here so the recorder can read it) that keeps every byte the
//! gateway forwarded, so the test can prove a Secret's value never left the
//! cluster. The agent → gateway hop is mTLS with channel tokens, and the test
//! plays misbehaving agents against it.

mod support;

use std::path::Path;

use spinlink_proto::headers;
use spinlink_proto::v1::{CacheOpen, CacheUp, Heartbeat, HelloRequest, cache_up};
use spinlink_tls::dev::{DevCa, DevPki, Leaf, dev_agent_identity};
use support::{Kubectl, Proc, Recorder, contains, http, wait_for, write_kubeconfig};

/// The value of the Secret that must never leave the cluster.
const SENTINEL: &str = "e2e-sentinel-value-4c1f9a7d2b";
/// The same value as the API server encodes it in `data`.
const SENTINEL_B64: &str = "ZTJlLXNlbnRpbmVsLXZhbHVlLTRjMWY5YTdkMmI=";

fn yaml(dir: &Path, name: &str, text: String) -> String {
    support::write_file(dir, name, &text)
}

#[test]
fn agent_gateway_sidecar_kubectl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1", "agent-2"]).unwrap();
    let p = |path: std::path::PathBuf| path.display().to_string();

    // The cluster, with a Secret that must never leave it.
    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    // `kubectl create secret` would send protobuf, which kube-sim does not
    // decode yet; apply sends JSON.
    direct.ok_with_input(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: e2e-sentinel\n  namespace: demo\nstringData:\n  token: {SENTINEL}\n"
        )),
    );

    // Sidecar, with its tunnel in plaintext so the recorder can read it.
    let sidecar_cfg = yaml(
        dir,
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
    let recorder = Recorder::start(tunnel);

    // Gateway: agent-1 may serve e2e and e2e-spare; agent-2 nothing.
    let gateway_cfg = yaml(
        dir,
        "gateway.yaml",
        format!(
            "gatewayId: e2e-gateway\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
         policy:\n- identities: [\"{}\"]\n  accounts: [e2e, e2e-spare]\n\
         upstreams:\n- url: http://{}\n",
            p(pki.cert("gateway")),
            p(pki.key("gateway")),
            p(pki.ca_cert()),
            dev_agent_identity("agent-1"),
            recorder.addr
        ),
    );
    let mut gateway = Proc::start("gateway", dir, &["gateway", "--config", &gateway_cfg]);
    let gateway_addr = gateway.listening("gateway");

    let agent_yaml = |id: &str, cert: &str, key: &str, accounts: &[&str]| {
        let accounts: String = accounts
            .iter()
            .map(|a| {
                format!(
                    "  - name: {a}\n    kubeconfigFile: {}\n",
                    sim_kubeconfig.display()
                )
            })
            .collect();
        format!(
            "agentId: {id}\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {cert}\n  keyFile: {key}\n\
             kubernetes:\n  accounts:\n{accounts}",
            gateway_addr.port(),
            p(pki.ca_cert())
        )
    };
    let agent_cfg = yaml(
        dir,
        "agent.yaml",
        agent_yaml(
            "agent-1",
            &p(pki.cert("agent-agent-1")),
            &p(pki.key("agent-agent-1")),
            &["e2e"],
        ),
    );
    let _agent = Proc::start("agent", dir, &["agent", "--config", &agent_cfg]);

    // Ready: the account is online, its kinds synced, its relay attached.
    wait_for("account e2e to be ready", || {
        let (status, body) = http(facade, "GET", "/v1/accounts/e2e", &[]);
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let ready = status == 200
            && v["online"] == true
            && v["relay"] == true
            && v["discovery"] == true
            && v["agentSynced"] == true
            && v["kindsTotal"].as_u64().unwrap_or(0) > 0
            && v["kindsSynced"] == v["kindsTotal"];
        ready.then_some(())
    });
    let facade_kubeconfig = dir.join("facade.kubeconfig");
    write_kubeconfig(&facade_kubeconfig, &format!("http://{facade}/accounts/e2e"));
    let via = Kubectl::new(dir, "facade", &facade_kubeconfig);

    // Reads through the chain show the cluster as it is.
    let names = |k: &Kubectl, what: &str| {
        let mut v: Vec<String> = k
            .ok(&["get", what, "-A", "-o", "name"])
            .lines()
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
    assert!(
        !names(&direct, "pods").is_empty(),
        "the simulated cluster has pods"
    );
    assert_eq!(names(&via, "pods"), names(&direct, "pods"));
    assert_eq!(names(&via, "deployments"), names(&direct, "deployments"));
    let table = via.ok(&["get", "pods", "-A"]);
    assert!(
        table.starts_with("NAMESPACE"),
        "kubectl printed a table: {table}"
    );

    // A change made in the cluster shows through the facade.
    direct.ok_with_input(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: e2e-change\n  namespace: demo\ndata:\n  k: v1\n"),
    );
    wait_for("the new configmap through the facade", || {
        let out = via.run_with_input(
            &[
                "get",
                "configmap",
                "e2e-change",
                "-n",
                "demo",
                "-o",
                "jsonpath={.data.k}",
            ],
            None,
        );
        (out.status.success() && out.stdout == b"v1").then_some(())
    });

    // A write through the facade lands in the cluster.
    via.ok_with_input(
        &["apply", "-f", "-"],
        Some(&support::deployment("demo", "e2e-applied")),
    );
    let applied = direct.ok(&[
        "get",
        "deployment",
        "e2e-applied",
        "-n",
        "demo",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(applied, "nginx:1.27");

    // The apply's relayed requests, each with the time of every hop, in
    // order: the facade received it, handed it to the relay stream, the agent
    // started it and had its answer, the facade answered.
    let (status, ops) = http(facade, "GET", "/v1/accounts/e2e/operations", &[]);
    assert_eq!(status, 200, "{ops}");
    let ops: Vec<serde_json::Value> = serde_json::from_str(&ops).unwrap();
    let applies: Vec<&serde_json::Value> = ops
        .iter()
        .filter(|o| o["kubectlCommand"] == "kubectl apply")
        .collect();
    assert!(
        applies.iter().any(|o| o["method"] == "GET")
            && applies.iter().any(|o| o["method"] != "GET"),
        "apply's read and write were relayed: {ops:?}"
    );
    for op in applies {
        let hops: Vec<chrono::DateTime<chrono::Utc>> = spinlink_sidecar::accounts::Operation::HOPS
            .iter()
            .map(|hop| serde_json::from_value(op[*hop].clone()).expect(hop))
            .collect();
        assert!(hops.is_sorted(), "hops out of order: {op}");
    }

    // `kubectl logs -f` through the chain: kube-sim writes ten lines, then
    // one a second until the pod goes. Each must reach kubectl while the
    // stream is still open; a hop that held the body back until it ended
    // would deliver nothing here. (A running pod of the demo workload: one
    // just applied would still be creating its container.)
    let pod = direct.ok(&[
        "get",
        "pods",
        "-n",
        "demo",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let container = direct.ok(&[
        "get",
        "pod",
        &pod,
        "-n",
        "demo",
        "-o",
        "jsonpath={.spec.containers[0].name}",
    ]);
    let (mut follow, lines) = via.spawn_lines(&["logs", "-f", &pod, "-n", "demo"]);
    let mut seen = Vec::new();
    while seen.len() < 12 {
        let line = lines.recv_timeout(support::WAIT).unwrap_or_else(|e| {
            let mut stderr = String::new();
            if let Some(mut err) = follow.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
            }
            panic!(
                "line {} of the followed log: {e}; {seen:?}; {stderr}",
                seen.len() + 1
            )
        });
        seen.push(line);
        assert!(
            follow.try_wait().unwrap().is_none(),
            "the log stream ended after {seen:?}"
        );
    }
    for (i, line) in seen.iter().enumerate() {
        let want = format!("[{pod}/{container}] request {}: ", i + 1);
        assert!(line.contains(&want), "line {}: {line}", i + 1);
    }
    // The pod goes: its log ends, and so does kubectl.
    direct.ok(&["delete", "pod", &pod, "-n", "demo", "--wait=false"]);
    let status = support::wait_for("kubectl logs -f to end", || follow.try_wait().unwrap());
    assert!(status.success(), "{status:?}");

    // Secrets: listed, but never with their values.
    let secrets = via.ok(&["get", "secrets", "-A", "-o", "yaml"]);
    assert!(
        secrets.contains("e2e-sentinel"),
        "the secret is listed: {secrets}"
    );
    assert!(!secrets.contains(SENTINEL) && !secrets.contains(SENTINEL_B64));
    // A live (relayed) read of the Secret is scrubbed too.
    let (status, live) = http(
        facade,
        "GET",
        "/accounts/e2e/api/v1/namespaces/demo/secrets/e2e-sentinel",
        &[("Kubectl-Command", "kubectl apply")],
    );
    assert_eq!(status, 200, "{live}");
    assert!(
        live.contains("e2e-sentinel") && !live.contains(SENTINEL_B64) && !live.contains(SENTINEL)
    );

    let forwarded = recorder.bytes();
    assert!(
        contains(&forwarded, b"e2e-sentinel"),
        "the recorder saw the secret's metadata go by"
    );
    assert!(
        !contains(&forwarded, SENTINEL.as_bytes()),
        "the secret value crossed the gateway"
    );
    assert!(
        !contains(&forwarded, SENTINEL_B64.as_bytes()),
        "the encoded secret value crossed the gateway"
    );
    // Whether the token header went upstream is checked on decoded headers in
    // the gateway's own tests: HPACK hides header bytes from a recorder.

    // Misbehaving agents, played with the agent's own connector.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let gateway_of = |cert: String, key: String| {
            let cfg = spinlink_agent::Config::from_yaml_str(
                &agent_yaml("probe", &cert, &key, &["e2e-spare"]),
                "probe",
            )
            .unwrap();
            cfg.gateway
        };
        let hello = |accounts: &[&str]| HelloRequest {
            agent_id: "probe".into(),
            agent_version: "test".into(),
            accounts: accounts
                .iter()
                .map(|a| spinlink_proto::v1::AccountInfo {
                    name: (*a).into(),
                    ..Default::default()
                })
                .collect(),
        };

        // A certificate from another CA is refused at the handshake.
        let foreign = DevCa::generate("foreign CA").unwrap();
        let (cert, key) = foreign
            .issue(&Leaf::client("agent-1").with_uri(&dev_agent_identity("agent-1")))
            .unwrap()
            .write(dir, "foreign-agent")
            .unwrap();
        let refused = match spinlink_agent::connect(&gateway_of(p(cert), p(key))).await {
            Err(_) => true,
            Ok(mut client) => client.hello(hello(&["e2e-spare"])).await.is_err(),
        };
        assert!(refused, "an agent with a foreign certificate was let in");

        // An identity not allowed an account gets no token for it.
        let agent1 = gateway_of(p(pki.cert("agent-agent-1")), p(pki.key("agent-agent-1")));
        let agent2 = gateway_of(p(pki.cert("agent-agent-2")), p(pki.key("agent-agent-2")));
        let mut other = spinlink_agent::connect(&agent2).await.unwrap();
        let answer = other
            .hello(hello(&["e2e-spare"]))
            .await
            .unwrap()
            .into_inner();
        assert!(answer.granted.is_empty(), "agent-2 got a token");
        assert_eq!(answer.refused.len(), 1);
        let mut conn_a = spinlink_agent::connect(&agent1).await.unwrap();
        let answer = conn_a
            .hello(hello(&["e2e-spare", "not-allowed"]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.granted.len(), 1, "{answer:?}");
        assert_eq!(answer.granted[0].account, "e2e-spare");
        assert_eq!(answer.refused[0].account, "not-allowed");
        let token = answer.granted[0].token.clone();

        // The token works on its own connection...
        let open_cache = |token: String| {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.try_send(CacheUp {
                seq: 1,
                msg: Some(cache_up::Msg::Open(CacheOpen {
                    account: "e2e-spare".into(),
                    agent_id: "probe".into(),
                    ..CacheOpen::default()
                })),
            })
            .unwrap();
            tx.try_send(CacheUp {
                seq: 2,
                msg: Some(cache_up::Msg::Heartbeat(Heartbeat {
                    unix_millis: 1,
                    ..Default::default()
                })),
            })
            .unwrap();
            let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
            request
                .metadata_mut()
                .insert(headers::ACCOUNT, "e2e-spare".parse().unwrap());
            request
                .metadata_mut()
                .insert(headers::TOKEN, token.parse().unwrap());
            (tx, request)
        };
        let (_keep, request) = open_cache(token.clone());
        let mut down = conn_a
            .cache(request)
            .await
            .expect("stream on its own connection")
            .into_inner();
        let first = tokio::time::timeout(support::WAIT, down.message())
            .await
            .expect("an answer from the sidecar");
        assert!(
            matches!(first, Ok(Some(_))),
            "the sidecar answered the stream: {first:?}"
        );

        // ...and is worthless on another connection, even of the same agent.
        let mut conn_b = spinlink_agent::connect(&agent1).await.unwrap();
        let (_keep, request) = open_cache(token);
        let stolen = match conn_b.cache(request).await {
            Err(status) => status,
            Ok(response) => response
                .into_inner()
                .message()
                .await
                .expect_err("stolen token accepted"),
        };
        assert_eq!(stolen.code(), tonic::Code::Unauthenticated, "{stolen:?}");
    });

    assert!(gateway.log().contains("e2e"), "{}", gateway.log_tail());
    assert!(
        !gateway.log().contains(SENTINEL),
        "the gateway logged the secret"
    );
}
