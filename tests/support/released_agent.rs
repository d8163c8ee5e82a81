//! An agent of the last release, written by hand: it speaks only the released
//! `spinlink.v1` ([`spinlink_compat`], generated from
//! `proto/released/spinlink.v1.binpb`), so it cannot send what was added
//! since — `CacheOpen.reports_synced`, `CacheSynced` — and today's gateway
//! and sidecar must serve it as they did then.
//!
//! It behaves on the wire as the released agent does (the bench's simulated
//! agent does the same with today's types), and can be driven two ways:
//!
//! - step by step (`tests/e2e_released_agent.rs`): [`ReleasedAgent::connect`]
//!   (`Hello`, `Control`), [`ReleasedAgent::open_cache`] (`open`, then the
//!   sidecar's `ResumeFrom`), [`ReleasedAgent::list`] and
//!   [`ReleasedAgent::modified`] (numbered messages through its window of
//!   unacknowledged ones), [`ReleasedAgent::serve_relay`] — each step's
//!   answer checked by the test;
//! - on its own ([`ReleasedAgent::spawn`], `tests/e2e_rolling.rs`), serving a
//!   small in-memory cluster ([`Cluster`]: ConfigMaps) as the released agent
//!   serves a real one: it dials, says `Hello`, opens `Control`, `Relay`, then
//!   `Cache` — replaying its unacknowledged window, resuming the kinds the
//!   sidecar's `ResumeFrom` names and listing the others, listing again on
//!   `Resync` — answers relayed reads and writes from the cluster (a write's
//!   watch event goes up the `Cache` stream, as its watch would see it),
//!   moves to a new connection when its gateway sends `Reconnect` (relay
//!   first, then cache; the old connection finishes its relayed requests and
//!   is let go), and dials again after a backoff when a stream or its
//!   connection ends.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use spinlink_compat::v1::tunnel_client::TunnelClient;
use spinlink_compat::v1::{
    AccountInfo, BodyChunk, CacheDown, CacheOpen, CacheUp, ControlEvent, ControlRequest,
    DiscoverySnapshot, Document, Header, HelloRequest, Kind, RelayOpen, RelayUp, ResponseHead,
    ResumeFrom, SyncEnd, SyncStart, WatchEvent, cache_down, cache_up, control_event, relay_down,
    relay_up, watch_event,
};
use spinlink_tls::config::{ALPN_H2, ClientFiles, client_config};
use spinlink_tls::dev::DevPki;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::{Channel, Endpoint};

use super::WAIT;

/// What the released agent answers a relayed request for a pod's log with.
pub const RELAYED_BODY: &str = "answered by the released agent\n";
/// The version it states in `Hello`.
pub const AGENT_VERSION: &str = "released";
/// The namespace of its cluster's ConfigMaps.
pub const NAMESPACE: &str = "demo";

/// A draining relay stream ends once nothing is in flight and nothing has
/// arrived for this long (the released agent's `DRAIN_QUIET`): requests the
/// sidecar sent before it switched to the new stream are still on the way.
const DRAIN_QUIET: Duration = Duration::from_millis(500);
/// The longest an old connection is kept for its relayed requests.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// Redial backoff: the end-to-end tests' agents use 100 ms to 1 s.
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The one kind the agent watches. This and [`discovery`] are what the
/// bench's simulated agent sends too, written again in the released types:
/// that they are not today's is the point of this file.
pub fn configmaps() -> Kind {
    Kind {
        group: String::new(),
        version: "v1".into(),
        resource: "configmaps".into(),
        kind: "ConfigMap".into(),
        namespaced: true,
    }
}

/// Discovery for [`configmaps`] only.
pub fn discovery() -> DiscoverySnapshot {
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
                r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["create","delete","get","list","patch","update","watch"],"shortNames":["cm"]}]}"#,
            ),
            doc(
                "/apis",
                r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#,
            ),
        ],
    }
}

/// ConfigMap `demo/web-config` at `rv`, its one key set to `value`.
pub fn config_map(rv: u64, value: &str) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"web-config","namespace":"demo","uid":"7d1e0c2a-released","resourceVersion":"{rv}"}},"data":{{"colour":"{value}"}}}}"#
    )
    .into_bytes()
}

