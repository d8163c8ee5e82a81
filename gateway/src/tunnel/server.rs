//! Agent connections: the tunnel's [`Role`] on the HTTP/2 engine
//! ([`crate::engine::conn`]). Each stream an agent opens is decided on its
//! head, by gRPC path:
//!
//! - `Cache` and `Relay` (and `Assignments`) pass the checks of
//!   [`crate::tunnel::proxy`] and are opened on the connection the chosen
//!   sidecar's pool gives, frames then flowing both ways without a task of
//!   their own;
//! - `Control` is answered here: its events (`Reconnect`, `Heartbeat`) are
//!   written by this connection's task;
//! - `Hello` goes through a [`Bridge`] to the gateway's gRPC service
//!   ([`crate::tunnel::handle`]) in a task of its own;
//! - anything else, and every refusal, is a trailers-only gRPC status.
//!
//! The role also keeps the connection's clocks: drain (`Reconnect{draining}`
//! then GOAWAY), idle close, maximum age (`Reconnect{max-age}`, GOAWAY after
//! the grace, close one grace later) and `Control` heartbeats.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use spinlink_proto::paths;
use spinlink_proto::v1::{ControlEvent, Reconnect, control_event};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::Status;

use super::proxy::{self, Admitted};
use super::{ConnPeer, Shared, status};
use crate::engine::bridge::{self, Bridge};
use crate::engine::conn::{
    Conn, ConnError, InStream, Local, Offence, Role, Signal, StreamRefused, Target,
};
use crate::engine::link::{Failure, Fields, Link, Route, Side, Sink, grpc_status_fields};
use crate::limits::TokenBucket;
use crate::stats::{Counter, Glitch, Refusal};

/// Receive window of each agent stream: enough for a cluster's initial
/// listing to flow over a long round trip; a stream whose sidecar stalls
/// holds at most this much in the gateway.
pub const STREAM_WINDOW: u32 = 1 << 20;
/// Receive window of each agent connection.
pub const CONN_WINDOW: u32 = 8 << 20;
/// Glitches ([`Glitch`]: resets, streams reset for the agent's fault,
/// frames that do no work) an agent connection may cost per second, on
/// average, before it is closed with GOAWAY `ENHANCE_YOUR_CALM`; bursts of
/// [`GLITCH_BURST`]. An honest agent costs a few an hour.
pub const GLITCHES_PER_SECOND: f64 = 100.0;
/// See [`GLITCHES_PER_SECOND`].
pub const GLITCH_BURST: u32 = 1_000;
/// How long a closing connection may take to write its last frames.
const CLOSE_FLUSH: Duration = Duration::from_secs(5);

/// The listener's limits and clocks that apply to one agent connection.
#[derive(Debug, Clone, Copy)]
pub struct AgentLimits {
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub max_header_list_size: u32,
    /// Close after this long without an open stream.
    pub idle_timeout: Duration,
    /// This connection's maximum age (jitter applied) and the grace after it.
    pub max_age: Option<(Duration, Duration)>,
    /// Announced in `Reconnect{draining}`.
    pub drain_grace: Duration,
    /// Interval of keepalive PINGs.
    pub keepalive: Duration,
    /// How long a PING may go unanswered.
    pub keepalive_timeout: Duration,
    /// How long the agent has, once TLS is up, to send the HTTP/2 preface
    /// and its first SETTINGS.
    pub preface_timeout: Duration,
}

/// Where the connection is in its maximum-age sequence.
#[derive(Debug, Clone, Copy)]
enum Age {
    Until(Instant),
    Asked(Instant),
    GoingAway(Instant),
    Done,
}

/// The agent side's role.
struct AgentRole {
    shared: Arc<Shared>,
    peer: Arc<ConnPeer>,
    limits: AgentLimits,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    hard: Pin<Box<WaitForCancellationFutureOwned>>,
    draining: bool,
    idle_since: Option<Instant>,
    age: Age,
    /// The `Control` stream events go on.
    control: Option<u32>,
    next_heartbeat: Option<Instant>,
    glitches: TokenBucket,
    timer: Pin<Box<Sleep>>,
    /// Its place under the gateway's buffer budget.
    budget: crate::engine::budget::Registration,
}

