//! An agent of the last release against today's gateway and sidecar: the
//! version skew docs/upgrading.md promises, run. The agent here speaks only
//! the released `spinlink.v1` ([`spinlink_compat`], generated from
//! `proto/released/spinlink.v1.binpb`), so it cannot send what was added
//! since — `CacheOpen.reports_synced`, `CacheSynced` — and today's
//! components must serve it as they did then.
//!
//! The sidecar and the gateway are the real `spinlink` binary; the agent is
//! written by hand in this file, as the released agent behaves on the wire
//! (the bench's simulated agent does the same with today's types): `Hello`,
//! `Control`, a `Cache` stream (discovery, one kind listed), a `Relay`
//! stream answering what the sidecar sends down, `Cache` again with resume,
//! and a move to another gateway when its gateway drains.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use spinlink_compat::v1::tunnel_client::TunnelClient;
use spinlink_compat::v1::{
    AccountInfo, BodyChunk, CacheDown, CacheOpen, CacheUp, ControlEvent, ControlRequest,
    DiscoverySnapshot, Document, Header, HelloRequest, Kind, RelayOpen, RelayUp, ResponseHead,
    ResumeFrom, SyncEnd, SyncStart, WatchEvent, cache_down, cache_up, control_event, relay_down,
    relay_up, watch_event,
};
use spinlink_tls::config::{ALPN_H2, ClientFiles, client_config};
use spinlink_tls::dev::DevPki;
use support::scale::{Policy, Sidecar, account, gateway_yaml, start_gateway};
use support::{Proc, WAIT, http, wait_for};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::{Channel, Endpoint};

/// The account the released agent serves.
const ACCOUNT: &str = "released";
/// Its agent id, and the name of its development certificate.
const AGENT: &str = "agent-1";
/// What the released agent answers every relayed request with.
const RELAYED_BODY: &str = "answered by the released agent\n";

/// The one kind the agent watches. This and [`discovery`] are what the
/// bench's simulated agent sends too, written again in the released types:
/// that they are not today's is the point of this file.
fn configmaps() -> Kind {
    Kind {
        group: String::new(),
        version: "v1".into(),
        resource: "configmaps".into(),
        kind: "ConfigMap".into(),
        namespaced: true,
    }
}

/// Discovery for [`configmaps`] only.
fn discovery() -> DiscoverySnapshot {
    let doc = |path: &str, body: &str| Document {
        path: path.into(),
        content_type: "application/json".into(),
        body: body.as_bytes().to_vec(),
    };
    DiscoverySnapshot {
        documents: vec![
            doc("/api", r#"{"kind":"APIVersions","versions":["v1"]}"#),
            doc(
                "/api/v1",
                r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["get","list","watch"]}]}"#,
            ),
            doc(
                "/apis",
                r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#,
            ),
        ],
    }
}

/// ConfigMap `demo/web-config` at `rv`, its one key set to `value`.
fn config_map(rv: u64, value: &str) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"web-config","namespace":"demo","uid":"7d1e0c2a-released","resourceVersion":"{rv}"}},"data":{{"colour":"{value}"}}}}"#
    )
    .into_bytes()
}

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

/// One connection of the released agent to a gateway: its client, the
/// channel token `Hello` granted, and its `Control` events.
struct Connection {
    client: TunnelClient<Channel>,
    token: String,
    control: mpsc::Receiver<ControlEvent>,
    /// Reads `Control`; dropped with the connection, as the agent lets it go.
    _control_reader: AbortOnDropHandle<()>,
}

/// The released agent: the cache stream's sequence number (across streams,
/// as the protocol says) and what the sidecar relayed to it.
struct ReleasedAgent {
    pki: DevPki,
    seq: u64,
    relayed: Arc<Mutex<Vec<String>>>,
}

/// An open `Cache` stream: where messages go up, and what came down besides
/// acks and heartbeats.
struct CacheStream {
    up: mpsc::Sender<CacheUp>,
    down: mpsc::Receiver<cache_down::Msg>,
    /// Reads the stream; dropped with it, which ends the stream.
    _reader: AbortOnDropHandle<()>,
}

