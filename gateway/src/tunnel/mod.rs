//! What happens to each HTTP/2 stream an agent opens, by gRPC path: `Hello`
//! (rate-limited per identity, size-bounded) and `Control` (the connection's
//! reconnect signals) are answered here ([`hello`]); `Cache` and `Relay` are
//! checked against their channel token and the identity's stream budget and
//! carried to a sidecar ([`proxy`]), and so is `Assignments`, checked
//! against the agent id of the connection's `Hello`; anything else is `Unimplemented`. Errors
//! become gRPC statuses here and nowhere else ([`status`]). [`server`] is the
//! agent connection itself, on the HTTP/2 [`crate::engine`].

pub mod hello;
pub mod proxy;
pub mod server;
pub mod status;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response};
use spinlink_proto::paths;
use spinlink_proto::v1::tunnel_server::TunnelServer;
use tonic::body::Body;
use tower::ServiceExt;

use crate::config::ListenerConfig;
use crate::identity::jwt::{BOOTSTRAP_JWT_HEADER, JwtVerifier};
use crate::identity::owners::{ConnGrants, Owners};
use crate::identity::{AgentPeer, DEV_IDENTITY_HEADER, Policy};
use crate::limits::{KeyedBuckets, Slots};
use crate::stats::{AuthFailure, Refusal, Stats};
use crate::token::TokenKey;
use crate::upstream::UpstreamSet;

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
    /// The sidecar instances and which account goes to which.
    pub upstreams: Arc<UpstreamSet>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Per-identity limits on `Hello` and carried streams.
    pub limits: TunnelLimits,
    /// Which identity serves each account on this replica.
    pub owners: Arc<Owners>,
    /// Checks bootstrap JWTs; `None` unless `jwtBootstrap` is configured
    /// (then connections without a client certificate are refused by TLS).
    pub jwt: Option<JwtVerifier>,
}

/// Limits that apply per identity, across its connections.
#[derive(Debug)]
pub struct TunnelLimits {
    /// `Hello` calls per identity (`listener.helloPerSecond`, `helloBurst`).
    pub hello: KeyedBuckets<Arc<str>>,
    /// Carried streams an identity may cancel before their answer
    /// (`listener.cancelsPerSecond`, `cancelBurst`).
    pub cancels: KeyedBuckets<Arc<str>>,
    /// Largest `Hello` request decoded (`listener.maxHelloBytes`).
    pub max_hello_bytes: usize,
    /// Largest message an agent may send on a carried stream
    /// (`listener.maxMessageBytes`).
    pub max_message_bytes: u32,
    /// What all agent connections may hold (`listener.maxBufferedBytes`).
    pub buffers: Arc<crate::engine::budget::Budget>,
    /// Carried streams per identity (`listener.maxStreamsPerIdentity`).
    pub identity_streams: Arc<Slots<Arc<str>>>,
    /// Between `Heartbeat`s on a `Control` stream
    /// (`listener.controlHeartbeatSeconds`); `None` sends none.
    pub control_heartbeat: Option<Duration>,
}

impl TunnelLimits {
    /// The limits `listener` configures.
    pub fn from_config(listener: &ListenerConfig) -> Self {
        Self {
            hello: KeyedBuckets::new(listener.hello_per_second, listener.hello_burst),
            cancels: KeyedBuckets::new(listener.cancels_per_second, listener.cancel_burst),
            max_hello_bytes: listener.max_hello_bytes,
            max_message_bytes: u32::try_from(listener.max_message_bytes).unwrap_or(u32::MAX),
            buffers: crate::engine::budget::Budget::new(listener.max_buffered_bytes),
            identity_streams: Slots::new(listener.max_streams_per_identity),
            control_heartbeat: (listener.control_heartbeat_seconds > 0)
                .then(|| Duration::from_secs(listener.control_heartbeat_seconds)),
        }
    }
}

impl Default for TunnelLimits {
    fn default() -> Self {
        Self::from_config(&ListenerConfig::default())
    }
}

/// The state one agent connection keeps across its streams (named for its
/// first use: where `Control` events go). Created by the listener with
/// `ControlSlot::default()`; dropped when the connection ends.
pub type ControlSlot = Arc<ConnState>;