impl AgentRole {
    /// A trailers-only answer with `status`; the stream ends here.
    fn answer(&self, link: &Arc<Link>, id: u32, end: bool, status: Status) -> InStream {
        let response = status::response(status);
        link.accept(id, None);
        link.headers(
            id,
            bridge::response_fields(response.status(), response.headers()),
            true,
        );
        InStream::new(Target::Discard, STREAM_WINDOW).recv_closed(end)
    }

    fn hello(
        &self,
        link: &Arc<Link>,
        id: u32,
        fields: &Fields,
        headers: http::HeaderMap,
        end: bool,
    ) -> InStream {
        let bridge = Bridge::new(true);
        link.accept(
            id,
            Some(Route {
                sink: bridge.clone(),
                id: 0,
            }),
        );
        let body = bridge.body(
            Route {
                sink: link.clone(),
                id,
            },
            false,
        );
        let mut req = http::Request::new(body);
        *req.method_mut() = http::Method::POST;
        *req.version_mut() = http::Version::HTTP_2;
        if let Ok(uri) = http::Uri::try_from(field(fields, b":path")) {
            *req.uri_mut() = uri;
        }
        *req.headers_mut() = headers;
        let (shared, peer, link2, writer) = (
            self.shared.clone(),
            self.peer.clone(),
            link.clone(),
            bridge.clone(),
        );
        tokio::spawn(async move {
            let response = super::handle(shared, &peer, req).await;
            let (parts, body) = response.into_parts();
            let end = http_body::Body::is_end_stream(&body);
            link2.headers(
                id,
                bridge::response_fields(parts.status, &parts.headers),
                end,
            );
            if !end {
                let _ = writer.write_body(&link2, id, body).await;
            }
        });
        InStream::new(
            Target::Route(Route {
                sink: bridge,
                id: 0,
            }),
            STREAM_WINDOW,
        )
        .recv_closed(end)
    }

    fn control(&mut self, link: &Arc<Link>, id: u32, end: bool) -> InStream {
        link.accept(id, None);
        link.headers(
            id,
            vec![
                (Bytes::from_static(b":status"), Bytes::from_static(b"200")),
                (
                    Bytes::from_static(b"content-type"),
                    Bytes::from_static(b"application/grpc"),
                ),
            ],
            false,
        );
        // A second `Control` replaces the first, which ends.
        if let Some(old) = self.control.replace(id) {
            link.headers(old, grpc_status_fields(0, "", false), true);
        }
        self.next_heartbeat = self
            .shared
            .limits
            .control_heartbeat
            .map(|every| Instant::now() + every);
        tracing::debug!(remote = %self.peer.remote, "control stream open");
        // The agent's one `ControlRequest` is not needed.
        InStream::new(Target::Discard, STREAM_WINDOW).recv_closed(end)
    }

    /// Sends `Reconnect{reason, deadline}` on the `Control` stream, if one is
    /// open, and ends it. Returns whether it was sent.
    fn reconnect(&mut self, link: &Arc<Link>, reason: &str, deadline: Duration) -> bool {
        let Some(id) = self.control.take() else {
            return false;
        };
        let event = ControlEvent {
            event: Some(control_event::Event::Reconnect(Reconnect {
                reason: reason.to_owned(),
                deadline_millis: u32::try_from(deadline.as_millis()).unwrap_or(u32::MAX),
            })),
        };
        link.data(id, &grpc_message(&event), false);
        link.headers(id, grpc_status_fields(0, "", false), true);
        self.next_heartbeat = None;
        true
    }

