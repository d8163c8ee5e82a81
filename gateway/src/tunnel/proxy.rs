//! The checks a carried stream passes before anything is opened upstream —
//! `Cache` and `Relay`: the channel token against this connection, identity
//! and the claimed account ([`admit_channel`]); `Assignments`: the agent id
//! against the connection's `Hello` ([`admit_assignments`]) — and the head
//! the sidecar gets in place of the agent's ([`upstream_fields`]): the
//! gateway's verified headers instead of anything the agent claimed.
//!
//! Agent connections ([`super::server`]) carry their streams with these; [`forward`] carries those of ingress connections, which hyper
//! serves, through a bridge onto the same pooled sidecar connections. Each
//! carried stream holds one of its identity's `listener.maxStreamsPerIdentity`
//! slots until it ends.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use spinlink_proto::headers;
use tonic::Status;
use tonic::body::Body;

use super::{RequestHeaders, Shared, status};
use crate::engine::bridge::{BridgeBody, BridgeError};
use crate::engine::link::Fields;
use crate::identity::{AgentPeer, DEV_IDENTITY_HEADER};
use crate::limits::Slot;
use crate::stats::{AuthFailure, Counter, Refusal};
use crate::token::{Claims, Refused};
use crate::upstream::{BoxError, Lease, Target};

/// Headers that describe one hop, not the message, and are never forwarded.
const HOP_BY_HOP: [&[u8]; 7] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"transfer-encoding",
    b"upgrade",
    b"host",
];

/// A stream that passed its checks, ready to be carried.
#[derive(Debug)]
pub struct Admitted {
    /// The rendezvous key: the account, or `agent:<id>` for `Assignments`.
    pub key: String,
    /// The gateway's verified headers, set in place of anything the agent
    /// claimed.
    pub verified: Verified,
    /// The identity's stream slot, held while the stream is open.
    pub slot: Slot<std::sync::Arc<str>>,
}

/// What the gateway verified of a stream, sent to the sidecar as
/// `spinlink-verified-*` headers.
#[derive(Debug)]
pub enum Verified {
    /// A `Cache` or `Relay` stream: its account is the rendezvous key.
    Account,
    /// An `Assignments` stream: the agent id its `Hello` stated and the
    /// account globs the policy grants its identity (JSON).
    Agent {
        /// The agent id.
        agent: String,
        /// The granted account globs, a JSON array.
        accounts: String,
    },
}

impl Admitted {
    /// The verified headers: names and values.
    pub fn verified(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let (first, second) = match &self.verified {
            Verified::Account => ((headers::VERIFIED_ACCOUNT, self.key.as_str()), None),
            Verified::Agent { agent, accounts } => (
                (headers::VERIFIED_AGENT, agent.as_str()),
                Some((headers::VERIFIED_ACCOUNTS, accounts.as_str())),
            ),
        };
        std::iter::once(first).chain(second)
    }
}

/// Checks a `Cache` or `Relay` stream: one `spinlink-account` and one
/// `spinlink-token`, the token valid for this connection, identity and
/// account, and a free stream slot for the identity. A refusal is counted
/// and logged and comes back as the status to answer with.
pub fn admit_channel(
    shared: &Shared,
    peer: &AgentPeer,
    method: &str,
    headers: &(impl RequestHeaders + ?Sized),
) -> Result<Admitted, Status> {
    let identity = &*peer.identity;
    // One value each: a second `spinlink-account` would reach the sidecar
    // unchecked beside the verified one.
    for name in [headers::ACCOUNT, headers::TOKEN] {
        if headers.count(name) > 1 {
            return Err(refuse(
                shared,
                peer,
                AuthFailure::TokenMalformed,
                "",
                method,
                &format!("more than one {name} header"),
            ));
        }
    }
    let Some(account) = header_str(headers, headers::ACCOUNT) else {
        return Err(refuse(
            shared,
            peer,
            AuthFailure::TokenMissing,
            "",
            method,
            "missing spinlink-account header",
        ));
    };
    let Some(token) = header_str(headers, headers::TOKEN) else {
        return Err(refuse(
            shared,
            peer,
            AuthFailure::TokenMissing,
            account,
            method,
            "missing spinlink-token header",
        ));
    };
    let claims = Claims {
        binding: &peer.binding,
        identity,
        account,
    };
    if let Err(refused) = peer
        .tokens
        .verify(&shared.tokens, token, claims, SystemTime::now())
    {
        let why = match refused {
            Refused::Malformed | Refused::UnknownVersion => AuthFailure::TokenMalformed,
            Refused::Mismatch => AuthFailure::TokenMismatch,
            Refused::Expired => AuthFailure::TokenExpired,
        };
        return Err(refuse(
            shared,
            peer,
            why,
            account,
            method,
            &refused.to_string(),
        ));
    }
    let slot = take_slot(shared, peer, account, method)?;
    Ok(Admitted {
        key: account.to_owned(),
        verified: Verified::Account,
        slot,
    })
}

