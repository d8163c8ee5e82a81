//! An agent of the last release against today's gateway and sidecar: the
//! version skew docs/upgrading.md promises, run. The agent here speaks only
//! the released `spinlink.v1` ([`spinlink_compat`], generated from
//! `proto/released/spinlink.v1.binpb`), so it cannot send what was added
//! since — `CacheOpen.reports_synced`, `CacheSynced` — and today's
//! components must serve it as they did then.
//!
//! The sidecar and the gateway are the real `spinlink` binary; the agent is
//! written by hand (`support/released_agent.rs`), as the released agent
//! behaves on the wire, and driven here step by step: `Hello`, `Control`, a
//! `Cache` stream (discovery, one kind listed), a `Relay` stream answering
//! what the sidecar sends down, `Cache` again with resume, and a move to
//! another gateway when its gateway drains. `tests/e2e_rolling.rs` runs the
//! same agent on its own through rolling restarts.

mod support;

use std::net::SocketAddr;

use spinlink_compat::v1::control_event;
use spinlink_tls::dev::DevPki;
use support::released_agent::{Cluster, Connection, RELAYED_BODY, ReleasedAgent};
use support::scale::{Policy, Sidecar, account, gateway_yaml, start_gateway};
use support::{Proc, WAIT, http, wait_for};

/// The account the released agent serves.
const ACCOUNT: &str = "released";
/// Its agent id, and the name of its development certificate.
const AGENT: &str = "agent-1";

/// A sidecar and a gateway of today's build, the gateway letting
/// [`AGENT`] serve [`ACCOUNT`].
struct Deployment {
    tmp: tempfile::TempDir,
    pki: DevPki,
    sidecar: Sidecar,
    gateway: Proc,
    gateway_addr: SocketAddr,
}

impl Deployment {
    fn start() -> Deployment {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let pki = DevPki::ensure(&dir.join("pki"), &[AGENT]).unwrap();
        let store = format!("sqlite://{}", dir.join("sidecar.db").display());
        let sidecar = Sidecar::start(dir, "sidecar-1", &store, 15);
        let (gateway, gateway_addr) =
            start_gateway(dir, "gateway-1", &gateway_config(&pki, sidecar.tunnel));
        Deployment {
            tmp,
            pki,
            sidecar,
            gateway,
            gateway_addr,
        }
    }
}

/// A gateway of the deployment: a `Control` heartbeat every second, so the
/// agent sees one soon.
fn gateway_config(pki: &DevPki, sidecar_tunnel: SocketAddr) -> String {
    let policy: Policy = vec![(AGENT.to_owned(), vec![ACCOUNT.to_owned()])];
    let mut yaml = gateway_yaml("gateway", pki, &policy, &[sidecar_tunnel]);
    yaml.push_str("listener:\n  controlHeartbeatSeconds: 1\n");
    yaml
}

/// The next `Control` event, within [`WAIT`].
async fn control_event(conn: &mut Connection) -> control_event::Event {
    tokio::time::timeout(WAIT, conn.control.recv())
        .await
        .expect("a Control event within the wait")
        .expect("the Control stream stays open")
        .event
        .expect("an event in the ControlEvent")
}

/// Runs a blocking check (HTTP to the facade, polling) off the runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// The account as the sidecar's accounts API shows it, once it is online,
/// with its relay attached, discovery held and every kind its agent started
/// synced — the readiness an agent that never sends `CacheSynced` gets.
fn wait_ready(facade: SocketAddr) -> serde_json::Value {
    wait_for(&format!("account {ACCOUNT} to be ready"), || {
        let v = account(facade, ACCOUNT)?;
        let ready = v["online"] == true
            && v["relay"] == true
            && v["discovery"] == true
            && v["agentSynced"] == true
            && v["kindsTotal"] == 1
            && v["kindsSynced"] == 1;
        ready.then_some(v)
    })
}

/// `GET path` through the facade until the body contains `want`.
fn wait_read(facade: SocketAddr, path: &str, want: &str) -> String {
    wait_for(&format!("{path} to show {want}"), || {
        let (status, body) = http(facade, "GET", &format!("/accounts/{ACCOUNT}{path}"), &[]);
        (status == 200 && body.contains(want)).then_some(body)
    })
}

