//! What happens to each HTTP/2 stream an agent opens, by gRPC path: `Hello` is
//! answered here ([`hello`]); `Cache` and `Relay` are checked against their
//! channel token and carried to a sidecar ([`proxy`]); anything else is
//! `Unimplemented`. Errors become gRPC statuses here and nowhere else
//! ([`status`]).

pub mod hello;
pub mod proxy;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use spinlink_proto::paths;
use spinlink_proto::v1::tunnel_server::TunnelServer;
use tonic::body::Body;
use tower::ServiceExt;

use crate::admin::Stats;
use crate::identity::{AgentPeer, DEV_IDENTITY_HEADER, Policy};
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
}

/// Who is at the other end of one agent connection, as the listener found out.
#[derive(Debug, Clone)]
pub struct ConnPeer {
    /// The identity from the client certificate; `None` on an insecure
    /// listener, where each request names itself in [`DEV_IDENTITY_HEADER`].
    pub identity: Option<Arc<str>>,
    /// The connection's binding.
    pub binding: spinlink_tls::binding::ConnectionBinding,
    /// The agent's address.
    pub remote: std::net::SocketAddr,
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
            req.extensions_mut().insert(peer);
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
