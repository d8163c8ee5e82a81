use super::*;

fn now() -> DateTime<Utc> {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

fn row(raw: Value, op: Option<Value>) -> Row {
    let account: Account = serde_json::from_value(raw.clone()).unwrap();
    Row {
        health: Health::of(&account),
        account,
        last_operation: op.clone().map(|v| serde_json::from_value(v).unwrap()),
        raw,
        raw_operation: op,
    }
}

fn healthy() -> Value {
    json!({
        "name": "prod", "state": "online", "ownerInstance": "s1",
        "agentIdentity": "spiffe://dev/agent/a1", "online": true, "cacheStreams": 1,
        "kindsSynced": 9, "kindsTotal": 9, "objects": 120, "discovery": true,
        "lastEvent": "2026-01-01T11:58:00Z",
        "relay": true, "kinds": [], "registration": {"state": ""},
        "apiServer": {"reachable": true},
    })
}

fn stale() -> Value {
    json!({
        "name": "edge", "state": "stale", "ownerInstance": "s1",
        "agentIdentity": "spiffe://dev/agent/a2", "online": false, "cacheStreams": 0,
        "offlineSeconds": 200, "kindsSynced": 9, "kindsTotal": 9, "objects": 7,
        "discovery": true, "relay": false, "kinds": [],
        "registration": {"state": "registered"}, "apiServer": {"reachable": true},
    })
}

fn operation() -> Value {
    json!({
        "id": 4, "instance": "s1", "method": "GET", "path": "/api/v1/pods", "query": "",
        "received": "2026-01-01T11:59:25.000Z", "sentToAgent": "2026-01-01T11:59:25.001Z",
        "agentStarted": "2026-01-01T11:59:25.004Z", "agentFinished": "2026-01-01T11:59:25.010Z",
        "answered": "2026-01-01T11:59:25.012Z", "status": 200, "outcome": "answered",
    })
}

fn snapshot() -> Snapshot {
    Snapshot {
        accounts: vec![row(healthy(), Some(operation())), row(stale(), None)],
        agents: vec![Agent {
            identity: "spiffe://dev/agent/a1".into(),
            accounts: vec![AgentAccount {
                name: "prod".into(),
                state: "online".into(),
                relay: true,
            }],
        }],
        agents_raw: Vec::new(),
    }
}

#[test]
fn the_table_has_a_row_per_account_and_per_agent_in_aligned_columns() {
    let table = render_table(&snapshot(), false, now(), false);
    let expected = "\
ACCOUNT   STATUS   AGENT                   SIDECAR   KINDS   OBJECTS   LAST-EVENT   OFFLINE   LAST-OP
prod      Ready    spiffe://dev/agent/a1   s1        9/9     120       2m0s ago     -         GET 200 12ms, 35s ago
edge      Stale    spiffe://dev/agent/a2   s1        9/9     7         -            3m20s     -

AGENT                   ONLINE   ACCOUNTS
spiffe://dev/agent/a1   1/1      prod
";
    assert_eq!(table, expected);
}

#[test]
fn wide_adds_relay_registration_api_server_and_hops() {
    let table = render_table(&snapshot(), true, now(), false);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    assert!(
        header.ends_with("LAST-OP                 RELAY      REGISTRATION   API-SERVER   HOPS"),
        "{header}"
    );
    let prod = lines.next().unwrap();
    assert!(
        prod.ends_with(
            "attached   -              reachable    queue=1ms to-agent=3ms agent=6ms back=2ms"
        ),
        "{prod}"
    );
    let edge = lines.next().unwrap();
    assert!(
        edge.ends_with("none       registered     reachable    -"),
        "{edge}"
    );
}

#[test]
fn colour_paints_only_the_status_and_keeps_the_columns_aligned() {
    let plain = render_table(&snapshot(), false, now(), false);
    let coloured = render_table(&snapshot(), false, now(), true);
    assert!(coloured.contains("\x1b[32mReady\x1b[0m"), "{coloured}");
    assert!(coloured.contains("\x1b[31mStale\x1b[0m"), "{coloured}");
    let stripped = coloured
        .replace("\x1b[32m", "")
        .replace("\x1b[31m", "")
        .replace("\x1b[0m", "");
    assert_eq!(stripped, plain);
}

#[test]
fn no_accounts_says_so() {
    let table = render_table(&Snapshot::default(), false, now(), false);
    assert_eq!(table, "No accounts.\n");
}

#[test]
fn health_names_every_problem() {
    let ok: Account = serde_json::from_value(healthy()).unwrap();
    assert_eq!(
        Health::of(&ok),
        Health {
            status: "Ready",
            problems: vec![]
        }
    );
    let gone: Account = serde_json::from_value(stale()).unwrap();
    let h = Health::of(&gone);
    assert_eq!(h.status, "Stale");
    assert_eq!(h.problems.len(), 1, "{h:?}");
    assert!(h.problems[0].contains("for 3m20s"), "{h:?}");

    let mut v = healthy();
    v["kindsSynced"] = json!(3);
    v["apiServer"] = json!({"reachable": false, "lastError": "connection refused"});
    v["registration"] = json!({"state": "retrying", "reason": "unreachable"});
    let h = Health::of(&serde_json::from_value(v).unwrap());
    assert_eq!(h.status, "Syncing");
    assert_eq!(h.problems.len(), 3, "{h:?}");
    assert!(h.problems[1].contains("connection refused"), "{h:?}");
    assert!(h.problems[2].contains("unreachable"), "{h:?}");

    let mut v = healthy();
    v["relay"] = json!(false);
    assert_eq!(
        Health::of(&serde_json::from_value(v).unwrap()).status,
        "NoRelay"
    );
    let mut v = healthy();
    v["state"] = json!("removed");
    v["online"] = json!(false);
    assert_eq!(
        Health::of(&serde_json::from_value(v).unwrap()).status,
        "Removed"
    );
}

#[test]
fn json_keeps_the_answers_and_adds_health_and_the_last_operation() {
    let v = snapshot().to_json("http://x");
    assert_eq!(v["healthy"], false);
    assert_eq!(v["accounts"][0]["name"], "prod");
    assert_eq!(v["accounts"][0]["health"]["status"], "Ready");
    assert_eq!(v["accounts"][0]["lastOperation"]["path"], "/api/v1/pods");
    assert_eq!(v["accounts"][1]["health"]["status"], "Stale");
    assert_eq!(v["accounts"][1]["lastOperation"], Value::Null);
    assert_eq!(v["accounts"][1]["offlineSeconds"], 200);
}

#[test]
fn durations_read_as_kubectl_ages() {
    for (secs, shown) in [
        (0, "0s"),
        (119, "119s"),
        (200, "3m20s"),
        (1500, "25m"),
        (5 * 3600 + 600, "5h10m"),
        (3 * 86_400, "3d"),
    ] {
        assert_eq!(human_duration(secs), shown);
    }
}

#[test]
fn servers_parse_with_or_without_a_scheme() {
    let s = Sidecar::parse("127.0.0.1:7002").unwrap();
    assert_eq!(
        (s.authority.as_str(), s.base.as_str()),
        ("127.0.0.1:7002", "")
    );
    let s = Sidecar::parse("http://localhost/prefix/").unwrap();
    assert_eq!(
        (s.authority.as_str(), s.base.as_str()),
        ("localhost:80", "/prefix")
    );
    let e = Sidecar::parse("https://x:1").err().unwrap().to_string();
    assert!(e.contains("only http://"), "{e}");
}

#[cfg(feature = "dev")]
#[test]
fn the_default_server_is_where_spinlink_dev_puts_the_facade() {
    assert_eq!(
        DEFAULT_SERVER,
        format!("http://{}", crate::dev::DEFAULT_FACADE_LISTEN)
    );
}
