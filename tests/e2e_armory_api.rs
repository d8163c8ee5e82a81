//! Armory's REST API end to end, every component the real `spinlink`
//! binary: kube-sim, a sidecar (with an encryption key and a Clouddriver
//! that stores one account definition), a gateway and an
//! infrastructure-mode agent with one configured account and
//! `dynamicAccounts` on. Each call of Armory's dynamic-accounts and
//! migration task pages is made on the sidecar as those pages show it, and
//! checked for its status code, its body's shape and its effect: the
//! account served by the agent (kubectl through the facade reads kube-sim),
//! or gone. The agent's Armory admin endpoints — `/health`, `/accounts`
//! with filters and paging, `/operations`, `/watches`, `/version` — are
//! called on the running agent the same way.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use serde_json::{Value, json};
use support::chain::{Chain, dynamic_chain};
use support::{Kubectl, http, send_json, wait_for};

/// The bearer token of the kubeconfigs handed over (kube-sim accepts any):
/// it must never be answered or logged.
const TOKEN: &str = "e2e-armory-api-token-5d2a";

/// The account Clouddriver's account storage holds, to be migrated.
const STORED: &str = "mig-1";

fn parse(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A Clouddriver with account storage holding one definition, `STORED`
/// with `kubeconfig`: it answers the sidecar's migration read
/// (`GET /credentials/type/kubernetes?…&startingAccountName=`) and takes
/// the sidecar's registrations (`PUT /credentials`) without loading them.
fn fake_clouddriver(kubeconfig: String) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let kubeconfig = kubeconfig.clone();
            std::thread::spawn(move || answer_clouddriver(stream, &kubeconfig));
        }
    });
    addr
}

fn answer_clouddriver(stream: TcpStream, kubeconfig: &str) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let (status, answer) = match (method, target.split_once('?')) {
        ("GET", Some(("/credentials/type/kubernetes", query))) => {
            let listed = if query.contains(&format!("startingAccountName={STORED}")) {
                json!([{"name": STORED, "type": "kubernetes", "kubeconfigContents": kubeconfig}])
            } else {
                json!([])
            };
            ("200 OK", listed)
        }
        ("GET", _) => ("404 Not Found", json!({})),
        _ => ("200 OK", json!({})),
    };
    let answer = answer.to_string();
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{answer}",
        answer.len()
    );
}

/// The running chain and how to call it.
struct Api {
    chain: Chain,
    admin: SocketAddr,
    direct: Kubectl,
}

impl Api {
    /// A sidecar call; the kubeconfig's token is never in its answer.
    fn call(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let text = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let (status, answer) = send_json(self.chain.facade, method, path, &text);
        assert!(
            !answer.contains(TOKEN),
            "{method} {path} answered the token"
        );
        let v = if answer.is_empty() {
            Value::Null
        } else {
            parse(&answer)
        };
        (status, v)
    }

    /// The account as the path Armory's pages poll shows it.
    fn account(&self, name: &str) -> (u16, Value) {
        self.call(
            "GET",
            &format!("/agents/kubernetes/accounts/{name}"),
            &Value::Null,
        )
    }

    fn wait_status(&self, name: &str, want: &str) -> Value {
        wait_for(&format!("{name} to be {want}"), || {
            let (code, v) = self.account(name);
            (code == 200 && v["status"] == want).then_some(v)
        })
    }

    /// An agent admin call answered 200 with JSON.
    fn admin(&self, target: &str) -> Value {
        let (status, body) = http(self.admin, "GET", target, &[]);
        assert_eq!(status, 200, "{target}: {body}");
        parse(&body)
    }

