//! Shared harness of the sidecar's integration tests: a sidecar in insecure
//! mode, a tonic client playing gateway + agent, and an HTTP client for the
//! facade.
#![allow(dead_code, missing_docs)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::Value;
use spinlink_proto::headers;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{self, cache_down, cache_up, relay_up};
use spinlink_sidecar::{Config, Sidecar};
use spinlink_tls::config::{ALPN_H2, ClientFiles, client_config};
use spinlink_tls::dev::{DevPki, dev_gateway_identity};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub const IDENTITY: &str = "spiffe://spinlink.dev/agent/test";

pub struct Running {
    pub tunnel: SocketAddr,
    pub facade: SocketAddr,
    /// The peer port, when configured.
    pub peer: Option<SocketAddr>,
    pub accounts: spinlink_sidecar::Accounts,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<spinlink_sidecar::Result<()>>,
}

impl Running {
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await??;
        Ok(())
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.facade)
    }

    pub async fn client(&self) -> anyhow::Result<TunnelClient<Channel>> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.tunnel))?
            .connect()
            .await?;
        Ok(TunnelClient::new(channel))
    }
}

pub async fn start() -> anyhow::Result<Running> {
    start_with("").await
}

pub async fn start_with(extra_facade: &str) -> anyhow::Result<Running> {
    start_config(extra_facade, "").await
}

/// A sidecar with `extra_facade` keys in `facade:` and `extra` top-level YAML.
pub async fn start_config(extra_facade: &str, extra: &str) -> anyhow::Result<Running> {
    start_yaml(format!(
        "instanceId: test\ntunnel: {{ listen: 127.0.0.1:0, insecure: true }}\nfacade: {{ listen: 127.0.0.1:0{extra_facade} }}\n{extra}"
    ))
    .await
}

/// A sidecar whose top-level YAML `extra` names its instance (`instanceId`).
pub async fn start_named(extra: &str) -> anyhow::Result<Running> {
    start_yaml(format!(
        "tunnel: {{ listen: 127.0.0.1:0, insecure: true }}\nfacade: {{ listen: 127.0.0.1:0 }}\n{extra}"
    ))
    .await
}

async fn start_yaml(yaml: String) -> anyhow::Result<Running> {
    let config = Config::from_yaml_str(&yaml, "test.yaml")?;
    let sidecar = Sidecar::bind(config).await?;
    let shutdown = CancellationToken::new();
    let running = Running {
        tunnel: sidecar.tunnel_addr(),
        facade: sidecar.facade_addr(),
        peer: sidecar.peer_addr(),
        accounts: sidecar.accounts(),
        shutdown: shutdown.clone(),
        task: tokio::spawn(sidecar.run(shutdown)),
    };
    Ok(running)
}

pub fn with_headers<T>(msg: T, account: &str) -> tonic::Request<T> {
    with_identity(msg, account, IDENTITY)
}

/// `msg` with the headers a gateway sets for `identity` serving `account`.
pub fn with_identity<T>(msg: T, account: &str, identity: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    let md = req.metadata_mut();
    md.insert(headers::VERIFIED_ACCOUNT, account.parse().unwrap());
    md.insert(headers::VERIFIED_IDENTITY, identity.parse().unwrap());
    md.insert("authorization", "Bearer must-not-leak".parse().unwrap());
    req
}

/// An agent's cache stream: messages up get consecutive sequence numbers.
pub struct CacheStream {
    pub tx: mpsc::Sender<v1::CacheUp>,
    pub down: tonic::Streaming<v1::CacheDown>,
    pub seq: u64,
}

impl CacheStream {
    pub async fn open(client: &mut TunnelClient<Channel>, account: &str) -> anyhow::Result<Self> {
        Self::open_at(client, account, 1).await
    }

    /// Opens a stream whose `open` carries `seq`, as an agent's carries the
    /// last number acknowledged: what follows is numbered after it.
    pub async fn open_at(
        client: &mut TunnelClient<Channel>,
        account: &str,
        seq: u64,
    ) -> anyhow::Result<Self> {
        Self::open_scoped(client, account, seq, &[], &[]).await
    }

    /// Opens the stream of an agent watching only `namespaces` of the account.
    pub async fn open_with(
        client: &mut TunnelClient<Channel>,
        account: &str,
        namespaces: &[&str],
    ) -> anyhow::Result<Self> {
        Self::open_scoped(client, account, 1, namespaces, &[]).await
    }

    /// Opens the stream of an agent watching `namespaces` (all when empty)
    /// less `omit`.
    pub async fn open_omitting(
        client: &mut TunnelClient<Channel>,
        account: &str,
        namespaces: &[&str],
        omit: &[&str],
    ) -> anyhow::Result<Self> {
        Self::open_scoped(client, account, 1, namespaces, omit).await
    }