/// A watch event of [`configmaps`].
fn event(r#type: watch_event::Type, rv: u64, object: Vec<u8>) -> cache_up::Msg {
    cache_up::Msg::Event(WatchEvent {
        r#type: r#type.into(),
        kind: Some(configmaps()),
        resource_version: rv.to_string(),
        object,
    })
}

// ---- The cluster it serves ------------------------------------------------

/// A cluster of ConfigMaps in memory, with the API server's semantics the
/// released agent's relay and watch need: resourceVersions from one counter,
/// every change kept (a watch resumes from any of them), reads and writes
/// answered as the API server answers them (JSON, `metav1.Status` errors).
#[derive(Clone)]
pub struct Cluster {
    state: Arc<Mutex<ClusterState>>,
    /// The current resourceVersion, for watches to wait on.
    changed: watch::Sender<u64>,
}

struct ClusterState {
    rv: u64,
    /// (namespace, name) → object.
    objects: BTreeMap<(String, String), Value>,
    /// Every change: resourceVersion, type, object. Kept whole: a test's
    /// cluster changes a few hundred times.
    history: Vec<(u64, watch_event::Type, Vec<u8>)>,
    /// The resourceVersion the history starts after.
    start: u64,
}

/// An answer to a relayed request: status, content type, body.
pub type Answer = (u32, &'static str, Vec<u8>);

impl Default for Cluster {
    fn default() -> Self {
        Cluster::new(&[("web-config", &[("colour", "blue")])])
    }
}

impl Cluster {
    /// A cluster holding ConfigMaps `(name, data)` in [`NAMESPACE`].
    pub fn new(config_maps: &[(&str, &[(&str, &str)])]) -> Cluster {
        let mut state = ClusterState {
            rv: 1000,
            objects: BTreeMap::new(),
            history: Vec::new(),
            start: 0,
        };
        for (name, data) in config_maps {
            let data: serde_json::Map<String, Value> = data
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
                .collect();
            let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE}, "data": data});
            state.store(watch_event::Type::Added, NAMESPACE, name, object);
        }
        state.start = state.rv;
        state.history.clear();
        let (changed, _) = watch::channel(state.rv);
        Cluster {
            state: Arc::new(Mutex::new(state)),
            changed,
        }
    }

    /// Every object and the resourceVersion of the listing.
    fn list(&self) -> (u64, Vec<Vec<u8>>) {
        let state = self.state.lock().unwrap();
        let objects = state
            .objects
            .values()
            .map(|o| o.to_string().into())
            .collect();
        (state.rv, objects)
    }

    /// The changes after `rv` and the resourceVersion they end at; `None`
    /// when `rv` is not a position of this cluster's history (the API
    /// server's 410 Gone: the watcher lists).
    fn changes_after(&self, rv: u64) -> Option<(u64, Vec<cache_up::Msg>)> {
        let state = self.state.lock().unwrap();
        if rv < state.start || rv > state.rv {
            return None;
        }
        let changes = state
            .history
            .iter()
            .filter(|(at, ..)| *at > rv)
            .map(|(at, t, object)| event(*t, *at, object.clone()))
            .collect();
        Some((state.rv, changes))
    }

    /// The value of `key` in ConfigMap `name`'s data, if it is there.
    pub fn data(&self, name: &str, key: &str) -> Option<String> {
        let state = self.state.lock().unwrap();
        let object = state
            .objects
            .get(&(NAMESPACE.to_owned(), name.to_owned()))?;
        object["data"][key].as_str().map(str::to_owned)
    }

    /// Answers one relayed request as the API server would.
    pub fn answer(&self, method: &str, path: &str, headers: &[Header], body: &[u8]) -> Answer {
        if path.ends_with("/log") {
            return (200, "text/plain", RELAYED_BODY.as_bytes().to_vec());
        }
        if path == "/version" {
            let version = json!({"major": "1", "minor": "30", "gitVersion": "v1.30.0",
                "platform": "linux/amd64"});
            return (200, "application/json", version.to_string().into_bytes());
        }
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (namespace, name) = match segments[..] {
            ["api", "v1", "configmaps"] => (None, None),
            ["api", "v1", "namespaces", ns, "configmaps"] => (Some(ns), None),
            ["api", "v1", "namespaces", ns, "configmaps", name] => (Some(ns), Some(name)),
            _ => {
                return status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                );
            }
        };
        let content_type = headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-type"))
            .map(|h| String::from_utf8_lossy(&h.value).into_owned())
            .unwrap_or_default();
        let mut state = self.state.lock().unwrap();
        let before = state.rv;
        let answer = match (method, namespace, name) {
            ("GET", ns, None) => {
                let items: Vec<&Value> = state
                    .objects
                    .iter()
                    .filter(|((n, _), _)| ns.is_none_or(|ns| n.as_str() == ns))
                    .map(|(_, o)| o)
                    .collect();
                let list = json!({"apiVersion": "v1", "kind": "ConfigMapList",
                    "metadata": {"resourceVersion": state.rv.to_string()}, "items": items});
                (200, "application/json", list.to_string().into_bytes())
            }
            ("GET", Some(ns), Some(name)) => match state.get(ns, name) {
                Some(o) => (200, "application/json", o.to_string().into_bytes()),
                None => not_found(name),
            },
            ("POST", Some(ns), None) => match serde_json::from_slice::<Value>(body) {
                Ok(object) => {
                    let name = object["metadata"]["name"].as_str().unwrap_or_default();
                    if name.is_empty() {
                        status(422, "Invalid", "metadata.name: Required value")
                    } else if state.get(ns, name).is_some() {
                        status(
                            409,
                            "AlreadyExists",
                            &format!("configmaps {name:?} already exists"),
                        )
                    } else {
                        let name = name.to_owned();
                        let stored = state.store(watch_event::Type::Added, ns, &name, object);
                        (201, "application/json", stored.to_string().into_bytes())
                    }
                }
                Err(e) => status(400, "BadRequest", &e.to_string()),
            },
            ("PUT" | "PATCH", Some(ns), Some(name)) => {
                let Some(mut object) = state.get(ns, name).cloned() else {
                    return not_found(name);
                };
                let merge = content_type.starts_with("application/merge-patch+json")
                    || content_type.starts_with("application/strategic-merge-patch+json");
                let change = match serde_json::from_slice::<Value>(body) {
                    Ok(_) if method == "PATCH" && !merge => Err(status(
                        415,
                        "UnsupportedMediaType",
                        &format!(
                            "the body of the request was in an unknown format: {content_type}"
                        ),
                    )),
                    Ok(patch) if method == "PATCH" => {
                        // A ConfigMap has no lists a strategic merge patch
                        // treats differently: both are a JSON merge patch.
                        merge_patch(&mut object, &patch);
                        Ok(object)
                    }
                    Ok(replacement) => Ok(replacement),
                    Err(e) => Err(status(400, "BadRequest", &e.to_string())),
                };
                match change {
                    Ok(object) => {
                        let stored = state.store(watch_event::Type::Modified, ns, name, object);
                        (200, "application/json", stored.to_string().into_bytes())
                    }
                    Err(answer) => answer,
                }
            }
            _ => status(
                405,
                "MethodNotAllowed",
                &format!("{method} is not supported here"),
            ),
        };
        let rv = state.rv;
        drop(state);
        if rv != before {
            self.changed.send_replace(rv);
        }
        answer
    }
}

