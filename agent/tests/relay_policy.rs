//! The cluster owner's relay policy against kube-sim: denied requests get a
//! 403 `metav1.Status` naming the rule and are counted; `readSecrets` lets an
//! account read Secret values, which are removed otherwise.

mod common;

use common::{FakeGateway, Records};
use serde_json::json;
use spinlink_agent::{Agent, Config};
use spinlink_kube_sim::{Server, Sim};
use spinlink_proto::v1::{self, relay_down, relay_up};
use tokio_util::sync::CancellationToken;

const VALUE_B64: &str = "cmVhZGFibGUtdmFsdWU=";

/// Status and body of relayed request `id` on `account`, once complete.
fn response(r: &Records, account: &str, id: u64) -> Option<(u32, serde_json::Value)> {
    let mut status = None;
    let mut body = Vec::new();
    for (a, m) in &r.relay_up {
        if a != account {
            continue;
        }
        match &m.msg {
            Some(relay_up::Msg::Head(h)) if h.id == id => status = Some(h.status),
            Some(relay_up::Msg::Body(c)) if c.id == id => {
                body.extend_from_slice(&c.data);
                if c.end_stream {
                    return Some((status?, serde_json::from_slice(&body).unwrap()));
                }
            }
            Some(relay_up::Msg::Error(e)) if e.id == id => panic!("request {id} failed: {e:?}"),
            _ => {}
        }
    }
    None
}

fn request(id: u64, method: &str, path: &str) -> v1::RelayDown {
    v1::RelayDown {
        msg: Some(relay_down::Msg::Head(v1::RequestHead {
            id,
            method: method.into(),
            path: path.into(),
            headers: vec![v1::Header {
                name: "Accept".into(),
                value: b"application/json".to_vec(),
            }],
            end_stream: true,
            ..Default::default()
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_requests_get_403_naming_the_rule_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::with_demo_workload();
    sim.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "readable", "namespace": "demo"}, "data": {"k": VALUE_B64}}))
        .unwrap();
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let kubeconfig = dir.path().join("sim.kubeconfig");
    spinlink_kube_sim::write_kubeconfig(&kubeconfig, &server.url(), "sim", None).unwrap();
    let stop = CancellationToken::new();
    let sim_task = tokio::spawn(server.run(stop.clone()));

    let gw = FakeGateway::start(&dir.path().join("pki")).await;
    let base = gw.agent_yaml(&[("locked", &kubeconfig), ("reader", &kubeconfig)]);
    // Account keys go right after each account's kubeconfigFile line.
    let locked_line = format!("kubeconfigFile: {}\n", kubeconfig.display());
    let mut accounts = base.split(&locked_line);
    let yaml = format!(
        "{}{locked_line}      kinds: [namespaces]\n      relay:\n        verbs: [get, list, watch]\n        \
         resources: [configmaps, '*.apps']\n        namespaces: [demo]\n{}{locked_line}      \
         kinds: [namespaces]\n      relay:\n        readSecrets: true\n{}admin:\n  listen: 127.0.0.1:0\n",
        accounts.next().unwrap(),
        accounts.next().unwrap(),
        accounts.next().unwrap(),
    );
    let agent = Agent::new(Config::from_yaml_str(&yaml, "test.yaml").unwrap()).unwrap();
    let metrics = agent.metrics();
    let admin = agent.admin_addr().expect("admin port");
    let agent_task = tokio::spawn(agent.run(stop.clone()));
    gw.wait_for("relay streams", |r| {
        ["locked", "reader"]
            .iter()
            .all(|a| r.relay_up.iter().any(|(acc, _)| acc == a))
    })
    .await;

    let cases = [
        (
            1,
            "GET",
            "/api/v1/namespaces/demo/configmaps/app-config",
            None,
        ),
        (2, "GET", "/apis/apps/v1/namespaces/demo/deployments", None),
        (
            3,
            "DELETE",
            "/api/v1/namespaces/demo/configmaps/app-config",
            Some("relay.verbs"),
        ),
        (
            4,
            "GET",
            "/api/v1/namespaces/demo/secrets",
            Some("relay.resources"),
        ),
        (
            5,
            "GET",
            "/api/v1/namespaces/default/configmaps",
            Some("relay.namespaces"),
        ),
        (6, "GET", "/api/v1/configmaps", Some("relay.namespaces")),
    ];
    for (id, method, path, _) in &cases {
        gw.relay_down("locked", request(*id, method, path)).await;
    }
    gw.wait_for("every answer", |r| {
        cases
            .iter()
            .all(|(id, ..)| response(r, "locked", *id).is_some())
    })
    .await;
    gw.with(|r| {
        for (id, method, path, rule) in &cases {
            let (status, body) = response(r, "locked", *id).unwrap();
            match rule {
                None => assert_eq!(status, 200, "{method} {path}: {body}"),
                Some(rule) => {
                    assert_eq!(status, 403, "{method} {path}: {body}");
                    assert_eq!(body["kind"], "Status");
                    assert_eq!(body["reason"], "Forbidden");
                    assert_eq!(body["code"], 403);
                    let message = body["message"].as_str().unwrap();
                    assert!(message.contains(rule), "{message}");
                    assert!(message.contains("\"locked\""), "{message}");
                }
            }
        }
    });
    // Nothing denied reached kube-sim.
    assert!(sim.get("configmaps", Some("demo"), "app-config").is_some());
    let text = metrics.encode();
    let count = |verb: &str, outcome: &str| {
        let prefix = format!(
            "spinlink_agent_relays_total{{account=\"locked\",verb=\"{verb}\",outcome=\"{outcome}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    assert_eq!(count("delete", "denied"), 1, "{text}");
    assert_eq!(count("list", "denied"), 3, "{text}");
    assert_eq!(count("get", "relayed"), 1, "{text}");
    assert_eq!(count("list", "relayed"), 1, "{text}");

    // The admin port serves the same counters, and says it is ready.
    let scraped = http_get(admin, "/metrics").await;
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    assert!(
        scraped.contains(
            "spinlink_agent_relays_total{account=\"locked\",verb=\"delete\",outcome=\"denied\"} 1"
        ),
        "{scraped}"
    );
    assert!(http_get(admin, "/readyz").await.starts_with("HTTP/1.1 200"));

    // readSecrets: the values come back (cluster.rs shows they do not by
    // default).
    let secret = "/api/v1/namespaces/demo/secrets/readable";
    gw.relay_down("reader", request(7, "GET", secret)).await;
    gw.wait_for("the secret", |r| response(r, "reader", 7).is_some())
        .await;
    gw.with(|r| {
        let (status, body) = response(r, "reader", 7).unwrap();
        assert_eq!(status, 200);
        assert_eq!(body["data"]["k"], VALUE_B64);
    });

    stop.cancel();
    tokio::time::timeout(common::WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let _ = tokio::time::timeout(common::WAIT, sim_task).await;
    gw.stop().await;
}

/// A plain HTTP/1.1 GET; the whole response as text.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}
