//! The load generator's gRPC client for the gateway-vs-peers benchmark
//! ([`crate::grpc_proxy`]): TLS 1.3 only, a client certificate, no session
//! resumption (every handshake is a full one), HTTP/2 by ALPN, and gRPC
//! framed by hand on hyper's HTTP/2 client, so the client costs the same
//! whatever it talks to and adds no buffering layer of its own.
//!
//! Every target gets the same requests: the `spinlink.v1.Tunnel` paths
//! `Cache` (used for the unary echo) and `Relay` (the bidi echo) with the
//! `spinlink-account` and `spinlink-token` headers an agent sends. Only the
//! gateway checks them (the token comes from a `Hello` on the same
//! connection); the echo backend answers both paths ([`crate::grpc_echo`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::{Context as _, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderValue, Request, Response, Uri};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost::Message as _;
use rustls::pki_types::ServerName;
use spinlink_proto::{headers, paths};
use spinlink_tls::dev::DevPki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

/// The account every load stream claims (every agent of the benches serves
/// the account named as its agent id).
pub const ACCOUNT: &str = AGENT_ID;
/// The agent id (and dev PKI client certificate `agent-<id>`) of the load.
pub const AGENT_ID: &str = "bench";
/// Agents that connect now and then, each with a certificate of its own
/// (`agent-bench-<n>`) and an account of its own (`bench-<n>`): the hostile
/// bench's legitimate newcomers take turns, so each says `Hello` as seldom
/// as a real agent does.
pub const NEWCOMERS: usize = 16;

/// The agent id of newcomer `n`.
pub fn newcomer(n: usize) -> String {
    format!("{AGENT_ID}-{n}")
}
/// The hostile bench's attacker: its agent id (certificate
/// `agent-hostile`), which the gateway's policy grants an account of its
/// own, so its floods reach the gateway's carrying path as a tenant's would.
pub const ATTACKER_ID: &str = "hostile";

/// TLS 1.3 only, on the project's one crypto provider, presenting agent
/// `id`'s dev certificate (none when `id` is `None`).
pub fn tls13_client(pki: &DevPki, id: Option<&str>) -> anyhow::Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(spinlink_tls::config::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(spinlink_tls::config::root_store(&pki.ca_cert())?);
    let mut config = match id {
        Some(id) => {
            let name = format!("agent-{id}");
            let certs = spinlink_tls::pem::load_certs(&pki.cert(&name))?;
            let key = spinlink_tls::pem::load_key(&pki.key(&name))?;
            builder.with_client_auth_cert(certs, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    // Every connection pays a full handshake, as a fleet of new agents would.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

/// A TLS 1.3 server configuration requiring a client certificate signed by
/// the dev CA, serving `name`'s certificate (for the echo backend's own TLS
/// port, the "direct" side).
pub fn tls13_server(pki: &DevPki, name: &str) -> anyhow::Result<rustls::ServerConfig> {
    let provider = spinlink_tls::config::provider();
    let roots = Arc::new(spinlink_tls::config::root_store(&pki.ca_cert())?);
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            spinlink_tls::pem::load_certs(&pki.cert(name))?,
            spinlink_tls::pem::load_key(&pki.key(name))?,
        )?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Opens connections to one target address.
#[derive(Clone)]
pub struct Dialer {
    connector: TlsConnector,
    name: ServerName<'static>,
    addr: SocketAddr,
    /// Whether the target is the gateway, which wants a `Hello` first.
    hello: bool,
    /// The agent id its `Hello` names, and the account it serves.
    agent_id: String,
}

impl Dialer {
    /// A dialer of `addr`, presenting the dev PKI's `agent-bench` certificate.
    pub fn new(pki: &DevPki, addr: SocketAddr, hello: bool) -> anyhow::Result<Self> {
        Self::for_agent(pki, addr, hello, AGENT_ID)
    }

    /// A dialer of `addr` as agent `id` (certificate `agent-<id>`).
    pub fn for_agent(
        pki: &DevPki,
        addr: SocketAddr,
        hello: bool,
        id: &str,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            agent_id: id.to_owned(),
            connector: TlsConnector::from(Arc::new(tls13_client(pki, Some(id))?)),
            name: ServerName::try_from("localhost")?.to_owned(),
            addr,
            hello,
        })
    }

    async fn tls(&self) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        tcp.set_nodelay(true)?;
        let tls = self
            .connector
            .connect(self.name.clone(), tcp)
            .await
            .with_context(|| format!("TLS handshake with {}", self.addr))?;
        let (_, c) = tls.get_ref();
        if c.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3)
            || c.alpn_protocol() != Some(b"h2")
        {
            bail!("{}: not TLS 1.3 with h2", self.addr);
        }
        Ok(tls)
    }

    /// One new connection, fully set up: TCP, the TLS 1.3 handshake with the
    /// client certificate, and the HTTP/2 prefaces, ending when the server's
    /// SETTINGS arrive — which a server sends only after it has verified the
    /// client certificate. Then the connection is closed.
    pub async fn handshake(&self) -> anyhow::Result<()> {
        // Client preface, then an empty SETTINGS frame.
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
        let mut tls = self.tls().await?;
        tls.write_all(PREFACE).await?;
        tls.flush().await?;
        let mut head = [0u8; 9];
        tls.read_exact(&mut head).await?;
        if head[3] != 0x4 {
            bail!("{}: first HTTP/2 frame is not SETTINGS", self.addr);
        }
        Ok(())
    }

    /// A connection ready for calls; on the gateway, `Hello` has granted the
    /// channel token.
    pub async fn connect(&self) -> anyhow::Result<Conn> {
        let tls = self.tls().await?;
        let (send, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(tls))
            .await?;
        tokio::spawn(conn);
        let mut conn = Conn {
            send,
            base: format!("https://{}", self.addr),
            account: HeaderValue::from_str(&self.agent_id)?,
            token: HeaderValue::from_static("none"),
        };
        if self.hello {
            conn.hello(&self.agent_id).await?;
        }
        Ok(conn)
    }
}