impl ClusterState {
    fn get(&self, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Stores `object` at the next resourceVersion and records the change.
    fn store(
        &mut self,
        t: watch_event::Type,
        namespace: &str,
        name: &str,
        mut object: Value,
    ) -> Value {
        self.rv += 1;
        let meta = &mut object["metadata"];
        meta["name"] = name.into();
        meta["namespace"] = namespace.into();
        meta["uid"] = format!("released-{namespace}-{name}").into();
        meta["resourceVersion"] = self.rv.to_string().into();
        meta["creationTimestamp"] = "2026-01-01T00:00:00Z".into();
        object["apiVersion"] = "v1".into();
        object["kind"] = "ConfigMap".into();
        self.history
            .push((self.rv, t, object.to_string().into_bytes()));
        self.objects
            .insert((namespace.to_owned(), name.to_owned()), object.clone());
        object
    }
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// A `metav1.Status` failure, as the API server writes it.
fn status(code: u32, reason: &str, message: &str) -> Answer {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    (code, "application/json", body.to_string().into_bytes())
}

fn not_found(name: &str) -> Answer {
    status(404, "NotFound", &format!("configmaps {name:?} not found"))
}

// ---- The agent -------------------------------------------------------------

/// The window of numbered cache messages not yet acknowledged, across
/// streams (as the protocol numbers them). Unbounded: a test's run sends a
/// few hundred messages, and the sidecar acknowledges every 100 ms.
#[derive(Default)]
struct Outbox {
    state: Mutex<OutboxState>,
    /// The highest number given out, for the streams sending the window.
    pushed: watch::Sender<u64>,
}

#[derive(Default)]
struct OutboxState {
    last: u64,
    acked: u64,
    unacked: VecDeque<CacheUp>,
}

impl Outbox {
    fn push(&self, msg: cache_up::Msg) {
        let mut state = self.state.lock().unwrap();
        state.last += 1;
        let seq = state.last;
        state.unacked.push_back(CacheUp {
            seq,
            msg: Some(msg),
        });
        drop(state);
        self.pushed.send_replace(seq);
    }

    fn ack(&self, seq: u64) {
        let mut state = self.state.lock().unwrap();
        state.acked = state.acked.max(seq);
        while state.unacked.front().is_some_and(|m| m.seq <= seq) {
            state.unacked.pop_front();
        }
    }

    fn acked(&self) -> u64 {
        self.state.lock().unwrap().acked
    }

    /// The unacknowledged messages numbered after `seq`.
    fn after(&self, seq: u64) -> Vec<CacheUp> {
        let state = self.state.lock().unwrap();
        state
            .unacked
            .iter()
            .filter(|m| m.seq > seq)
            .cloned()
            .collect()
    }
}

/// What the agent did on its own, for the test to check.
#[derive(Default, Debug)]
pub struct Stats {
    /// Connections on which `Hello` was answered.
    pub connections: AtomicUsize,
    /// `Reconnect`s from its gateways.
    pub reconnects: AtomicUsize,
    /// Moves to a new connection on a `Reconnect` (one that failed — the
    /// new connection's cache stream refused, say — is a dial again).
    pub moves: AtomicUsize,
    /// Cache streams opened.
    pub cache_streams: AtomicUsize,
    /// Cache streams on which it resumed from the sidecar's `ResumeFrom`.
    pub resumed: AtomicUsize,
    /// Full listings sent (the first, and any the sidecar could not resume).
    pub listings: AtomicUsize,
    /// `Resync` requests received.
    pub resyncs: AtomicUsize,
}

impl Stats {
    fn bump(counter: &AtomicUsize) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::Relaxed)
    }
}