    fn carry(
        &self,
        link: &Arc<Link>,
        id: u32,
        fields: &Fields,
        end: bool,
        peer: &crate::identity::AgentPeer,
        admitted: Admitted,
    ) -> InStream {
        let shared = &self.shared;
        let identity = &*peer.identity;
        let method = field(fields, b":path");
        let account = admitted.key.as_str();
        let Some(lease) = shared.upstreams.pick(account) else {
            shared.stats.incr(Counter::UpstreamUnavailable);
            return self.answer(link, id, end, Status::unavailable("no upstream instance"));
        };
        let instance = lease.instance().clone();
        let upstream = instance.upstream();
        let up_fields = match proxy::upstream_head(
            field_bytes(fields, b":method"),
            field_bytes(fields, b":path"),
            fields,
            upstream.target(),
            peer,
            &admitted,
        ) {
            Ok(f) => f,
            Err(status) => return self.answer(link, id, end, status),
        };
        link.accept(id, None);
        let back = Route {
            sink: link.clone(),
            id,
        };
        let Some((up, up_id)) = upstream.open(&up_fields, end, back) else {
            shared.stats.incr(Counter::UpstreamUnavailable);
            tracing::warn!(identity, account, method, "upstream takes no new streams");
            return self.answer(
                link,
                id,
                end,
                Status::unavailable(format!("upstream {} unavailable", upstream.target().url())),
            );
        };
        let forward = Route {
            sink: up,
            id: up_id,
        };
        link.set_source(id, forward.clone());
        proxy::log_carried(shared, identity, account, method, upstream.target().url());
        let guard = Carried {
            _carried: instance.carried(),
            _lease: lease,
            _slot: admitted.slot,
        };
        InStream::new(Target::Route(forward), STREAM_WINDOW)
            .with_guard(Box::new(guard))
            .with_message_limit(shared.limits.max_message_bytes)
            .recv_closed(end)
    }

    fn poll_clocks(
        &mut self,
        cx: &mut Context<'_>,
        open_streams: usize,
        link: &Arc<Link>,
    ) -> Signal {
        loop {
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            let mut at = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
            if open_streams == 0 {
                let since = *self.idle_since.get_or_insert(now);
                if now >= since + self.limits.idle_timeout {
                    self.shared.stats.refuse(Refusal::Idle);
                    tracing::info!(remote = %self.peer.remote, "agent connection idle; closing");
                    return Signal::GoAway;
                }
                at(since + self.limits.idle_timeout);
            } else {
                self.idle_since = None;
            }
            match self.age {
                Age::Until(t) if now >= t => {
                    let grace = self.limits.max_age.map_or(Duration::ZERO, |(_, g)| g);
                    self.reconnect(link, "max-age", grace);
                    tracing::info!(
                        remote = %self.peer.remote,
                        "agent connection at its maximum age; asked to reconnect"
                    );
                    // The agent moves first (make-before-break); GOAWAY after the grace.
                    self.age = Age::Asked(now + grace);
                    continue;
                }
                Age::Asked(t) if now >= t => {
                    let grace = self.limits.max_age.map_or(Duration::ZERO, |(_, g)| g);
                    self.age = Age::GoingAway(now + grace);
                    return Signal::GoAway;
                }
                Age::GoingAway(t) if now >= t => {
                    self.age = Age::Done;
                    return Signal::Close;
                }
                Age::Until(t) | Age::Asked(t) | Age::GoingAway(t) => at(t),
                Age::Done => {}
            }
            if let (Some(id), Some(t)) = (self.control, self.next_heartbeat) {
                if now >= t {
                    link.data(id, &grpc_message(&super::hello::heartbeat()), false);
                    let every = self
                        .shared
                        .limits
                        .control_heartbeat
                        .unwrap_or(Duration::MAX);
                    self.next_heartbeat = now.checked_add(every);
                    continue;
                }
                at(t);
            }
            let Some(next) = next else {
                return Signal::None;
            };
            // Re-armed only to fire earlier (or once fired): a deadline that
            // moved later just wakes the task early, to look again.
            if next < self.timer.deadline() || self.timer.is_elapsed() {
                self.timer.as_mut().reset(next);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Signal::None;
            }
        }
    }
}

impl Role for AgentRole {
    const SIDE: Side = Side::Server;