/// Checks an `Assignments` stream: no channel token, but the connection
/// must have said `Hello` (with a certificate identity), and the agent id
/// the stream names (`spinlink-agent-id`) must be the one that `Hello`
/// stated. It goes to the sidecar rendezvous hashing picks for
/// `agent:<id>`, with the account globs the policy grants the identity.
pub fn admit_assignments(
    shared: &Shared,
    peer: &AgentPeer,
    bootstrap: bool,
    hello_agent: Option<&str>,
    method: &str,
    headers: &(impl RequestHeaders + ?Sized),
) -> Result<Admitted, Status> {
    let no = |agent: &str, reason: &str, status: fn(String) -> Status| {
        refuse_with(shared, peer, agent, method, reason, status)
    };
    if bootstrap {
        // Kubeconfigs go only to identities the policy names.
        return Err(no(
            "",
            "dynamic accounts need a client certificate identity",
            Status::permission_denied,
        ));
    }
    if headers.count(headers::AGENT_ID) > 1 {
        return Err(no(
            "",
            "more than one spinlink-agent-id header",
            Status::unauthenticated,
        ));
    }
    let Some(agent) = header_str(headers, headers::AGENT_ID) else {
        return Err(no(
            "",
            "missing spinlink-agent-id header",
            Status::unauthenticated,
        ));
    };
    let Some(hello_agent) = hello_agent else {
        return Err(no(
            agent,
            "call Hello on this connection first",
            Status::failed_precondition,
        ));
    };
    if hello_agent != agent {
        return Err(no(
            agent,
            &format!("agent id {agent:?} is not the one this connection's Hello stated"),
            Status::permission_denied,
        ));
    }
    let patterns = shared.policy.account_patterns(&peer.identity);
    if patterns.is_empty() {
        return Err(no(
            agent,
            "the policy lets this identity serve no account",
            Status::permission_denied,
        ));
    }
    let key = format!("agent:{agent}");
    let slot = take_slot(shared, peer, &key, method)?;
    Ok(Admitted {
        key,
        verified: Verified::Agent {
            agent: agent.to_owned(),
            accounts: serde_json::to_string(&patterns).unwrap_or_default(),
        },
        slot,
    })
}

/// One of the identity's `maxStreamsPerIdentity` slots.
fn take_slot(
    shared: &Shared,
    peer: &AgentPeer,
    key: &str,
    method: &str,
) -> Result<Slot<std::sync::Arc<str>>, Status> {
    shared
        .limits
        .identity_streams
        .try_take(peer.identity.clone())
        .ok_or_else(|| {
            shared.stats.refuse(Refusal::IdentityStreams);
            tracing::warn!(
                identity = &*peer.identity,
                account = key,
                method,
                "stream refused: identity stream limit"
            );
            Status::resource_exhausted("this identity has too many streams open")
        })
}

/// Checks and carries one `Cache` or `Relay` stream of a connection hyper
/// serves (an ingress connection).
pub async fn forward<B>(shared: &Shared, peer: &AgentPeer, req: Request<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let method = req.uri().path().to_owned();
    match admit_channel(shared, peer, &method, req.headers()) {
        Ok(admitted) => carry(shared, peer, req, admitted).await,
        Err(status) => status::response(status),
    }
}

/// Checks and carries one `Assignments` stream of a connection hyper serves.
pub async fn forward_assignments<B>(
    shared: &Shared,
    peer: &AgentPeer,
    bootstrap: bool,
    hello_agent: Option<&str>,
    req: Request<B>,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let method = req.uri().path().to_owned();
    match admit_assignments(shared, peer, bootstrap, hello_agent, &method, req.headers()) {
        Ok(admitted) => carry(shared, peer, req, admitted).await,
        Err(status) => status::response(status),
    }
}