    async fn open_scoped(
        client: &mut TunnelClient<Channel>,
        account: &str,
        seq: u64,
        namespaces: &[&str],
        omit: &[&str],
    ) -> anyhow::Result<Self> {
        Ok(Self::open_full(client, account, IDENTITY, seq, namespaces, omit).await?)
    }

    /// Opens the stream as the gateway carries one of agent `identity`;
    /// a refusal is the sidecar's status.
    pub async fn open_as(
        client: &mut TunnelClient<Channel>,
        account: &str,
        identity: &str,
        seq: u64,
        namespaces: &[&str],
    ) -> Result<Self, tonic::Status> {
        Self::open_full(client, account, identity, seq, namespaces, &[]).await
    }

    async fn open_full(
        client: &mut TunnelClient<Channel>,
        account: &str,
        identity: &str,
        seq: u64,
        namespaces: &[&str],
        omit: &[&str],
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(1024);
        tx.send(v1::CacheUp {
            seq,
            msg: Some(cache_up::Msg::Open(v1::CacheOpen {
                account: account.into(),
                agent_id: "test".into(),
                namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
                omit_namespaces: omit.iter().map(|n| (*n).to_owned()).collect(),
                ..v1::CacheOpen::default()
            })),
        })
        .await
        .expect("the channel has room for open");
        let down = client
            .cache(with_identity(ReceiverStream::new(rx), account, identity))
            .await?
            .into_inner();
        Ok(Self { tx, down, seq })
    }

    /// The `ResumeFrom` the sidecar sends first: resourceVersion by
    /// resource.
    pub async fn resume_from(&mut self) -> anyhow::Result<Vec<(String, String)>> {
        let first = tokio::time::timeout(Duration::from_secs(10), self.down.message())
            .await
            .context("no ResumeFrom")??
            .context("cache stream ended")?;
        let Some(cache_down::Msg::Resume(r)) = first.msg else {
            bail!("the first message was not ResumeFrom: {first:?}");
        };
        Ok(r.kinds
            .into_iter()
            .map(|k| {
                (
                    k.kind.map(|k| k.resource).unwrap_or_default(),
                    k.resource_version,
                )
            })
            .collect())
    }

    pub async fn send(&mut self, msg: cache_up::Msg) -> anyhow::Result<()> {
        self.seq += 1;
        self.tx
            .send(v1::CacheUp {
                seq: self.seq,
                msg: Some(msg),
            })
            .await?;
        Ok(())
    }

    /// Waits for the sidecar to acknowledge everything sent: it acks only
    /// what it has applied.
    pub async fn wait_acked(&mut self) -> anyhow::Result<()> {
        let want = self.seq;
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(down) = self.down.message().await? {
                if let Some(cache_down::Msg::Ack(a)) = down.msg
                    && a.seq >= want
                {
                    return Ok(());
                }
            }
            bail!("cache stream ended before the ack")
        })
        .await
        .context("no ack")?
    }
}

pub fn kind(group: &str, version: &str, resource: &str, kind: &str, namespaced: bool) -> v1::Kind {
    v1::Kind {
        group: group.into(),
        version: version.into(),
        resource: resource.into(),
        kind: kind.into(),
        namespaced,
    }
}

pub fn added(kind: &v1::Kind, object: &Value) -> cache_up::Msg {
    let rv = object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("1")
        .to_owned();
    cache_up::Msg::Event(v1::WatchEvent {
        r#type: v1::watch_event::Type::Added as i32,
        kind: Some(kind.clone()),
        resource_version: rv,
        object: serde_json::to_vec(object).unwrap(),
    })
}

/// Sends one full listing of `objects`.
pub async fn sync(
    cache: &mut CacheStream,
    kind: &v1::Kind,
    objects: &[Value],
) -> anyhow::Result<()> {
    sync_at(cache, kind, objects, "1000").await
}

/// [`sync`] with the listing's resourceVersion.
pub async fn sync_at(
    cache: &mut CacheStream,
    kind: &v1::Kind,
    objects: &[Value],
    resource_version: &str,
) -> anyhow::Result<()> {
    cache
        .send(cache_up::Msg::SyncStart(v1::SyncStart {
            kind: Some(kind.clone()),
        }))
        .await?;
    for o in objects {
        cache.send(added(kind, o)).await?;
    }
    cache
        .send(cache_up::Msg::SyncEnd(v1::SyncEnd {
            kind: Some(kind.clone()),
            resource_version: resource_version.into(),
        }))
        .await
}