/// See [`ControlSlot`].
#[derive(Debug, Default)]
pub struct ConnState {
    /// The sender of the `Control` stream the agent opened last on this
    /// connection (a second `Control` replaces the first, which then ends).
    control: Mutex<Option<ControlSender>>,
    /// The accounts granted on this connection; released on drop.
    grants: Arc<ConnGrants>,
    /// Set by the listener on a TLS connection without a client certificate
    /// (JWT bootstrap): the identity comes from the first `Hello`'s JWT.
    bootstrap: bool,
    /// The identity the first valid bootstrap JWT named; later `Hello`s must
    /// name the same one, and `Cache`/`Relay`/`Control` use it.
    bootstrap_identity: Mutex<Option<Arc<str>>>,
    /// The agent id the last `Hello` on this connection stated; an
    /// `Assignments` stream must name the same.
    hello_agent: Mutex<Option<Arc<str>>>,
    /// Channel tokens verified on this connection.
    tokens: Arc<crate::token::VerifiedTokens>,
}

impl ConnState {
    /// State of a TLS connection without a client certificate, whose identity
    /// a bootstrap JWT in `Hello` will establish.
    pub fn bootstrap() -> Arc<Self> {
        Arc::new(Self {
            bootstrap: true,
            ..Self::default()
        })
    }

    /// The sender of the connection's `Control` stream, replaced by `tx`.
    pub fn set_control(&self, tx: ControlSender) {
        *self.control.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    }