/// One HTTP/2 connection; clones share it.
#[derive(Clone)]
pub struct Conn {
    send: SendRequest<ReqBody>,
    base: String,
    account: HeaderValue,
    token: HeaderValue,
}

impl Conn {
    fn request(&self, path: &str, body: ReqBody) -> anyhow::Result<Request<ReqBody>> {
        let uri: Uri = format!("{}{path}", self.base).parse()?;
        Ok(Request::post(uri)
            .version(http::Version::HTTP_2)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(headers::ACCOUNT, self.account.clone())
            .header(headers::TOKEN, self.token.clone())
            .body(body)?)
    }

    async fn hello(&mut self, agent_id: &str) -> anyhow::Result<()> {
        use spinlink_proto::v1::{AccountInfo, HelloRequest, HelloResponse};
        let req = HelloRequest {
            agent_id: agent_id.into(),
            agent_version: "spinlink-bench".into(),
            accounts: vec![AccountInfo {
                name: agent_id.into(),
                ..Default::default()
            }],
        };
        let answer = self
            .unary(paths::HELLO, frame(&req.encode_to_vec()))
            .await?;
        let answer = HelloResponse::decode(answer)?;
        let Some(grant) = answer.granted.into_iter().find(|g| g.account == agent_id) else {
            bail!(
                "Hello granted no token for account {agent_id}: {:?}",
                answer.refused
            );
        };
        self.token = HeaderValue::from_str(&grant.token)?;
        Ok(())
    }

    /// A unary call of `path` with the framed message `msg`; the answer's
    /// message (without its 5-byte prefix).
    pub async fn unary(&mut self, path: &str, msg: Bytes) -> anyhow::Result<Bytes> {
        let req = self.request(path, ReqBody::Full(Some(msg)))?;
        self.send.ready().await?;
        let resp = self.send.send_request(req).await?;
        let mut reader = Reader::new(resp)?;
        let Some(answer) = reader.next().await? else {
            bail!("{path}: no answer message");
        };
        reader.finish().await?;
        Ok(answer)
    }

    /// Opens a bidi stream of `path`, sending `first` (framed) at once: some
    /// proxies open the upstream stream only when a first message arrives.
    pub async fn bidi(&mut self, path: &str, first: Bytes) -> anyhow::Result<Bidi> {
        let (tx, rx) = mpsc::channel(4);
        tx.send(first).await?;
        let req = self.request(path, ReqBody::Stream(rx))?;
        self.send.ready().await?;
        let resp = self.send.send_request(req).await?;
        Ok(Bidi {
            tx,
            reader: Reader::new(resp)?,
        })
    }
}

/// A message with the gRPC 5-byte prefix (uncompressed).
pub fn frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(u32::try_from(msg.len()).unwrap_or(u32::MAX));
    b.put_slice(msg);
    b.freeze()
}

/// An open bidi stream.
pub struct Bidi {
    tx: mpsc::Sender<Bytes>,
    reader: Reader,
}

impl Bidi {
    /// Sends one framed message.
    pub async fn send(&self, msg: Bytes) -> anyhow::Result<()> {
        self.tx
            .send(msg)
            .await
            .map_err(|_| anyhow::anyhow!("stream closed"))
    }

    /// The next message; `None` when the stream ended with status 0.
    pub async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
        self.reader.next().await
    }
}

/// Reads gRPC messages from a response body.
struct Reader {
    body: Incoming,
    buf: BytesMut,
    done: bool,
}

impl Reader {
    fn new(resp: Response<Incoming>) -> anyhow::Result<Self> {
        if resp.status() != http::StatusCode::OK {
            bail!("HTTP status {}", resp.status());
        }
        check_status(resp.headers())?;
        Ok(Self {
            body: resp.into_body(),
            buf: BytesMut::new(),
            done: false,
        })
    }

    async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
        loop {
            if self.buf.len() >= 5 {
                let len = (&self.buf[1..5]).get_u32() as usize;
                if self.buf.len() >= 5 + len {
                    let mut msg = self.buf.split_to(5 + len);
                    msg.advance(5);
                    return Ok(Some(msg.freeze()));
                }
            }
            if self.done {
                if !self.buf.is_empty() {
                    bail!("stream ended inside a message");
                }
                return Ok(None);
            }
            match self.body.frame().await {
                Some(frame) => {
                    let frame = frame?;
                    if let Some(data) = frame.data_ref() {
                        self.buf.extend_from_slice(data);
                    } else if let Some(trailers) = frame.trailers_ref() {
                        check_status(trailers)?;
                        self.done = true;
                    }
                }
                None => self.done = true,
            }
        }
    }

    async fn finish(mut self) -> anyhow::Result<()> {
        while self.next().await?.is_some() {}
        Ok(())
    }
}

fn check_status(map: &http::HeaderMap) -> anyhow::Result<()> {
    match map.get("grpc-status") {
        Some(v) if v.as_bytes() != b"0" => bail!(
            "grpc-status {}: {}",
            v.to_str().unwrap_or("?"),
            map.get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .unwrap_or("")
        ),
        _ => Ok(()),
    }
}

/// A request body: one message, or the messages a bidi stream sends.
pub enum ReqBody {
    /// A unary request.
    Full(Option<Bytes>),
    /// A bidi stream's sends; ends when the sender is dropped.
    Stream(mpsc::Receiver<Bytes>),
}

impl http_body::Body for ReqBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut *self {
            ReqBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ReqBody::Stream(rx) => rx.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ReqBody::Full(None))
    }
}
