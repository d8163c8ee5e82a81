//! `Cache` and `Relay`: the stream's channel token is checked against this
//! connection, identity and the claimed account before anything is opened
//! upstream (`Assignments`: the agent id against the connection's `Hello`); then the stream is carried byte for byte (no protobuf decoding)
//! to the sidecar [`crate::route`] picks, with the gateway's verified headers
//! in place of anything the agent claimed. The response — status, headers,
//! streaming body and trailers — goes back as the sidecar sent it. Each
//! carried stream holds one of its identity's `listener.maxStreamsPerIdentity`
//! slots until its response body ends or is dropped.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Request, Response, Uri, Version};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use spinlink_proto::headers;
use tonic::Status;
use tonic::body::Body;

use super::{Shared, status};
use crate::admin::metrics::UpstreamLabel;
use crate::admin::{Counter, Refusal, Stats};
use crate::identity::{AgentPeer, DEV_IDENTITY_HEADER};
use crate::listener::limits::Slot;
use crate::token::Claims;
use crate::upstream::{BoxError, Lease, RequestBody, Target};

/// Headers that describe one hop, not the message, and are never forwarded.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
];

/// Checks and carries one `Cache` or `Relay` stream.
pub async fn forward(shared: &Shared, peer: &AgentPeer, req: Request<Incoming>) -> Response<Body> {
    let identity = &*peer.identity;
    let method = req.uri().path().to_owned();
    // One value each: a second `spinlink-account` would reach the sidecar
    // unchecked beside the verified one.
    for name in [headers::ACCOUNT, headers::TOKEN] {
        if req.headers().get_all(name).iter().nth(1).is_some() {
            return refuse(
                shared,
                peer,
                "",
                &method,
                &format!("more than one {name} header"),
            );
        }
    }
    let Some(account) = header_str(req.headers(), headers::ACCOUNT) else {
        return refuse(shared, peer, "", &method, "missing spinlink-account header");
    };
    let account = account.to_owned();
    let Some(token) = header_str(req.headers(), headers::TOKEN) else {
        return refuse(
            shared,
            peer,
            &account,
            &method,
            "missing spinlink-token header",
        );
    };
    let claims = Claims {
        binding: &peer.binding,
        identity,
        account: &account,
    };
    if let Err(refused) = shared.tokens.verify(token, claims, SystemTime::now()) {
        return refuse(shared, peer, &account, &method, &refused.to_string());
    }
    carry(
        shared,
        peer,
        req,
        &account,
        &[(headers::VERIFIED_ACCOUNT, &account)],
    )
    .await
}

/// Checks and carries one `Assignments` stream: no channel token, but the
/// connection must have said `Hello`, and the agent id the stream names
/// (`spinlink-agent-id`) must be the one that `Hello` stated. It goes to
/// the sidecar rendezvous hashing picks for `agent:<id>`.
pub async fn forward_assignments(
    shared: &Shared,
    peer: &AgentPeer,
    bootstrap: bool,
    hello_agent: Option<&str>,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.uri().path().to_owned();
    if bootstrap {
        // Kubeconfigs go only to identities the policy names.
        return refuse_with(
            shared,
            peer,
            "",
            &method,
            "dynamic accounts need a client certificate identity",
            Status::permission_denied,
        );
    }
    if req
        .headers()
        .get_all(headers::AGENT_ID)
        .iter()
        .nth(1)
        .is_some()
    {
        return refuse_with(
            shared,
            peer,
            "",
            &method,
            "more than one spinlink-agent-id header",
            Status::unauthenticated,
        );
    }
    let Some(agent) = header_str(req.headers(), headers::AGENT_ID).map(str::to_owned) else {
        return refuse_with(
            shared,
            peer,
            "",
            &method,
            "missing spinlink-agent-id header",
            Status::unauthenticated,
        );
    };
    let Some(hello_agent) = hello_agent else {
        return refuse_with(
            shared,
            peer,
            &agent,
            &method,
            "call Hello on this connection first",
            Status::failed_precondition,
        );
    };
    if hello_agent != agent {
        return refuse_with(
            shared,
            peer,
            &agent,
            &method,
            &format!("agent id {agent:?} is not the one this connection's Hello stated"),
            Status::permission_denied,
        );
    }
    let patterns = shared.policy.account_patterns(&peer.identity);
    if patterns.is_empty() {
        return refuse_with(
            shared,
            peer,
            &agent,
            &method,
            "the policy lets this identity serve no account",
            Status::permission_denied,
        );
    }
    let patterns = serde_json::to_string(&patterns).unwrap_or_default();
    carry(
        shared,
        peer,
        req,
        &format!("agent:{agent}"),
        &[
            (headers::VERIFIED_AGENT, &agent),
            (headers::VERIFIED_ACCOUNTS, &patterns),
        ],
    )
    .await
}

