//! What happens to each HTTP/2 stream an agent opens, by gRPC path: `Hello`
//! (rate-limited per identity, size-bounded) and `Control` (the connection's
//! reconnect signals) are answered here ([`hello`]); `Cache` and `Relay` are
//! checked against their channel token and the identity's stream budget and
//! carried to a sidecar ([`proxy`]); anything else is `Unimplemented`. Errors
//! become gRPC statuses here and nowhere else ([`status`]).

pub mod hello;
pub mod proxy;
pub mod status;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use spinlink_proto::paths;
use spinlink_proto::v1::tunnel_server::TunnelServer;
use tonic::body::Body;
use tower::ServiceExt;

use crate::admin::{Refusal, Stats};
use crate::config::ListenerConfig;
use crate::identity::{AgentPeer, DEV_IDENTITY_HEADER, Policy};
use crate::listener::limits::{KeyedBuckets, Slots};
use crate::token::TokenKey;
use crate::upstream::Upstream;

/// Everything the streams of every connection share.
#[derive(Debug)]
pub struct Shared {
    /// Reported to agents in `Hello`.
    pub gateway_id: String,
    /// Which identities may serve which accounts.
    pub policy: Policy,
    /// Issues and checks channel tokens.
    pub tokens: TokenKey,
    /// Lifetime of issued tokens.
    pub token_ttl: Duration,
    /// The sidecars, in configuration order.
    pub upstreams: Vec<Upstream>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Per-identity limits on `Hello` and carried streams.
    pub limits: TunnelLimits,
}

/// Limits that apply per identity, across its connections.
#[derive(Debug)]
pub struct TunnelLimits {
    /// `Hello` calls per identity (`listener.helloPerSecond`, `helloBurst`).
    pub hello: KeyedBuckets<Arc<str>>,
    /// Largest `Hello` request decoded (`listener.maxHelloBytes`).
    pub max_hello_bytes: usize,
    /// Carried streams per identity (`listener.maxStreamsPerIdentity`).
    pub identity_streams: Arc<Slots<Arc<str>>>,
}

impl TunnelLimits {
    /// The limits `listener` configures.
    pub fn from_config(listener: &ListenerConfig) -> Self {
        Self {
            hello: KeyedBuckets::new(listener.hello_per_second, listener.hello_burst),
            max_hello_bytes: listener.max_hello_bytes,
            identity_streams: Slots::new(listener.max_streams_per_identity),
        }
    }
}

impl Default for TunnelLimits {
    fn default() -> Self {
        Self::from_config(&ListenerConfig::default())
    }
}

/// Where a connection's `Control` stream takes its events from: the sender
/// of the stream the agent opened last on this connection (one per
/// connection; a second `Control` replaces the first, which then ends).
pub type ControlSlot = Arc<Mutex<Option<ControlSender>>>;

/// The sending end of a `Control` stream.
pub type ControlSender =
    tokio::sync::mpsc::Sender<Result<spinlink_proto::v1::ControlEvent, tonic::Status>>;

/// Sends `Reconnect{reason}` on the connection's `Control` stream, if one is
/// open, and lets the stream end after it. Returns whether it was sent.
pub fn send_reconnect(slot: &ControlSlot, reason: &str, deadline: Duration) -> bool {
    use spinlink_proto::v1::{ControlEvent, Reconnect, control_event};
    let Some(tx) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return false;
    };
    let event = ControlEvent {
        event: Some(control_event::Event::Reconnect(Reconnect {
            reason: reason.to_owned(),
            deadline_millis: u32::try_from(deadline.as_millis()).unwrap_or(u32::MAX),
        })),
    };
    // A fresh queue holds it; a full one means the agent reads nothing, and
    // GOAWAY follows anyway.
    tx.try_send(Ok(event)).is_ok()
}

/// Who is at the other end of one agent connection, as the listener found out.
#[derive(Debug, Clone)]
pub struct ConnPeer {
    /// The identity from the client certificate; `None` on an insecure
    /// listener, where each request names itself in [`DEV_IDENTITY_HEADER`].
    pub identity: Option<Arc<str>>,
    /// The connection's binding.
    pub binding: spinlink_tls::binding::ConnectionBinding,
    /// The agent's address (from the PROXY header when a trusted load
    /// balancer sent one).
    pub remote: std::net::SocketAddr,
    /// The connection's `Control` stream, if the agent opened one.
    pub control: ControlSlot,
}

impl ConnPeer {
    fn agent(&self, req: &Request<Incoming>) -> Option<AgentPeer> {
        let identity = match &self.identity {
            Some(identity) => identity.clone(),
            None => req
                .headers()
                .get(DEV_IDENTITY_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(Arc::from)?,
        };
        Some(AgentPeer {
            identity,
            binding: self.binding,
            remote: self.remote,
        })
    }
}

/// Serves one request of a connection.
pub async fn handle(
    shared: Arc<Shared>,
    conn: &ConnPeer,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let Some(peer) = conn.agent(&req) else {
        return status::unauthenticated(format!(
            "no agent identity (insecure listener: send `{DEV_IDENTITY_HEADER}`)"
        ));
    };
    match req.uri().path() {
        paths::HELLO => {
            if !shared.limits.hello.try_take(&peer.identity, Instant::now()) {
                shared.stats.refuse(Refusal::HelloRate);
                tracing::warn!(identity = &*peer.identity, remote = %peer.remote, "Hello refused: rate");
                return status::response(tonic::Status::resource_exhausted(
                    "Hello rate of this identity exceeded; retry later",
                ));
            }
            req.extensions_mut().insert(peer);
            let server = TunnelServer::new(hello::HelloService::new(shared.clone()))
                .max_decoding_message_size(shared.limits.max_hello_bytes);
            let response = match server.oneshot(req).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            // tonic answers an oversized request with `OutOfRange` before the
            // service sees it; count it here, where it is visible.
            if response
                .headers()
                .get(tonic::Status::GRPC_STATUS)
                .is_some_and(|v| v.as_bytes() == b"11")
            {
                shared.stats.refuse(Refusal::HelloTooLarge);
            }
            response
        }
        paths::CONTROL => {
            req.extensions_mut().insert(peer);
            req.extensions_mut().insert(conn.control.clone());
            let server = TunnelServer::new(hello::HelloService::new(shared));
            match server.oneshot(req).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
        paths::CACHE | paths::RELAY => proxy::forward(&shared, &peer, req).await,
        other => status::unimplemented(format!("method {other} is not served by this gateway")),
    }
}