const CONFIGMAPS: &str = "/api/v1/namespaces/demo/configmaps";
const LOGS: &str = "/api/v1/namespaces/demo/pods/web-0/log";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_agent_is_served_by_todays_gateway_and_sidecar() {
    let d = blocking(Deployment::start).await;
    let facade = d.sidecar.facade;
    let agent = ReleasedAgent::new(&d.pki, AGENT, ACCOUNT, Cluster::default());

    // Hello grants a channel token (checked in `connect`); Control carries
    // the gateway's heartbeats to an agent that knows only the released
    // events.
    let mut conn = agent.connect(d.gateway_addr.port()).await;
    match control_event(&mut conn).await {
        control_event::Event::Heartbeat(h) => assert!(h.unix_millis > 0, "{h:?}"),
        other => panic!("a heartbeat first, not {other:?}"),
    }

    // Cache: a sidecar that holds nothing resumes nothing; the agent lists.
    let (cache, resume) = agent.open_cache(&mut conn).await;
    assert!(resume.kinds.is_empty(), "nothing held yet: {resume:?}");
    agent.list(7, "blue");
    let relay = agent.serve_relay(&mut conn).await;

    // Ready without `CacheSynced`: the released agent cannot send it, so
    // the sidecar judges by the kinds it started, as the policy promises.
    let status = blocking(move || wait_ready(facade)).await;
    assert_eq!(status["objects"], 1, "{status}");

    // A read answered from that cache, not relayed to the agent.
    let body = blocking(move || wait_read(facade, CONFIGMAPS, r#""colour":"blue""#)).await;
    assert!(body.contains("web-config"), "{body}");
    assert_eq!(agent.relayed("configmaps"), Vec::<String>::new());

    // Relay: what the cache cannot answer reaches the released agent, and
    // its answer reaches the facade's client.
    let (status, body) =
        blocking(move || http(facade, "GET", &format!("/accounts/{ACCOUNT}{LOGS}"), &[])).await;
    assert_eq!((status, body.as_str()), (200, RELAYED_BODY));
    assert_eq!(agent.relayed("/log"), vec![format!("GET {LOGS}")]);

    // Cache again, with resume: the sidecar names the kind at the listing's
    // resourceVersion, so the agent goes on from there with watch events
    // and lists nothing.
    drop(cache);
    let (mut cache, resume) = agent.open_cache(&mut conn).await;
    let held: Vec<(String, String)> = resume
        .kinds
        .iter()
        .map(|kv| {
            let kind = kv.kind.clone().unwrap_or_default();
            (kind.resource, kv.resource_version.clone())
        })
        .collect();
    assert_eq!(held, vec![("configmaps".to_owned(), "7".to_owned())]);
    agent.modified(8, "green");
    blocking(move || wait_read(facade, CONFIGMAPS, r#""colour":"green""#)).await;
    let status = blocking(move || wait_ready(facade)).await;
    assert_eq!(status["objects"], 1, "{status}");
    assert_eq!(agent.relayed("configmaps"), Vec::<String>::new());
    cache.asked_nothing();

    // Drain: the gateway asks the released agent to move (`Reconnect`); it
    // dials another gateway, opens its relay stream there, then its cache
    // stream (resuming), and only then lets the old connection go.
    let dir = d.tmp.path().to_owned();
    let pki = d.pki.clone();
    let sidecar_tunnel = d.sidecar.tunnel;
    let (_gateway2, addr2) =
        blocking(move || start_gateway(&dir, "gateway-2", &gateway_config(&pki, sidecar_tunnel)))
            .await;
    let mut gateway1 = d.gateway;
    let drained = tokio::task::spawn_blocking(move || gateway1.terminate());
    let reconnect = loop {
        match control_event(&mut conn).await {
            control_event::Event::Reconnect(r) => break r,
            control_event::Event::Heartbeat(_) => {}
        }
    };
    assert_eq!(reconnect.reason, "draining", "{reconnect:?}");
    assert!(reconnect.deadline_millis > 0, "{reconnect:?}");
    let mut moved = agent.connect(addr2.port()).await;
    let _relay = agent.serve_relay(&mut moved).await;
    let (_cache, resume) = agent.open_cache(&mut moved).await;
    let held: Vec<String> = resume
        .kinds
        .iter()
        .map(|kv| kv.resource_version.clone())
        .collect();
    assert_eq!(held, vec!["8".to_owned()], "{resume:?}");
    drop((cache, relay, conn));
    let status = drained.await.unwrap();
    assert!(
        status.success(),
        "the drained gateway exits cleanly: {status}"
    );

    // Served through the new gateway: ready, the cache answers, the relay
    // reaches the agent on its new connection.
    blocking(move || wait_ready(facade)).await;
    blocking(move || wait_read(facade, CONFIGMAPS, r#""colour":"green""#)).await;
    let (status, body) =
        blocking(move || http(facade, "GET", &format!("/accounts/{ACCOUNT}{LOGS}"), &[])).await;
    assert_eq!((status, body.as_str()), (200, RELAYED_BODY));
    assert_eq!(agent.relayed("/log").len(), 2);
    assert_eq!(agent.relayed("configmaps"), Vec::<String>::new());
}