/// Carries an admitted stream to the sidecar rendezvous hashing picks for
/// its key, through a bridge onto the instance's pooled connections.
async fn carry<B>(
    shared: &Shared,
    peer: &AgentPeer,
    req: Request<B>,
    admitted: Admitted,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let identity = &*peer.identity;
    let method = req.uri().path().to_owned();
    let account = admitted.key.clone();
    let Some(lease) = shared.upstreams.pick(&account) else {
        shared.stats.incr(Counter::UpstreamUnavailable);
        return status::unavailable("no upstream instance");
    };
    let instance = lease.instance().clone();
    let upstream = instance.upstream();
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let headers: Vec<(Bytes, Bytes)> = parts
        .headers
        .iter()
        .map(|(n, v)| {
            (
                Bytes::copy_from_slice(n.as_str().as_bytes()),
                Bytes::copy_from_slice(v.as_bytes()),
            )
        })
        .collect();
    let fields = match upstream_head(
        Bytes::copy_from_slice(parts.method.as_str().as_bytes()),
        Bytes::from(path),
        &headers,
        upstream.target(),
        peer,
        &admitted,
    ) {
        Ok(f) => f,
        Err(status) => return status::response(status),
    };
    let counted = shared.stats.metrics().bytes_counter(true);
    // Agent → sidecar bytes, counted as they pass.
    let body = body
        .map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                counted.inc_by(data.len() as u64);
            }
            frame
        })
        .map_err(Into::into)
        .boxed_unsync();
    match upstream.send(fields, body).await {
        Ok(response) => {
            log_carried(shared, identity, &account, &method, upstream.target().url());
            let carried = instance.carried();
            // Sidecar → agent bytes are counted by the upstream connection
            // that reads them.
            response.map(|body| {
                Body::new(UpstreamBody {
                    inner: body,
                    failed: false,
                    _carried: carried,
                    _lease: lease,
                    _slot: admitted.slot,
                })
            })
        }
        Err(e) => {
            // A stream that reached a connection was counted by the
            // instance's outcome; one that found none is counted here.
            if matches!(e, crate::upstream::Error::Unavailable { .. }) {
                shared.stats.incr(Counter::UpstreamUnavailable);
            }
            tracing::warn!(identity, account, method, error = %e, "upstream unavailable");
            status::unavailable(format!("upstream {} unavailable", upstream.target().url()))
        }
    }
}

/// Refuses a channel stream as `Unauthenticated`, counted by `why`.
fn refuse(
    shared: &Shared,
    peer: &AgentPeer,
    why: AuthFailure,
    account: &str,
    method: &str,
    reason: &str,
) -> Status {
    shared.stats.auth_failure(why);
    refuse_with(
        shared,
        peer,
        account,
        method,
        reason,
        Status::unauthenticated,
    )
}

fn refuse_with(
    shared: &Shared,
    peer: &AgentPeer,
    account: &str,
    method: &str,
    reason: &str,
    status: fn(String) -> Status,
) -> Status {
    shared.stats.incr(Counter::StreamsRefused);
    // The token itself is never logged, only why it was refused.
    tracing::warn!(
        identity = &*peer.identity,
        account,
        method,
        remote = %peer.remote,
        reason,
        "stream refused"
    );
    status(reason.to_owned())
}

fn header_str<'a>(map: &'a (impl RequestHeaders + ?Sized), name: &str) -> Option<&'a str> {
    map.text(name)
}

/// Whether an agent header is dropped on the way upstream: hop-by-hop
/// headers (and those `Connection` lists), a `te` other than `trailers`,
/// the token, the development and bootstrap identity headers, and every
/// `spinlink-verified-*` claim.
fn dropped(name: &[u8], value: &[u8], listed: &[&[u8]]) -> bool {
    HOP_BY_HOP.contains(&name)
        || listed.iter().any(|l| l.eq_ignore_ascii_case(name))
        // gRPC sends `te: trailers`, the one TE value HTTP/2 allows.
        || (name == b"te" && value != b"trailers")
        || name == headers::TOKEN.as_bytes()
        || name == DEV_IDENTITY_HEADER.as_bytes()
        || name == crate::identity::jwt::BOOTSTRAP_JWT_HEADER.as_bytes()
        || name.starts_with(headers::VERIFIED_PREFIX.as_bytes())
}

/// The log target of the gateway's access log: one line per carried stream.
/// `SPINLINK_LOG=info,spinlink_gateway::access=off` turns it off, as
/// `access_log off` does for nginx; the streams are still counted.
pub const ACCESS_LOG: &str = "spinlink_gateway::access";

/// Counts and logs a stream carried to the sidecar at `upstream`.
pub fn log_carried(shared: &Shared, identity: &str, account: &str, method: &str, upstream: &str) {
    shared.stats.incr(Counter::StreamsForwarded);
    tracing::info!(target: ACCESS_LOG, identity, account, method, upstream, "stream carried");
}