/// An agent's relay stream.
pub struct RelayStream {
    pub tx: mpsc::Sender<v1::RelayUp>,
    pub down: tonic::Streaming<v1::RelayDown>,
}

impl RelayStream {
    pub async fn open(client: &mut TunnelClient<Channel>, account: &str) -> anyhow::Result<Self> {
        Ok(Self::open_as(client, account, IDENTITY).await?)
    }

    /// Opens the stream as the gateway carries one of agent `identity`;
    /// a refusal is the sidecar's status.
    pub async fn open_as(
        client: &mut TunnelClient<Channel>,
        account: &str,
        identity: &str,
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(v1::RelayUp {
            msg: Some(relay_up::Msg::Open(v1::RelayOpen {
                account: account.into(),
                agent_id: "test".into(),
            })),
        })
        .await
        .expect("the channel has room for open");
        let down = client
            .relay(with_identity(ReceiverStream::new(rx), account, identity))
            .await?
            .into_inner();
        Ok(Self { tx, down })
    }

    pub async fn send(&self, msg: relay_up::Msg) -> anyhow::Result<()> {
        self.tx.send(v1::RelayUp { msg: Some(msg) }).await?;
        Ok(())
    }

    pub async fn next(&mut self) -> anyhow::Result<v1::relay_down::Msg> {
        let msg = tokio::time::timeout(Duration::from_secs(10), self.down.message())
            .await
            .context("nothing relayed")??
            .context("relay stream ended")?;
        msg.msg.context("empty RelayDown")
    }
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `message` of a `metav1.Status` answer (empty if it has none).
    pub fn message(&self) -> String {
        self.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

pub async fn request(
    client: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> anyhow::Result<Answer> {
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned())))?;
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .context("facade did not answer")??;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// [`request`] in a task of its own: for a request the played agent has to
/// answer before it completes.
pub fn spawn_request(
    client: &HttpClient,
    method: &'static str,
    url: &str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
) -> tokio::task::JoinHandle<anyhow::Result<Answer>> {
    let (client, url) = (client.clone(), url.to_owned());
    tokio::spawn(async move { request(&client, method, &url, headers, body).await })
}

/// An operation's hop times (from the accounts API), in hop order; every
/// hop must be there.
pub fn hop_times(op: &Value) -> Vec<chrono::DateTime<chrono::Utc>> {
    spinlink_sidecar::accounts::Operation::HOPS
        .iter()
        .map(|hop| {
            serde_json::from_value(op[*hop].clone())
                .unwrap_or_else(|e| panic!("{hop} of {op}: {e}"))
        })
        .collect()
}

pub async fn get(client: &HttpClient, url: &str) -> anyhow::Result<Answer> {
    request(client, "GET", url, &[], "").await
}

/// Polls the accounts API until `pred` holds for the account (bounded).
pub async fn wait_status(
    running: &Running,
    account: &str,
    pred: impl Fn(&spinlink_sidecar::AccountStatus) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if running.accounts.status(account).is_some_and(|s| pred(&s)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "account {account} never reached the expected state: {:?}",
                running.accounts.status(account)
            );
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A sidecar in its production mode: the tunnel on mTLS with `pki`'s
/// sidecar certificate, serving only the development gateway's identity
/// (`pki` signs the agents' certificates too), its store in `dir`.
pub async fn start_tls(pki: &DevPki, dir: &Path) -> anyhow::Result<Running> {
    start_yaml(format!(
        "tunnel:\n  listen: 127.0.0.1:0\n  tls: {{ certFile: {}, keyFile: {}, clientCaFile: {}, gatewayIdentities: ['{}'] }}\nfacade: {{ listen: 127.0.0.1:0 }}\nstore: {{ url: sqlite://{} }}\n",
        pki.cert("sidecar").display(),
        pki.key("sidecar").display(),
        pki.ca_cert().display(),
        dev_gateway_identity(),
        dir.join("s.db").display(),
    ))
    .await
}

/// A tunnel client over mTLS to `addr`, presenting `pki`'s certificate
/// `cert` (`gateway`, `agent-<id>`), or none.
pub async fn tls_client(
    addr: SocketAddr,
    pki: &DevPki,
    cert: Option<&str>,
) -> anyhow::Result<TunnelClient<Channel>> {
    let files = cert.map(|name| (pki.cert(name), pki.key(name)));
    let config = client_config(
        ClientFiles {
            ca: &pki.ca_cert(),
            identity: files.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        },
        &[ALPN_H2],
    )?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await?;
    Ok(TunnelClient::new(channel))
}

/// The value of the sidecar's metric line starting with `series` (name and
/// labels), 0 when it is absent.
pub async fn metric(running: &Running, series: &str) -> anyhow::Result<f64> {
    let text = get(&http(), &running.url("/metrics")).await?;
    let text = String::from_utf8(text.body.to_vec())?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0))
}