    /// The names `/accounts` answers for Armory's `query`.
    fn agent_accounts(&self, query: &str) -> Vec<String> {
        let v = self.admin(&format!("/accounts?{query}"));
        v.as_array()
            .unwrap_or_else(|| panic!("{query}: not an array: {v}"))
            .iter()
            .map(|a| a["Config"]["Name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The one account `/accounts?Config.Name=` answers, once `check`
    /// holds for it.
    fn wait_agent_account(&self, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        wait_for(&format!("the agent's {name}: {what}"), || {
            let v = self.admin(&format!("/accounts?Config.Name={name}"));
            v.get(0).filter(|a| check(a)).cloned()
        })
    }

    /// kubectl through the facade lists kube-sim's pods for `account`.
    fn served(&self, account: &str) {
        let names = |k: &Kubectl| k.sorted_lines(&["get", "pods", "-A", "-o", "name"]);
        let pods = names(&self.direct);
        assert!(!pods.is_empty(), "the simulated cluster has pods");
        assert_eq!(names(&self.chain.kubectl(account)), pods, "{account}");
    }

    /// The facade no longer serves `account`, and kubectl fails on it.
    fn gone(&self, account: &str) {
        wait_for(&format!("the facade to answer 404 for {account}"), || {
            let path = format!("/accounts/{account}/api/v1/pods");
            (http(self.chain.facade, "GET", &path, &[]).0 == 404).then_some(())
        });
        let out = self
            .chain
            .kubectl(account)
            .run_with_input(&["get", "pods", "-A"], None);
        assert!(!out.status.success(), "kubectl still reads {account}");
        wait_for(&format!("the agent to stop serving {account}"), || {
            self.agent_accounts(&format!("Config.Name={account}"))
                .is_empty()
                .then_some(())
        });
    }
}

/// The fields of Armory's `KubesvcAccount`, as `../shared/armory-rest-api.md`
/// (Schemas, from Armory's swagger of Aug 2022) lists them; there is no
/// Armory instance to record answers from.
fn assert_kubesvc_account(v: &Value, name: &str) {
    assert_eq!(v["name"], name, "{v}");
    for key in [
        "status",
        "zoneId",
        "certFingerprint",
        "agentId",
        "lastUpdated",
    ] {
        assert!(v[key].is_string(), "{key} in {v}");
    }
    assert!(v["dynamic"].is_boolean(), "{v}");
    assert!(v["connections"].is_u64(), "{v}");
}

#[test]
fn armory_task_pages_and_agent_admin_endpoints_against_a_running_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_sim, sim_kubeconfig) = support::kube_sim(dir);
    let direct = Kubectl::new(dir, "direct", &sim_kubeconfig);
    // Clouddriver's stored definition has the kubeconfig too.
    let clouddriver = fake_clouddriver(
        std::fs::read_to_string(&sim_kubeconfig)
            .unwrap()
            .replace("\"kube-sim\"\n", &format!("\"{TOKEN}\"\n")),
    );
    let (handed, chain, admin) = dynamic_chain(
        dir,
        &sim_kubeconfig,
        TOKEN,
        &format!("clouddriver:\n  baseUrl: http://{clouddriver}\n"),
    );
    let facade = chain.facade;
    let mut api = Api {
        chain,
        admin,
        direct,
    };

    // The agent's admin port, as Armory's probes and dashboards call it.
    wait_for("the agent's /health", || {
        (support::try_http(admin, "GET", "/health", &[])?.0 == 200).then_some(())
    });
    let version = api.admin("/version");
    assert_eq!(version["name"], "spinlink-agent", "{version}");
    assert!(
        !version["version"].as_str().unwrap().is_empty(),
        "{version}"
    );
    let static_account =
        api.wait_agent_account("static", "Healthy", |a| a["State"]["Name"] == "Healthy");
    assert_eq!(
        static_account["Config"]["Dynamic"], false,
        "{static_account}"
    );
    assert!(
        !static_account["Kinds"].as_array().unwrap().is_empty(),
        "{static_account}"
    );
    let cluster = api.admin("/accounts/static/version");
    assert_eq!(
        cluster["kubernetesVersion"], static_account["KubernetesVersion"],
        "{cluster}"
    );
    assert!(
        cluster["kubernetesVersion"]
            .as_str()
            .unwrap()
            .starts_with('v'),
        "{cluster}"
    );
    assert_eq!(http(admin, "GET", "/accounts/nope/version", &[]).0, 404);
    let watches = api.admin("/watches");
    assert!(
        watches["watches"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["account"] == "static"),
        "{watches}"
    );
    // Bad input: a 400 naming the parameter, and the port keeps serving.
    for (query, param) in [
        ("limit=abc", "limit"),
        ("offset=-1", "offset"),
        ("Config.Dynamic=maybe", "Config.Dynamic"),
        ("State.Name=Running", "State.Name"),
    ] {
        let (status, body) = http(admin, "GET", &format!("/accounts?{query}"), &[]);
        assert_eq!(status, 400, "{query}: {body}");
        let v = parse(&body);
        assert!(
            v["message"].as_str().unwrap().starts_with(param),
            "{query}: {v}"
        );
    }
    // Without Armory's parameters, spinlink's own shape.
    assert_eq!(
        api.admin("/accounts")["accounts"]["static"]["state"],
        "synced"
    );

    // Dynamic accounts, as Armory's task page: POST, poll for ACTIVE, PUT, DELETE.
    let create = json!({"name": "dyn-1", "kubeconfigContents": handed, "zoneId": "eu"});
    let (status, v) = api.call("POST", "/armory/accounts/dynamic", &create);
    assert_eq!(status, 202, "{v}");
    assert_kubesvc_account(&v, "dyn-1");
    assert_eq!(v["dynamic"], true, "{v}");
    let (status, v) = api.call("POST", "/armory/accounts/dynamic", &create);
    assert_eq!(status, 409, "a second POST of the name: {v}");
    let v = api.wait_status("dyn-1", "ACTIVE");
    assert_kubesvc_account(&v, "dyn-1");
    assert_eq!(v["agentId"], "agent-1", "{v}");
    api.chain.wait_ready("dyn-1");
    api.served("dyn-1");
    let dynamic = api.wait_agent_account("dyn-1", "Healthy", |a| a["State"]["Name"] == "Healthy");
    assert_eq!(dynamic["Config"]["Dynamic"], true, "{dynamic}");
    // Filters and paging over the two accounts (sorted: dyn-1, static).
    assert_eq!(api.agent_accounts("Config.Dynamic=true"), ["dyn-1"]);
    assert_eq!(api.agent_accounts("Config.Dynamic=false"), ["static"]);
    assert_eq!(
        api.agent_accounts("State.Name=Healthy"),
        ["dyn-1", "static"]
    );
    assert!(api.agent_accounts("State.Name=DiscoveryError").is_empty());
    assert_eq!(api.agent_accounts("limit=1"), ["dyn-1"]);
    assert_eq!(api.agent_accounts("limit=1&offset=1"), ["static"]);
    assert!(api.agent_accounts("offset=2").is_empty());

    // The namespaces known for it are kube-sim's.
    let namespaces: Vec<String> = api
        .direct
        .sorted_lines(&["get", "namespaces", "-o", "name"])
        .iter()
        .map(|l| l.trim_start_matches("namespace/").to_owned())
        .collect();
    assert!(
        !namespaces.is_empty(),
        "the simulated cluster has namespaces"
    );
    let (status, v) = api.call(
        "GET",
        "/agents/kubernetes/accounts/dyn-1/namespaces",
        &Value::Null,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, json!(namespaces));
    let (status, _) = api.call(
        "GET",
        "/agents/kubernetes/accounts/nope/namespaces",
        &Value::Null,
    );
    assert_eq!(status, 404);

    // `/operations`: a followed log is relayed, and listed while it runs.
    let pod = api.direct.ok(&[
        "get",
        "pods",
        "-A",
        "-o",
        "jsonpath={.items[0].metadata.namespace} {.items[0].metadata.name}",
    ]);
    let (namespace, pod) = pod.split_once(' ').unwrap();
    let via = api.chain.kubectl("dyn-1");
    let (mut follow, lines) = via.spawn_lines(&["logs", "-f", "-n", namespace, pod]);
    lines
        .recv_timeout(support::WAIT)
        .expect("a followed log line through the facade");
    let logs = |v: &Value| -> Vec<Value> {
        v["operations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["account"] == "dyn-1" && o["path"].as_str().unwrap().ends_with("/log"))
            .cloned()
            .collect()
    };
    let running = wait_for("the followed log in /operations", || {
        logs(&api.admin("/operations")).pop()
    });
    assert_eq!(
        (&running["verb"], &running["method"]),
        (&json!("get"), &json!("GET")),
        "{running}"
    );
    assert!(
        running["id"].as_str().unwrap().starts_with("dyn-1:"),
        "{running}"
    );
    assert!(
        running["startedUnixMillis"].as_i64().unwrap() > 0,
        "{running}"
    );
    follow.kill().unwrap();
    follow.wait().unwrap();
    wait_for("the cancelled log to leave /operations", || {
        logs(&api.admin("/operations")).is_empty().then_some(())
    });

    // PUT: the update reaches the agent (its namespaces).
    let update = json!({"name": "dyn-1", "kubeconfigContents": handed, "zoneId": "eu",
        "namespaces": ["default"]});
    let (status, v) = api.call("PUT", "/armory/accounts/dynamic", &update);
    assert_eq!(status, 202, "{v}");
    assert_kubesvc_account(&v, "dyn-1");
    api.wait_agent_account("dyn-1", "limited to default", |a| {
        a["Config"]["Namespaces"] == json!(["default"])
    });
    wait_for("dyn-1's namespaces to be default only", || {
        let (_, v) = api.call(
            "GET",
            "/agents/kubernetes/accounts/dyn-1/namespaces",
            &Value::Null,
        );
        (v == json!(["default"])).then_some(())
    });
    let (status, v) = api.call(
        "PUT",
        "/armory/accounts/dynamic",
        &json!({"name": "dyn-nope", "kubeconfigContents": handed}),
    );
    assert_eq!(status, 404, "PUT of an unknown account: {v}");

    // DELETE: gone from the facade, the agent, and the API.
    let (status, v) = api.call("DELETE", "/armory/accounts/dyn-1", &Value::Null);
    assert_eq!(status, 202, "{v}");
    api.gone("dyn-1");
    wait_for("dyn-1 to be 404", || {
        (api.account("dyn-1").0 == 404).then_some(())
    });

    // Migration, as Armory's task page: POST, PATCH ACTIVE, PATCH INACTIVE, DELETE.
    let (status, v) = api.call(
        "POST",
        "/armory/accounts",
        &json!([{"name": STORED, "zoneId": "eu"}]),
    );
    assert_eq!((status, &v), (202, &json!([])));
    let v = api.wait_status(STORED, "INACTIVE");
    assert_kubesvc_account(&v, STORED);
    // INACTIVE is not handed to an agent.
    assert!(
        api.agent_accounts(&format!("Config.Name={STORED}"))
            .is_empty()
    );
    assert_eq!(
        http(
            facade,
            "GET",
            &format!("/accounts/{STORED}/api/v1/pods"),
            &[]
        )
        .0,
        404
    );
    let (status, v) = api.call("POST", "/armory/accounts", &json!([{"name": STORED}]));
    assert_eq!((status, &v), (409, &json!([STORED])));
    let (status, v) = api.call("POST", "/armory/accounts", &json!([]));
    assert_eq!(status, 400, "{v}");

    let activate = json!([{"name": STORED, "state": "ACTIVE"}]);
    let (status, v) = api.call("PATCH", "/armory/accounts", &activate);
    assert_eq!((status, &v), (202, &json!([])));
    api.wait_status(STORED, "ACTIVE");
    api.wait_agent_account(STORED, "dynamic and Healthy", |a| {
        a["Config"]["Dynamic"] == true && a["State"]["Name"] == "Healthy"
    });
    api.chain.wait_ready(STORED);
    api.served(STORED);

    let deactivate = json!([{"name": STORED, "state": "INACTIVE"}]);
    let (status, v) = api.call("PATCH", "/armory/accounts", &deactivate);
    assert_eq!((status, &v), (202, &json!([])));
    api.wait_status(STORED, "INACTIVE");
    api.gone(STORED);

    let (status, v) = api.call("DELETE", "/armory/accounts", &json!([STORED]));
    assert_eq!((status, &v), (202, &json!([])));
    let (status, _) = api.account(STORED);
    assert_eq!(status, 404);
    let (status, v) = api.call("DELETE", "/armory/accounts", &json!([STORED]));
    assert_eq!(status, 404, "{v}");

    // The sidecars sharing the store: this one.
    let (status, v) = api.call("GET", "/armory/clouddrivers", &Value::Null);
    assert_eq!(status, 200, "{v}");
    let all = v.as_array().unwrap();
    assert_eq!(all.len(), 1, "{v}");
    assert_eq!(
        (&all[0]["id"], &all[0]["ready"]),
        (&json!("chain-sidecar"), &json!(true))
    );
    assert!(all[0]["baseUrl"].is_string(), "{v}");
    assert!(
        chrono::DateTime::parse_from_rfc3339(all[0]["lastUpdated"].as_str().unwrap()).is_ok(),
        "{v}"
    );
    let (status, one) = api.call("GET", "/armory/clouddrivers/chain-sidecar", &Value::Null);
    assert_eq!((status, &one), (200, &all[0]));
    assert_eq!(
        api.call("GET", "/armory/clouddrivers/nope", &Value::Null).0,
        404
    );

    // The configured account never noticed; nothing logged the token.
    assert!(api.chain.agent.running(), "the agent restarted");
    assert_eq!(api.agent_accounts("State.Name=Healthy"), ["static"]);
    for (name, log) in [
        ("sidecar", api.chain.sidecar.log()),
        ("gateway", api.chain.gateway.log()),
        ("agent", api.chain.agent.log()),
    ] {
        assert!(!log.contains(TOKEN), "{name} logged the kubeconfig");
    }
}