    /// Records the agent id a `Hello` on this connection stated.
    pub fn set_hello_agent(&self, agent_id: &str) {
        *self.hello_agent.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(agent_id));
    }

    /// Whether this is a bootstrap connection (no client certificate; a
    /// `Hello` JWT names the agent).
    pub fn is_bootstrap(&self) -> bool {
        self.bootstrap
    }

    /// The agent id the last `Hello` on this connection stated.
    pub fn hello_agent(&self) -> Option<Arc<str>> {
        self.hello_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn bootstrap_identity(&self) -> Option<Arc<str>> {
        self.bootstrap_identity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The sending end of a `Control` stream.
pub type ControlSender =
    tokio::sync::mpsc::Sender<Result<spinlink_proto::v1::ControlEvent, tonic::Status>>;

/// Sends `Reconnect{reason}` on the connection's `Control` stream, if one is
/// open, and lets the stream end after it. Returns whether it was sent.
pub fn send_reconnect(slot: &ControlSlot, reason: &str, deadline: Duration) -> bool {
    use spinlink_proto::v1::{ControlEvent, Reconnect, control_event};
    let Some(tx) = slot
        .control
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    else {
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

/// A request's headers as the checks read them: hyper's map on ingress
/// connections, the engine's decoded fields on agent connections (no map
/// built per stream).
pub trait RequestHeaders {
    /// How many values `name` has.
    fn count(&self, name: &str) -> usize;
    /// The first value of `name`.
    fn first(&self, name: &str) -> Option<&[u8]>;

    /// The first value of `name` as non-empty text.
    fn text(&self, name: &str) -> Option<&str> {
        let v = self.first(name)?;
        // Without an early exit the check runs many bytes at a time (tokens
        // are long); visible ASCII is then UTF-8 as well.
        let visible = v.iter().fold(true, |ok, &b| {
            ok & (b == b'\t' || (0x20..0x7f).contains(&b))
        });
        if v.is_empty() || !visible {
            return None;
        }
        std::str::from_utf8(v).ok()
    }
}

impl RequestHeaders for http::HeaderMap {
    fn count(&self, name: &str) -> usize {
        self.get_all(name).iter().count()
    }

    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }
}

impl RequestHeaders for [(bytes::Bytes, bytes::Bytes)] {
    fn count(&self, name: &str) -> usize {
        self.iter()
            .filter(|(n, _)| &n[..] == name.as_bytes())
            .count()
    }

    fn first(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| &n[..] == name.as_bytes())
            .map(|(_, v)| &v[..])
    }
}

/// Who is at the other end of one agent connection, as the listener found out.
#[derive(Debug, Clone)]
pub struct ConnPeer {
    /// The identity from the client certificate; `None` on an insecure
    /// listener, where each request names itself in [`DEV_IDENTITY_HEADER`],
    /// and on a JWT bootstrap connection ([`ConnState::bootstrap`]).
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
    /// The agent a request with `headers` speaks for: the connection's
    /// identity, a bootstrap connection's established one, or (insecure
    /// listener only) the one the request names.
    pub fn agent(&self, headers: &(impl RequestHeaders + ?Sized)) -> Option<AgentPeer> {
        let identity = match &self.identity {
            Some(identity) => identity.clone(),
            // Never the dev header on a TLS connection.
            None if self.control.bootstrap => self.control.bootstrap_identity()?,
            None => headers.text(DEV_IDENTITY_HEADER).map(Arc::from)?,
        };
        Some(AgentPeer {
            identity,
            binding: self.binding,
            remote: self.remote,
            grants: self.control.grants.clone(),
            bootstrap: None,
            tokens: self.control.tokens.clone(),
        })
    }

    /// The peer of a `Hello` on a bootstrap connection: the JWT in its
    /// metadata names the identity. Errors are the response to send.
    pub fn bootstrap_peer(
        &self,
        shared: &Shared,
        headers: &http::HeaderMap,
    ) -> Result<AgentPeer, tonic::Status> {
        let remote = self.remote;
        let fail = |reason: &str, message: String| {
            shared.stats.auth_failure(AuthFailure::BootstrapJwt);
            // Why, never the JWT itself.
            tracing::warn!(%remote, reason, "bootstrap Hello refused");
            Err(tonic::Status::unauthenticated(message))
        };
        let Some(verifier) = &shared.jwt else {
            return fail("disabled", "a client certificate is required".into());
        };
        let mut values = headers.get_all(BOOTSTRAP_JWT_HEADER).iter();
        let (Some(jwt), None) = (values.next(), values.next()) else {
            return fail(
                "missing",
                format!("no client certificate: send one `{BOOTSTRAP_JWT_HEADER}` bootstrap JWT"),
            );
        };
        let Ok(jwt) = jwt.to_str() else {
            return fail("malformed", "bootstrap JWT malformed".into());
        };
        let bootstrap = match verifier.verify(jwt, std::time::SystemTime::now()) {
            Ok(b) => b,
            Err(e) => return fail(e.as_str(), e.to_string()),
        };
        {
            let mut held = self
                .control
                .bootstrap_identity
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match &*held {
                Some(identity) if *identity != bootstrap.identity => {
                    shared.stats.auth_failure(AuthFailure::BootstrapJwt);
                    tracing::warn!(
                        %remote,
                        identity = &**identity,
                        other = &*bootstrap.identity,
                        "bootstrap Hello refused: connection belongs to another identity"
                    );
                    return Err(tonic::Status::permission_denied(
                        "this connection was bootstrapped with another identity",
                    ));
                }
                Some(_) => {}
                None => *held = Some(bootstrap.identity.clone()),
            }
        }
        Ok(AgentPeer {
            identity: bootstrap.identity.clone(),
            binding: self.binding,
            remote,
            grants: self.control.grants.clone(),
            bootstrap: Some(Arc::new(bootstrap)),
            tokens: self.control.tokens.clone(),
        })
    }
}

/// Serves one request of a connection hyper serves (an ingress connection),
/// or a `Hello` the engine hands over.
pub async fn handle<B>(shared: Arc<Shared>, conn: &ConnPeer, mut req: Request<B>) -> Response<Body>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::upstream::BoxError> + Send + 'static,
{
    let peer = if conn.control.bootstrap && req.uri().path() == paths::HELLO {
        match conn.bootstrap_peer(&shared, req.headers()) {
            Ok(peer) => peer,
            Err(refused) => return status::response(refused),
        }
    } else {
        let Some(peer) = conn.agent(req.headers()) else {
            return status::unauthenticated(if conn.control.bootstrap {
                "no agent identity: call Hello with a bootstrap JWT first".to_owned()
            } else {
                format!("no agent identity (insecure listener: send `{DEV_IDENTITY_HEADER}`)")
            });
        };
        peer
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
            req.extensions_mut().insert(conn.control.clone());
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
        paths::ASSIGNMENTS => {
            let hello_agent = conn.control.hello_agent();
            proxy::forward_assignments(
                &shared,
                &peer,
                conn.control.bootstrap,
                hello_agent.as_deref(),
                req,
            )
            .await
        }
        other => status::unimplemented(format!("method {other} is not served by this gateway")),
    }
}