/// The released agent: its identity, the account it serves, its window of
/// cache messages, the cluster its relay answers from and what was relayed
/// to it. Clones share all of it.
#[derive(Clone)]
pub struct ReleasedAgent {
    pki: DevPki,
    /// Agent id, and the name of its development certificate.
    pub agent: String,
    /// The account it serves.
    pub account: String,
    /// The cluster behind the account.
    pub cluster: Cluster,
    /// What it did when running on its own.
    pub stats: Arc<Stats>,
    outbox: Arc<Outbox>,
    relayed: Arc<Mutex<Vec<String>>>,
}

/// One connection of the released agent to a gateway: its client, the
/// channel token `Hello` granted, and its `Control` events.
pub struct Connection {
    client: TunnelClient<Channel>,
    token: String,
    /// The `Control` events, until the stream ends.
    pub control: mpsc::Receiver<ControlEvent>,
    /// Reads `Control`; dropped with the connection, as the agent lets it go.
    _control_reader: AbortOnDropHandle<()>,
}

/// An open `Cache` stream: what came down besides acks and heartbeats (acks
/// free the agent's window). Dropping it ends the stream.
pub struct CacheStream {
    down: mpsc::Receiver<cache_down::Msg>,
    /// Cancelled when the sidecar's side of the stream ends.
    ended: CancellationToken,
    _sender: AbortOnDropHandle<()>,
    _reader: AbortOnDropHandle<()>,
}

impl CacheStream {
    /// Asserts the sidecar asked for nothing on this stream since
    /// `ResumeFrom` (a `Resync` would make the agent list again).
    pub fn asked_nothing(&mut self) {
        let asked = self.down.try_recv();
        assert!(
            matches!(asked, Err(mpsc::error::TryRecvError::Empty)),
            "the sidecar asked the released agent for {asked:?}"
        );
    }
}

/// An open `Relay` stream, answered until it is dropped, or drained.
pub struct RelayStream {
    drain: CancellationToken,
    /// Cancelled when the sidecar's side of the stream ends.
    ended: CancellationToken,
    task: AbortOnDropHandle<()>,
}