/// Carries a checked stream to the sidecar rendezvous hashing picks for
/// `key`, with the verified identity and the `verified` headers set.
async fn carry(
    shared: &Shared,
    peer: &AgentPeer,
    req: Request<Incoming>,
    key: &str,
    verified: &[(&'static str, &str)],
) -> Response<Body> {
    let identity = &*peer.identity;
    let method = req.uri().path().to_owned();
    let account = key.to_owned();
    let Some(slot) = shared
        .limits
        .identity_streams
        .try_take(peer.identity.clone())
    else {
        shared.stats.refuse(Refusal::IdentityStreams);
        tracing::warn!(
            identity,
            account,
            method,
            "stream refused: identity stream limit"
        );
        return status::response(Status::resource_exhausted(
            "this identity has too many streams open",
        ));
    };

    let Some(lease) = shared.upstreams.pick(&account) else {
        shared.stats.incr(Counter::UpstreamUnavailable);
        return status::unavailable("no upstream instance");
    };
    let upstream = lease.instance().upstream();
    let counted = shared.stats.metrics().bytes_counter(true);
    let upstream_req = match upstream_request(req, upstream.target(), identity, verified) {
        Ok(r) => r.map(|body| {
            // Agent → sidecar bytes, counted as they pass.
            body.map_frame(move |frame| {
                if let Some(data) = frame.data_ref() {
                    counted.inc_by(data.len() as u64);
                }
                frame
            })
            .boxed_unsync()
        }),
        Err(message) => {
            tracing::warn!(identity, account, method, message, "stream not forwardable");
            return status::internal(message);
        }
    };
    match upstream.send(upstream_req).await {
        Ok(response) => {
            shared.upstreams.stream_ok(lease.instance());
            shared.stats.incr(Counter::StreamsForwarded);
            tracing::info!(
                identity,
                account,
                method,
                upstream = upstream.target().url(),
                status = response.status().as_u16(),
                "stream forwarded"
            );
            let url = upstream.target().url().to_owned();
            let label = UpstreamLabel {
                upstream: url.clone(),
            };
            let metrics = shared.stats.metrics();
            metrics.streams.get_or_create(&label).inc();
            metrics.streams_open.get_or_create(&label).inc();
            let stats = shared.stats.clone();
            let gone = Box::pin(lease.gone().clone().cancelled_owned());
            let down = metrics.bytes_counter(false);
            response.map(|body| {
                Body::new(UpstreamBody {
                    inner: Some(body),
                    url,
                    failed: false,
                    down,
                    stats,
                    label,
                    gone,
                    _lease: lease,
                    _slot: slot,
                })
            })
        }
        Err(e) => {
            shared.upstreams.stream_failed(lease.instance());
            shared.stats.incr(Counter::UpstreamUnavailable);
            tracing::warn!(identity, account, method, error = %e, "upstream unavailable");
            status::unavailable(format!("upstream {} unavailable", upstream.target().url()))
        }
    }
}

fn refuse(
    shared: &Shared,
    peer: &AgentPeer,
    account: &str,
    method: &str,
    reason: &str,
) -> Response<Body> {
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
) -> Response<Body> {
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
    status::response(status(reason.to_owned()))
}

fn header_str<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
}

/// Whether an agent header is dropped on the way upstream.
fn dropped(name: &HeaderName, value: &HeaderValue, listed: &[HeaderName]) -> bool {
    let n = name.as_str();
    HOP_BY_HOP.contains(name)
        || listed.contains(name)
        // gRPC sends `te: trailers`, the one TE value HTTP/2 allows.
        || (name == header::TE && value.as_bytes() != b"trailers")
        || n == headers::TOKEN
        || n == DEV_IDENTITY_HEADER
        || n == crate::identity::jwt::BOOTSTRAP_JWT_HEADER
        || n.starts_with(headers::VERIFIED_PREFIX)
}

/// The request the sidecar gets: same method, path and body; the upstream's
/// scheme and authority; the agent's headers minus hop-by-hop ones, the token
/// and any `spinlink-verified-*` claims; the gateway's verified headers added.
fn upstream_request(
    req: Request<Incoming>,
    target: &Target,
    identity: &str,
    verified: &[(&'static str, &str)],
) -> Result<Request<RequestBody>, String> {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let uri = Uri::builder()
        .scheme(target.scheme().clone())
        .authority(target.authority().clone())
        .path_and_query(path)
        .build()
        .map_err(|e| format!("building upstream URI: {e}"))?;
    // Names the `Connection` header lists are hop-by-hop as well.
    let listed: Vec<HeaderName> = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    let mut out = HeaderMap::with_capacity(parts.headers.len() + 2);
    for (name, value) in &parts.headers {
        if !dropped(name, value, &listed) {
            out.append(name.clone(), value.clone());
        }
    }
    let value = |v: &str| {
        HeaderValue::from_str(v).map_err(|_| format!("{v:?} cannot be sent as a header value"))
    };
    out.insert(headers::VERIFIED_IDENTITY, value(identity)?);
    for (name, v) in verified {
        out.insert(*name, value(v)?);
    }

    let body: RequestBody = body.map_err(|e| -> BoxError { Box::new(e) }).boxed_unsync();
    let mut upstream = Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = uri;
    *upstream.version_mut() = Version::HTTP_2;
    *upstream.headers_mut() = out;
    Ok(upstream)
}

/// The sidecar's response body, passed through frame by frame. If the
/// upstream stream breaks midway the agent gets `Unavailable` trailers rather
/// than a bare reset, so it can tell "sidecar gone" from "gateway bug".
struct UpstreamBody {
    /// Taken (and so reset towards the sidecar) when the instance goes.
    inner: Option<Incoming>,
    url: String,
    failed: bool,
    /// Sidecar → agent bytes.
    down: prometheus_client::metrics::counter::Counter,
    stats: std::sync::Arc<Stats>,
    label: UpstreamLabel,
    /// Ready when the instance left the set or rotation.
    gone: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    _lease: Lease,
    _slot: Slot<std::sync::Arc<str>>,
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        self.stats
            .metrics()
            .streams_open
            .get_or_create(&self.label)
            .dec();
        self.stats.notify();
    }
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
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        // The sidecar's frames first: `gone` is polled (which takes the
        // cancellation token's lock) only when there is nothing to pass on.
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.down.inc_by(data.len() as u64);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.failed = true;
                tracing::info!(upstream = %self.url, error = %e, "upstream stream broke");
                let trailers = status::trailers(&Status::unavailable("upstream stream broke"));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending if self.gone.as_mut().poll(cx).is_ready() => {
                // Retryable: the agent reopens the stream, on the new owner.
                self.failed = true;
                self.inner = None;
                tracing::info!(upstream = %self.url, "upstream instance gone; stream ended");
                let trailers = status::trailers(&Status::unavailable(
                    "upstream instance gone; reopen the stream",
                ));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.as_ref().is_none_or(|i| i.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_hop_by_hop_token_and_claims() {
        let keep = |n: &str, v: &str| {
            !dropped(
                &HeaderName::try_from(n).unwrap(),
                &HeaderValue::from_str(v).unwrap(),
                &[HeaderName::from_static("x-listed")],
            )
        };
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