    fn open(&mut self, link: &Arc<Link>, id: u32, fields: Fields, end: bool) -> InStream {
        let path = field(&fields, b":path");
        let conn = &self.peer;
        let bootstrap = conn.control.is_bootstrap();
        if path == paths::HELLO {
            let Ok(headers) = bridge::fields_to_map(&fields) else {
                return self.answer(
                    link,
                    id,
                    end,
                    Status::invalid_argument("invalid header value"),
                );
            };
            // Identity (bootstrap JWT included), rate and size: the service's.
            return self.hello(link, id, &fields, headers, end);
        }
        // Carried streams are checked on the fields themselves: no map.
        let headers = &fields[..];
        let Some(peer) = conn.agent(headers) else {
            let message = if bootstrap {
                "no agent identity: call Hello with a bootstrap JWT first".to_owned()
            } else {
                format!(
                    "no agent identity (insecure listener: send `{}`)",
                    crate::identity::DEV_IDENTITY_HEADER
                )
            };
            return self.answer(link, id, end, Status::unauthenticated(message));
        };
        let admitted = match path {
            paths::CONTROL => return self.control(link, id, end),
            paths::CACHE | paths::RELAY => proxy::admit_channel(&self.shared, &peer, path, headers),
            paths::ASSIGNMENTS => {
                let hello_agent = conn.control.hello_agent();
                proxy::admit_assignments(
                    &self.shared,
                    &peer,
                    bootstrap,
                    hello_agent.as_deref(),
                    path,
                    headers,
                )
            }
            other => {
                let message = format!("method {other} is not served by this gateway");
                return self.answer(link, id, end, Status::unimplemented(message));
            }
        };
        match admitted {
            Ok(admitted) => self.carry(link, id, &fields, end, &peer, admitted),
            Err(status) => self.answer(link, id, end, status),
        }
    }

    fn glitch(&mut self, glitch: Glitch) -> bool {
        self.shared.stats.metrics().glitch(glitch);
        self.glitches.try_take(std::time::Instant::now())
    }

    fn cancelled_unanswered(&mut self) -> bool {
        // Per identity, across its connections: reconnecting buys no more.
        // A connection without one (insecure listener, JWT bootstrap) is
        // keyed by its address.
        let key = self
            .peer
            .identity
            .clone()
            .unwrap_or_else(|| Arc::from(self.peer.remote.ip().to_string()));
        self.shared
            .limits
            .cancels
            .try_take(&key, std::time::Instant::now())
    }

    fn refused(&mut self, why: StreamRefused) {
        self.shared.stats.refuse(match why {
            StreamRefused::Limit => Refusal::ConnectionStreams,
            StreamRefused::GoingAway => Refusal::GoingAway,
        });
    }

    fn within_budget(&mut self, cx: &Context<'_>, bytes: usize) -> bool {
        self.budget.report(bytes, cx.waker())
    }

    fn poll_signal(
        &mut self,
        cx: &mut Context<'_>,
        open_streams: usize,
        link: &Arc<Link>,
    ) -> Signal {
        if self.hard.as_mut().poll(cx).is_ready() {
            return Signal::Close;
        }
        if !self.draining && self.shutdown.as_mut().poll(cx).is_ready() {
            self.draining = true;
            self.reconnect(link, "draining", self.limits.drain_grace);
            // GOAWAY: no new streams; the open ones run on until the grace ends.
            return Signal::GoAway;
        }
        self.poll_clocks(cx, open_streams, link)
    }

    fn failure(&self) -> Failure {
        Failure::Cancel
    }
}

/// What a carried stream holds until it ends.
struct Carried {
    _carried: crate::upstream::Carried,
    _lease: crate::upstream::Lease,
    _slot: crate::limits::Slot<Arc<str>>,
}

/// The value of field `name` (empty if absent).
fn field<'a>(fields: &'a Fields, name: &[u8]) -> &'a str {
    fields
        .iter()
        .find(|(n, _)| &n[..] == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .unwrap_or("")
}

/// The value of field `name` (empty if absent), sharing the block's buffer.
fn field_bytes(fields: &Fields, name: &[u8]) -> Bytes {
    fields
        .iter()
        .find(|(n, _)| &n[..] == name)
        .map_or_else(Bytes::new, |(_, v)| v.clone())
}