impl RelayStream {
    /// Stops taking requests once those in flight are answered and the
    /// stream has been quiet for [`DRAIN_QUIET`], then ends it; waits for
    /// that at most [`DRAIN_GRACE`].
    async fn drained(self) {
        self.drain.cancel();
        let _ = tokio::time::timeout(DRAIN_GRACE, self.task).await;
    }
}

/// A stream request with the released stream metadata: the account and the
/// channel token, in the headers the released protocol names.
fn stream_request<T>(message: T, account: &str, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let md = request.metadata_mut();
    md.insert("spinlink-account", account.parse().unwrap());
    md.insert("spinlink-token", token.parse().unwrap());
    request
}

impl ReleasedAgent {
    /// Agent `agent` (its certificate in `pki`) serving `account`, whose
    /// cluster is `cluster`.
    pub fn new(pki: &DevPki, agent: &str, account: &str, cluster: Cluster) -> ReleasedAgent {
        ReleasedAgent {
            pki: pki.clone(),
            agent: agent.to_owned(),
            account: account.to_owned(),
            cluster,
            stats: Arc::default(),
            outbox: Arc::default(),
            relayed: Arc::default(),
        }
    }

    /// Dials the gateway at `port` as the agent does (TLS with its client
    /// certificate, ALPN h2), says `Hello` and opens `Control`.
    pub async fn connect(&self, port: u16) -> Connection {
        self.try_connect(port)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn try_connect(&self, port: u16) -> Result<Connection, String> {
        let ca = self.pki.ca_cert();
        let cert = self.pki.cert(&format!("agent-{}", self.agent));
        let key = self.pki.key(&format!("agent-{}", self.agent));
        let tls = client_config(
            ClientFiles {
                ca: &ca,
                identity: Some((&cert, &key)),
            },
            &[ALPN_H2],
        )
        .map_err(|e| format!("TLS configuration: {e}"))?;
        let connector = spinlink_agent::connection::connector::Connector::tls(
            Arc::new(tls),
            "localhost".try_into().unwrap(),
        );
        let channel = Endpoint::from_shared(format!("https://localhost:{port}"))
            .unwrap()
            .connect_with_connector(connector)
            .await
            .map_err(|e| format!("dialling the gateway: {e}"))?;
        let mut client = TunnelClient::new(channel);
        let hello = client
            .hello(HelloRequest {
                agent_id: self.agent.clone(),
                agent_version: AGENT_VERSION.into(),
                accounts: vec![AccountInfo {
                    name: self.account.clone(),
                    kinds: vec!["/v1/configmaps".into()],
                    kubernetes_version: "v1.30.0".into(),
                    ..AccountInfo::default()
                }],
            })
            .await
            .map_err(|e| format!("Hello: {e}"))?
            .into_inner();
        if !hello.refused.is_empty() {
            return Err(format!("Hello refused: {:?}", hello.refused));
        }
        let grant = hello
            .granted
            .iter()
            .find(|g| g.account == self.account)
            .ok_or_else(|| format!("no channel token for {}: {hello:?}", self.account))?;
        if grant.token.is_empty() {
            return Err(format!("an empty channel token: {hello:?}"));
        }
        let token = grant.token.clone();

        let mut events = client
            .control(ControlRequest {
                agent_id: self.agent.clone(),
            })
            .await
            .map_err(|e| format!("Control: {e}"))?
            .into_inner();
        let (tx, control) = mpsc::channel(16);
        let reader = tokio::spawn(async move {
            while let Ok(Some(event)) = events.message().await {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        });
        Stats::bump(&self.stats.connections);
        Ok(Connection {
            client,
            token,
            control,
            _control_reader: AbortOnDropHandle::new(reader),
        })
    }

    /// Opens a `Cache` stream as the released agent does — `open`, numbered
    /// with the last acknowledged message, then the unacknowledged window
    /// and whatever is numbered next, discovery first once the sidecar has
    /// said where to resume — and returns it with the sidecar's first word,
    /// `ResumeFrom`.
    pub async fn open_cache(&self, conn: &mut Connection) -> (CacheStream, ResumeFrom) {
        self.try_open_cache(conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn try_open_cache(
        &self,
        conn: &mut Connection,
    ) -> Result<(CacheStream, ResumeFrom), String> {
        let (up, rx) = mpsc::channel(64);
        let baseline = self.outbox.acked();
        let open = CacheUp {
            seq: baseline,
            msg: Some(cache_up::Msg::Open(CacheOpen {
                account: self.account.clone(),
                agent_id: self.agent.clone(),
                ..CacheOpen::default()
            })),
        };
        // Queued before the call: the first message leaves with the stream.
        up.send(open).await.unwrap();
        let outbox = self.outbox.clone();
        let sender = tokio::spawn(async move {
            let mut pushed = outbox.pushed.subscribe();
            let mut sent = baseline;
            loop {
                pushed.borrow_and_update();
                for m in outbox.after(sent) {
                    sent = m.seq;
                    if up.send(m).await.is_err() {
                        return;
                    }
                }
                if pushed.changed().await.is_err() {
                    return;
                }
            }
        });
        let sender = AbortOnDropHandle::new(sender);
        let request = stream_request(ReceiverStream::new(rx), &self.account, &conn.token);
        let mut stream = conn
            .client
            .cache(request)
            .await
            .map_err(|e| format!("opening the cache stream: {e}"))?
            .into_inner();
        Stats::bump(&self.stats.cache_streams);
        let (tx, mut down) = mpsc::channel(16);
        let ended = CancellationToken::new();
        let outbox = self.outbox.clone();
        let reader = tokio::spawn({
            let ended = ended.clone();
            async move {
                while let Ok(Some(CacheDown { msg: Some(msg) })) = stream.message().await {
                    match msg {
                        cache_down::Msg::Ack(ack) => outbox.ack(ack.seq),
                        cache_down::Msg::Heartbeat(_) => {}
                        msg => {
                            if tx.send(msg).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                ended.cancel();
            }
        });
        let reader = AbortOnDropHandle::new(reader);
        let first = match tokio::time::timeout(WAIT, down.recv()).await {
            Ok(Some(first)) => first,
            Ok(None) => return Err("the cache stream ended before ResumeFrom".into()),
            Err(_) => return Err("the sidecar did not answer the cache stream".into()),
        };
        let cache_down::Msg::Resume(resume) = first else {
            return Err(format!(
                "the sidecar's first word is ResumeFrom, not {first:?}"
            ));
        };
        // Discovery runs once the agent knows where it resumes.
        self.outbox.push(cache_up::Msg::Discovery(discovery()));
        Ok((
            CacheStream {
                down,
                ended,
                _sender: sender,
                _reader: reader,
            },
            resume,
        ))
    }

    /// A full listing of [`configmaps`] at `rv`: `SyncStart`, the one
    /// object ([`config_map`] with `value`), `SyncEnd`.
    pub fn list(&self, rv: u64, value: &str) {
        self.send_listing(rv, vec![config_map(rv, value)]);
    }

    fn send_listing(&self, rv: u64, objects: Vec<Vec<u8>>) {
        self.outbox.push(cache_up::Msg::SyncStart(SyncStart {
            kind: Some(configmaps()),
        }));
        for object in objects {
            self.outbox
                .push(event(watch_event::Type::Added, rv, object));
        }
        self.outbox.push(cache_up::Msg::SyncEnd(SyncEnd {
            kind: Some(configmaps()),
            resource_version: rv.to_string(),
        }));
    }

    /// A watch event: the ConfigMap of [`config_map`] changed at `rv`.
    pub fn modified(&self, rv: u64, value: &str) {
        self.outbox.push(event(
            watch_event::Type::Modified,
            rv,
            config_map(rv, value),
        ));
    }

    /// Opens the `Relay` stream and answers every request that comes down
    /// from [`ReleasedAgent::cluster`], recording `METHOD path` of each.
    pub async fn serve_relay(&self, conn: &mut Connection) -> RelayStream {
        self.try_serve_relay(conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn try_serve_relay(&self, conn: &mut Connection) -> Result<RelayStream, String> {
        let (up, rx) = mpsc::channel(64);
        up.send(RelayUp {
            msg: Some(relay_up::Msg::Open(RelayOpen {
                account: self.account.clone(),
                agent_id: self.agent.clone(),
            })),
        })
        .await
        .unwrap();
        let request = stream_request(ReceiverStream::new(rx), &self.account, &conn.token);
        let down = conn
            .client
            .relay(request)
            .await
            .map_err(|e| format!("opening the relay stream: {e}"))?
            .into_inner();
        let drain = CancellationToken::new();
        let ended = CancellationToken::new();
        let task = tokio::spawn(self.clone().relay(down, up, drain.clone(), ended.clone()));
        Ok(RelayStream {
            drain,
            ended,
            task: AbortOnDropHandle::new(task),
        })
    }

    /// Answers what comes down `down` until it ends (then cancels `ended`)
    /// or, once `drain` is cancelled, until nothing is in flight and the
    /// stream has been quiet for [`DRAIN_QUIET`]. Ending drops `up`, which
    /// ends the agent's side of the stream.
    async fn relay(
        self,
        mut down: tonic::Streaming<spinlink_compat::v1::RelayDown>,
        up: mpsc::Sender<RelayUp>,
        drain: CancellationToken,
        ended: CancellationToken,
    ) {
        // Requests whose body is still arriving.
        let mut pending: HashMap<u64, (spinlink_compat::v1::RequestHead, Vec<u8>)> = HashMap::new();
        let mut last_message = tokio::time::Instant::now();
        loop {
            let draining = drain.is_cancelled();
            let quiet = async {
                if !draining || !pending.is_empty() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep_until(last_message + DRAIN_QUIET).await;
            };
            let message = tokio::select! {
                message = down.message() => message,
                () = drain.cancelled(), if !draining => {
                    last_message = tokio::time::Instant::now();
                    continue;
                }
                () = quiet => return,
            };
            last_message = tokio::time::Instant::now();
            let Ok(Some(message)) = message else {
                ended.cancel();
                return;
            };
            let complete = match message.msg {
                Some(relay_down::Msg::Head(head)) => {
                    self.relayed
                        .lock()
                        .unwrap()
                        .push(format!("{} {}", head.method, head.path));
                    if head.end_stream {
                        Some((head, Vec::new()))
                    } else {
                        pending.insert(head.id, (head, Vec::new()));
                        None
                    }
                }
                Some(relay_down::Msg::Body(chunk)) => match pending.get_mut(&chunk.id) {
                    Some((_, body)) => {
                        body.extend_from_slice(&chunk.data);
                        if chunk.end_stream {
                            pending.remove(&chunk.id)
                        } else {
                            None
                        }
                    }
                    None => None,
                },
                Some(relay_down::Msg::Cancel(cancel)) => {
                    pending.remove(&cancel.id);
                    None
                }
                _ => None,
            };
            let Some((head, body)) = complete else {
                continue;
            };
            let (status, content_type, answer) =
                self.cluster
                    .answer(&head.method, &head.path, &head.headers, &body);
            let answer = [
                relay_up::Msg::Head(ResponseHead {
                    id: head.id,
                    status,
                    headers: vec![Header {
                        name: "content-type".into(),
                        value: content_type.as_bytes().to_vec(),
                    }],
                    ..ResponseHead::default()
                }),
                relay_up::Msg::Body(BodyChunk {
                    id: head.id,
                    data: answer,
                    end_stream: true,
                }),
            ];
            for msg in answer {
                if up.send(RelayUp { msg: Some(msg) }).await.is_err() {
                    ended.cancel();
                    return;
                }
            }
        }
    }

    /// The relayed requests whose `METHOD path` contains `what`.
    pub fn relayed(&self, what: &str) -> Vec<String> {
        let relayed = self.relayed.lock().unwrap();
        relayed
            .iter()
            .filter(|r| r.contains(what))
            .cloned()
            .collect()
    }

    // ---- On its own ----------------------------------------------------

    /// Runs the agent on its own (see the module's doc) against the
    /// gateways at `gateway_port` on localhost, on a runtime of its own,
    /// until the returned handle is dropped.
    pub fn spawn(&self, gateway_port: u16) -> Running {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.spawn(self.clone().run(gateway_port));
        Running { _runtime: runtime }
    }

    async fn run(self, port: u16) {
        let mut backoff = BACKOFF_INITIAL;
        loop {
            match self.open_link(port, None).await {
                Ok(link) => {
                    backoff = BACKOFF_INITIAL;
                    let why = self.serve(port, link).await;
                    eprintln!("released agent: {why}; dialling again");
                }
                Err(e) => eprintln!("released agent: {e}; dialling again in {backoff:?}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// A new connection with the account's streams on it: relay first, and
    /// once the sidecar has it the old connection (`from`, when moving)
    /// steps back — its cache stream ends, its relay stream drains — then
    /// the cache stream, resuming what the sidecar holds.
    async fn open_link(&self, port: u16, from: Option<&mut Link>) -> Result<Link, String> {
        let mut conn = self.try_connect(port).await?;
        let relay = self.try_serve_relay(&mut conn).await?;
        if let Some(old) = from {
            old.cache = None;
            old.relay.drain.cancel();
        }
        let (cache, resume) = self.try_open_cache(&mut conn).await?;
        let ended = CancellationToken::new();
        let feed = tokio::spawn(self.clone().feed(cache, resume, ended.clone()));
        Ok(Link {
            conn,
            relay,
            cache: Some(AbortOnDropHandle::new(feed)),
            cache_ended: ended,
        })
    }

    /// The account on `link` until a stream or the connection ends; moves
    /// to a new connection on `Reconnect`. Returns why it ended.
    async fn serve(&self, port: u16, mut link: Link) -> String {
        let mut control_open = true;
        loop {
            let (cache_ended, relay_ended) = (link.cache_ended.clone(), link.relay.ended.clone());
            let control = &mut link.conn.control;
            let event = async {
                if control_open {
                    control.recv().await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                () = cache_ended.cancelled() => return "the cache stream ended".into(),
                () = relay_ended.cancelled() => return "the relay stream ended".into(),
                event = event => match event.and_then(|e| e.event) {
                    Some(control_event::Event::Reconnect(r)) => {
                        Stats::bump(&self.stats.reconnects);
                        eprintln!("released agent: the gateway asks to move ({})", r.reason);
                        match self.open_link(port, Some(&mut link)).await {
                            Ok(new) => {
                                let old = std::mem::replace(&mut link, new);
                                Stats::bump(&self.stats.moves);
                                tokio::spawn(old.drain());
                            }
                            Err(e) => return format!("moving failed: {e}"),
                        }
                    }
                    Some(control_event::Event::Heartbeat(_)) => {}
                    // The stream ended: the connection's streams tell the rest.
                    None => control_open = false,
                },
            }
        }
    }

    /// Feeds `cache` from the cluster until the stream ends: discovery,
    /// then the kind resumed from where `resume` says or listed, then every
    /// change as it happens; a `Resync` lists again.
    async fn feed(self, mut cache: CacheStream, resume: ResumeFrom, ended: CancellationToken) {
        let _ended = ended.drop_guard();
        let mut changes = self.cluster.changed.subscribe();
        let held = resume
            .kinds
            .iter()
            .find(|kv| kv.kind.as_ref().is_some_and(|k| k.resource == "configmaps"))
            .and_then(|kv| kv.resource_version.parse::<u64>().ok());
        let mut at = match held.and_then(|rv| self.cluster.changes_after(rv)) {
            Some((rv, changes)) => {
                Stats::bump(&self.stats.resumed);
                for change in changes {
                    self.outbox.push(change);
                }
                rv
            }
            None => self.list_cluster(),
        };
        loop {
            tokio::select! {
                () = cache.ended.cancelled() => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    at = match self.cluster.changes_after(at) {
                        Some((rv, changes)) => {
                            for change in changes {
                                self.outbox.push(change);
                            }
                            rv
                        }
                        None => self.list_cluster(),
                    };
                }
                asked = cache.down.recv() => match asked {
                    Some(cache_down::Msg::Resync(_)) => {
                        Stats::bump(&self.stats.resyncs);
                        at = self.list_cluster();
                    }
                    Some(_) => {}
                    None => return,
                },
            }
        }
    }

    /// Lists the cluster onto the cache stream; returns the listing's
    /// resourceVersion.
    fn list_cluster(&self) -> u64 {
        Stats::bump(&self.stats.listings);
        let (rv, objects) = self.cluster.list();
        self.send_listing(rv, objects);
        rv
    }
}

/// One connection the agent serves its account on.
struct Link {
    conn: Connection,
    relay: RelayStream,
    /// Feeds the cache stream; `None` once the account's cache moved on.
    cache: Option<AbortOnDropHandle<()>>,
    /// Cancelled when the cache stream ends.
    cache_ended: CancellationToken,
}

impl Link {
    /// Lets the connection go once its relay stream has drained.
    async fn drain(self) {
        let Link { conn, relay, .. } = self;
        relay.drained().await;
        drop(conn);
    }
}

/// The agent running on its own; stopped when dropped.
pub struct Running {
    _runtime: tokio::runtime::Runtime,
}