impl CacheStream {
    /// Asserts the sidecar asked for nothing on this stream since
    /// `ResumeFrom` (a `Resync` would make the agent list again).
    fn asked_nothing(&mut self) {
        let asked = self.down.try_recv();
        assert!(
            matches!(asked, Err(mpsc::error::TryRecvError::Empty)),
            "the sidecar asked the released agent for {asked:?}"
        );
    }
}

/// An open `Relay` stream, answered until dropped.
struct RelayStream {
    _answers: AbortOnDropHandle<()>,
}

impl ReleasedAgent {
    /// Dials the gateway at `port` as the agent does (TLS with its client
    /// certificate, ALPN h2), says `Hello` and opens `Control`.
    async fn connect(&self, port: u16) -> Connection {
        let ca = self.pki.ca_cert();
        let cert = self.pki.cert(&format!("agent-{AGENT}"));
        let key = self.pki.key(&format!("agent-{AGENT}"));
        let tls = client_config(
            ClientFiles {
                ca: &ca,
                identity: Some((&cert, &key)),
            },
            &[ALPN_H2],
        )
        .unwrap();
        let connector = spinlink_agent::connection::connector::Connector::tls(
            Arc::new(tls),
            "localhost".try_into().unwrap(),
        );
        let channel = Endpoint::from_shared(format!("https://localhost:{port}"))
            .unwrap()
            .connect_with_connector(connector)
            .await
            .unwrap();
        let mut client = TunnelClient::new(channel);
        let hello = client
            .hello(HelloRequest {
                agent_id: AGENT.into(),
                agent_version: "released".into(),
                accounts: vec![AccountInfo {
                    name: ACCOUNT.into(),
                    kinds: vec!["/v1/configmaps".into()],
                    kubernetes_version: "v1.30.0".into(),
                    ..AccountInfo::default()
                }],
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            hello.refused.is_empty(),
            "Hello refused: {:?}",
            hello.refused
        );
        let grant = hello
            .granted
            .iter()
            .find(|g| g.account == ACCOUNT)
            .unwrap_or_else(|| panic!("no channel token for {ACCOUNT}: {hello:?}"));
        assert!(!grant.token.is_empty());
        let token = grant.token.clone();

        let mut events = client
            .control(ControlRequest {
                agent_id: AGENT.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let (tx, control) = mpsc::channel(16);
        let reader = tokio::spawn(async move {
            while let Ok(Some(event)) = events.message().await {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        });
        Connection {
            client,
            token,
            control,
            _control_reader: AbortOnDropHandle::new(reader),
        }
    }

    fn next(&mut self, msg: cache_up::Msg) -> CacheUp {
        self.seq += 1;
        CacheUp {
            seq: self.seq,
            msg: Some(msg),
        }
    }

    /// Opens a `Cache` stream as the released agent does (`open`, then
    /// discovery) and returns it with the sidecar's first word, `ResumeFrom`.
    async fn open_cache(&mut self, conn: &mut Connection) -> (CacheStream, ResumeFrom) {
        let (up, rx) = mpsc::channel(64);
        let open = self.next(cache_up::Msg::Open(CacheOpen {
            account: ACCOUNT.into(),
            agent_id: AGENT.into(),
            ..CacheOpen::default()
        }));
        let snapshot = self.next(cache_up::Msg::Discovery(discovery()));
        up.send(open).await.unwrap();
        up.send(snapshot).await.unwrap();
        let request = stream_request(ReceiverStream::new(rx), &conn.token);
        let mut stream = conn.client.cache(request).await.unwrap().into_inner();
        let (tx, mut down) = mpsc::channel(16);
        let reader = tokio::spawn(async move {
            while let Ok(Some(CacheDown { msg: Some(msg) })) = stream.message().await {
                let quiet = matches!(msg, cache_down::Msg::Ack(_) | cache_down::Msg::Heartbeat(_));
                if !quiet && tx.send(msg).await.is_err() {
                    return;
                }
            }
        });
        let first = tokio::time::timeout(WAIT, down.recv())
            .await
            .expect("the sidecar answers the cache stream")
            .expect("the cache stream stays open");
        let cache_down::Msg::Resume(resume) = first else {
            panic!("the sidecar's first word is ResumeFrom, not {first:?}");
        };
        (
            CacheStream {
                up,
                down,
                _reader: AbortOnDropHandle::new(reader),
            },
            resume,
        )
    }

    /// A full listing of [`configmaps`] at `rv`: `SyncStart`, the one
    /// object, `SyncEnd`.
    async fn list(&mut self, cache: &CacheStream, rv: u64, value: &str) {
        let messages = [
            cache_up::Msg::SyncStart(SyncStart {
                kind: Some(configmaps()),
            }),
            cache_up::Msg::Event(WatchEvent {
                r#type: watch_event::Type::Added.into(),
                kind: Some(configmaps()),
                resource_version: rv.to_string(),
                object: config_map(rv, value),
            }),
            cache_up::Msg::SyncEnd(SyncEnd {
                kind: Some(configmaps()),
                resource_version: rv.to_string(),
            }),
        ];
        for m in messages {
            let m = self.next(m);
            cache.up.send(m).await.unwrap();
        }
    }

    /// A watch event: the ConfigMap changed at `rv`.
    async fn modified(&mut self, cache: &CacheStream, rv: u64, value: &str) {
        let m = self.next(cache_up::Msg::Event(WatchEvent {
            r#type: watch_event::Type::Modified.into(),
            kind: Some(configmaps()),
            resource_version: rv.to_string(),
            object: config_map(rv, value),
        }));
        cache.up.send(m).await.unwrap();
    }

    /// Opens the `Relay` stream and answers every request that comes down
    /// with [`RELAYED_BODY`], recording `METHOD path` of each.
    async fn serve_relay(&self, conn: &mut Connection) -> RelayStream {
        let (up, rx) = mpsc::channel(64);
        up.send(RelayUp {
            msg: Some(relay_up::Msg::Open(RelayOpen {
                account: ACCOUNT.into(),
                agent_id: AGENT.into(),
            })),
        })
        .await
        .unwrap();
        let request = stream_request(ReceiverStream::new(rx), &conn.token);
        let mut down = conn.client.relay(request).await.unwrap().into_inner();
        let relayed = self.relayed.clone();
        let task = tokio::spawn(async move {
            while let Ok(Some(message)) = down.message().await {
                let Some(relay_down::Msg::Head(head)) = message.msg else {
                    continue;
                };
                relayed
                    .lock()
                    .unwrap()
                    .push(format!("{} {}", head.method, head.path));
                let answer = [
                    relay_up::Msg::Head(ResponseHead {
                        id: head.id,
                        status: 200,
                        headers: vec![Header {
                            name: "content-type".into(),
                            value: b"text/plain".to_vec(),
                        }],
                        ..ResponseHead::default()
                    }),
                    relay_up::Msg::Body(BodyChunk {
                        id: head.id,
                        data: RELAYED_BODY.as_bytes().to_vec(),
                        end_stream: true,
                    }),
                ];
                for msg in answer {
                    if up.send(RelayUp { msg: Some(msg) }).await.is_err() {
                        return;
                    }
                }
            }
        });
        RelayStream {
            _answers: AbortOnDropHandle::new(task),
        }
    }

    /// The relayed requests whose path names `what`.
    fn relayed(&self, what: &str) -> Vec<String> {
        let relayed = self.relayed.lock().unwrap();
        relayed
            .iter()
            .filter(|r| r.contains(what))
            .cloned()
            .collect()
    }
}

/// A stream request with the released stream metadata: the account and the
/// channel token, in the headers the released protocol names.
fn stream_request<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let md = request.metadata_mut();
    md.insert("spinlink-account", ACCOUNT.parse().unwrap());
    md.insert("spinlink-token", token.parse().unwrap());
    request
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
    let mut agent = ReleasedAgent {
        pki: d.pki.clone(),
        seq: 0,
        relayed: Arc::default(),
    };

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
    agent.list(&cache, 7, "blue").await;
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
    agent.modified(&cache, 8, "green").await;
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