/// [`upstream_fields`] for an admitted stream of `peer`; a head that
/// cannot be sent is logged and becomes the `Internal` status to answer.
pub fn upstream_head(
    method: Bytes,
    path: Bytes,
    headers: &[(Bytes, Bytes)],
    target: &Target,
    peer: &AgentPeer,
    admitted: &Admitted,
) -> Result<Fields, Status> {
    upstream_fields(
        method,
        path.clone(),
        headers,
        target,
        &peer.identity,
        admitted.verified(),
    )
    .map_err(|message| {
        tracing::warn!(
            identity = &*peer.identity,
            account = admitted.key,
            method = %String::from_utf8_lossy(&path),
            message,
            "stream not forwardable"
        );
        Status::internal(message)
    })
}

/// The head the sidecar gets, as HTTP/2 fields: the same method and path;
/// the upstream's scheme and authority; the agent's headers minus those
/// [`dropped`] names; the verified identity and `verified` headers added.
/// `headers` are the agent's regular (non-pseudo) fields.
pub fn upstream_fields<'a>(
    method: Bytes,
    path: Bytes,
    headers: &[(Bytes, Bytes)],
    target: &Target,
    identity: &str,
    verified: impl IntoIterator<Item = (&'static str, &'a str)>,
) -> Result<Fields, String> {
    let value = |v: &str| {
        if sendable(v.as_bytes()) {
            Ok(Bytes::copy_from_slice(v.as_bytes()))
        } else {
            Err(format!("{v:?} cannot be sent as a header value"))
        }
    };
    // Names the `Connection` header lists are hop-by-hop as well.
    let listed: Vec<&[u8]> = headers
        .iter()
        .filter(|(n, _)| &n[..] == b"connection")
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(|n| n.trim_ascii())
        .collect();
    let (scheme, authority) = target.pseudo_fields();
    let mut fields = Fields::with_capacity(headers.len() + 6);
    fields.push((Bytes::from_static(b":method"), method));
    fields.push((Bytes::from_static(b":scheme"), scheme.clone()));
    fields.push((Bytes::from_static(b":authority"), authority.clone()));
    fields.push((Bytes::from_static(b":path"), path));
    // Sliced, not copied: they share the agent's decoded header block.
    for (name, v) in headers {
        if name.first() != Some(&b':') && !dropped(name, v, &listed) {
            fields.push((name.clone(), v.clone()));
        }
    }
    fields.push((
        Bytes::from_static(headers::VERIFIED_IDENTITY.as_bytes()),
        value(identity)?,
    ));
    for (name, v) in verified {
        fields.push((Bytes::from_static(name.as_bytes()), value(v)?));
    }
    Ok(fields)
}

/// Whether `v` can be a header value: what `http::HeaderValue` accepts
/// (visible ASCII, obs-text, space and tab), checked without building one.
fn sendable(v: &[u8]) -> bool {
    v.iter().fold(true, |ok, &b| {
        ok & ((b >= 0x20 && b != 0x7f) | (b == b'\t'))
    })
}

/// The sidecar's response body, passed through frame by frame. If the
/// upstream stream breaks midway the agent gets `Unavailable` trailers rather
/// than a bare reset, so it can tell "sidecar gone" (reopen the stream) from
/// "gateway bug".
struct UpstreamBody {
    inner: BridgeBody,
    failed: bool,
    _carried: crate::upstream::Carried,
    _lease: Lease,
    _slot: Slot<std::sync::Arc<str>>,
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(e))) => {
                self.failed = true;
                tracing::info!(error = %e, "upstream stream broke");
                let message = match e {
                    BridgeError::Unavailable(m) => m,
                    other => format!("upstream stream broke: {other}"),
                };
                let trailers = status::trailers(&Status::unavailable(message));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn a_value_is_sendable_exactly_when_http_takes_it() {
        for b in 0..=255u8 {
            let v = [b'a', b, b'z'];
            assert_eq!(
                sendable(&v),
                HeaderValue::from_bytes(&v).is_ok(),
                "byte {b:#04x}"
            );
        }
        assert!(sendable(b""));
    }

    #[test]
    fn drops_hop_by_hop_token_and_claims() {
        let keep = |n: &str, v: &str| !dropped(n.as_bytes(), v.as_bytes(), &[b"x-listed"]);
        assert!(keep("content-type", "application/grpc"));
        assert!(keep("te", "trailers"));
        assert!(keep("spinlink-account", "dev"));
        assert!(keep("grpc-timeout", "1S"));
        assert!(!keep("te", "gzip"));
        assert!(!keep("spinlink-token", "x"));
        assert!(!keep("spinlink-verified-identity", "forged"));
        assert!(!keep("spinlink-verified-anything", "forged"));
        assert!(!keep("spinlink-dev-identity", "forged"));
        assert!(!keep("spinlink-bootstrap-jwt", "a.b.c"));
        assert!(!keep("connection", "x-listed"));
        assert!(!keep("x-listed", "1"));
        assert!(!keep("host", "evil"));
    }
}