pub fn fixture(path: &str) -> Value {
    let full = format!("{}/../kube-sim/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(&full).unwrap_or_else(|e| panic!("{full}: {e}"))).unwrap()
}

/// Header `name` (any case) of a recorded header list, `[[name, value], …]`
/// as `kube-sim/fixtures` write them, if it is there.
pub fn recorded_header<'a>(headers: &'a Value, name: &str) -> Option<&'a str> {
    headers
        .as_array()?
        .iter()
        .find(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .and_then(|h| h[1].as_str())
}

/// The first request `errors/requests.json` recorded that `which` picks.
pub fn recorded_request(which: impl Fn(&Value) -> bool) -> Value {
    fixture("errors/requests.json")
        .as_array()
        .unwrap()
        .iter()
        .find(|e| which(e))
        .expect("a recorded request")
        .clone()
}

/// A development PKI for sidecars' peer ports: `sidecar-peer` carries
/// [`spinlink_tls::dev::dev_sidecar_identity`], `gateway` and `agent-test`
/// are certificates of the same CA naming no sidecar.
pub struct PeerPki {
    pub pki: DevPki,
    _dir: tempfile::TempDir,
}

impl PeerPki {
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let pki = DevPki::ensure(dir.path(), &["test"])?;
        Ok(Self { pki, _dir: dir })
    }

    /// The `peer:` section of a sidecar on loopback serving the sidecar
    /// identity over mutual TLS (flow style, one line).
    pub fn yaml(&self) -> String {
        self.yaml_as("sidecar-peer")
    }

    /// The `peer:` section of a sidecar presenting `pki`'s certificate
    /// `cert`, whatever identity it carries.
    pub fn yaml_as(&self, cert: &str) -> String {
        let p = |path: std::path::PathBuf| format!("{:?}", path.display().to_string());
        format!(
            "peer: {{ listen: 127.0.0.1:0, allowLoopback: true, tls: {{ certFile: {}, keyFile: {}, caFile: {}, peerIdentities: [{:?}] }} }}\n",
            p(self.pki.cert(cert)),
            p(self.pki.key(cert)),
            p(self.pki.ca_cert()),
            spinlink_tls::dev::dev_sidecar_identity(),
        )
    }

    /// `GET path` on the peer port at `addr` over TLS, presenting the
    /// certificate `cert` (`sidecar-peer`, `gateway`, `agent-test`) or none,
    /// and checking the server's against the CA as `localhost`. The status
    /// and body, or what failed (the handshake, the request).
    pub async fn get(
        &self,
        addr: SocketAddr,
        cert: Option<&str>,
        path: &str,
    ) -> anyhow::Result<(u16, Bytes)> {
        let files = cert.map(|name| (self.pki.cert(name), self.pki.key(name)));
        let config = client_config(
            ClientFiles {
                ca: &self.pki.ca_cert(),
                identity: files.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
            },
            &[spinlink_tls::config::ALPN_HTTP1],
        )?;
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost")?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header("host", "localhost")
            .body(http_body_util::Empty::<Bytes>::new())?;
        let resp = send.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// One store for several sidecars: a SQLite file in a temporary directory,
/// or, when `SPINLINK_TEST_POSTGRES_URL` is set, a schema of its own in
/// that PostgreSQL, dropped with this.
pub struct SharedStore {
    pub url: String,
    _dir: tempfile::TempDir,
    schema: Option<spinlink_sidecar::store::scratch::Schema>,
}

impl SharedStore {
    pub async fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let Ok(server) = std::env::var("SPINLINK_TEST_POSTGRES_URL") else {
            let url = format!("sqlite://{}", dir.path().join("shared.db").display());
            return Ok(Self {
                url,
                _dir: dir,
                schema: None,
            });
        };
        let schema =
            spinlink_sidecar::store::scratch::Schema::create(&server, "spinlink_sidecar_test")
                .await
                .context("SPINLINK_TEST_POSTGRES_URL is set but unusable")?;
        Ok(Self {
            url: schema.url(None),
            _dir: dir,
            schema: Some(schema),
        })
    }

    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        if self.schema.is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    }
}

impl Drop for SharedStore {
    fn drop(&mut self) {
        if let Some(schema) = self.schema.take()
            && let Err(e) = schema.drop_blocking()
        {
            eprintln!("dropping the test schema: {e}");
        }
    }
}