/// A gRPC message: uncompressed flag, length, then the protobuf.
fn grpc_message(m: &impl prost::Message) -> Bytes {
    let len = m.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(len as u32);
    let _ = m.encode(&mut out);
    out.freeze()
}

/// Serves one agent connection over `io` (after TLS and naming) until it
/// ends: drained on `shutdown`, closed on `hard`.
///
/// The connection's state is built before the future is, so the future holds
/// it once (an `async fn` would also keep room for its arguments for the
/// connection's whole life).
pub fn serve<IO>(
    io: IO,
    peer: ConnPeer,
    shared: Arc<Shared>,
    limits: AgentLimits,
    shutdown: CancellationToken,
    hard: CancellationToken,
) -> impl std::future::Future<Output = ()>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let remote = peer.remote;
    let local = Local {
        max_concurrent_streams: limits.max_concurrent_streams,
        stream_window: STREAM_WINDOW,
        conn_window: CONN_WINDOW,
        max_header_list_size: limits.max_header_list_size,
        header_table_size: spinlink_http2::frame::DEFAULT_HEADER_TABLE_SIZE,
        keepalive: limits.keepalive,
        keepalive_timeout: limits.keepalive_timeout,
        preface_timeout: Some(limits.preface_timeout),
    };
    let link = Link::new(
        Side::Server,
        Arc::from(remote.to_string()),
        local.preamble(Side::Server),
        // Answers to agents are a few short fields: no table kept per connection.
        spinlink_http2::hpack::Encoder::new(0).without_huffman(),
    );
    let now = Instant::now();
    let role = AgentRole {
        shared: shared.clone(),
        peer: Arc::new(peer),
        limits,
        shutdown: Box::pin(shutdown.cancelled_owned()),
        hard: Box::pin(hard.cancelled_owned()),
        draining: false,
        idle_since: None,
        age: limits
            .max_age
            .map_or(Age::Done, |(age, _)| Age::Until(now + age)),
        control: None,
        next_heartbeat: None,
        glitches: TokenBucket::new(GLITCHES_PER_SECOND, GLITCH_BURST, std::time::Instant::now()),
        timer: Box::pin(tokio::time::sleep_until(now)),
        budget: shared.limits.buffers.register(),
    };
    let bytes = shared.stats.metrics().bytes_counter(true);
    let mut conn = Conn::new(io, link, role, local);
    async move {
        let mut flush_deadline: Option<Pin<Box<Sleep>>> = None;
        let result = poll_fn(|cx| {
            let r = conn.poll_run(cx);
            let n = conn.take_forwarded();
            if n > 0 {
                bytes.inc_by(n);
            }
            if r.is_pending() && conn.is_closing() {
                // A peer that reads nothing cannot hold the connection open.
                let deadline =
                    flush_deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(CLOSE_FLUSH)));
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(()));
                }
            }
            r
        })
        .await;
        conn.shut();
        match result {
            Ok(()) => tracing::debug!(%remote, "agent connection closed"),
            Err(e @ (ConnError::Preface | ConnError::Protocol(..))) => {
                shared.stats.refuse(Refusal::Protocol);
                tracing::info!(%remote, error = %e, "agent connection ended");
            }
            Err(e @ (ConnError::PrefaceTimeout(_) | ConnError::Offence(_))) => {
                shared.stats.refuse(match e {
                    ConnError::Offence(Offence::HeaderListTooLarge) => Refusal::HeaderListTooLarge,
                    ConnError::Offence(Offence::WindowOverflow) => Refusal::WindowOverflow,
                    ConnError::Offence(Offence::Glitches) => Refusal::Glitches,
                    ConnError::Offence(Offence::MemoryBudget) => Refusal::MemoryBudget,
                    ConnError::Offence(Offence::Cancels) => Refusal::Cancels,
                    _ => Refusal::PrefaceTimeout,
                });
                tracing::info!(%remote, error = %e, "agent connection ended");
            }
            Err(e) => tracing::info!(%remote, error = %e, "agent connection ended"),
        }
    }
}
