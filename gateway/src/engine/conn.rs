//! The task that drives one HTTP/2 connection, on either side ([`Role`]):
//! it reads and checks frames, keeps the receive windows, forwards each
//! stream's headers and data to where its [`Target`] says, and writes what
//! its [`Link`] collected. Both the agent-facing server connections and the
//! sidecar-facing client connections run this loop; what differs — who opens
//! streams, what a failure looks like, the timers — is the role's.
//!
//! One `poll` does, in order: take what other tasks left (credits, ended
//! streams, new routes); the role's signals (drain, idle, age); read and
//! handle frames (bounded, for fairness, and paused while too much waits to
//! be written); write. It never blocks reading on writing or the reverse.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use spinlink_http2::frame::{self, Frame, FrameError, HEAD_LEN, Head, Reason, Settings};
use spinlink_http2::hpack::{DecodeError, Decoder};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::link::{Deliver, Ended, Failure, Fields, Link, Route, Side};
use super::messages::Messages;
use crate::stats::Glitch;

/// Most bytes read and handled in one poll before yielding to other tasks.
const READ_BUDGET: usize = 256 * 1024;
/// Size of each worker thread's read buffer: what one read may take.
const READ_SCRATCH: usize = 64 * 1024;
/// Room below which the read buffer is renewed: a whole frame of the largest
/// size fits in what is left.
const READ_MIN: usize = frame::HEAD_LEN + frame::DEFAULT_MAX_FRAME_SIZE as usize;

thread_local! {
    /// The buffer every connection polled on this thread reads into. A
    /// connection keeps only the start of a frame that has not fully
    /// arrived, so an idle one holds no read buffer at all.
    static SCRATCH: std::cell::Cell<BytesMut> = std::cell::Cell::new(BytesMut::new());
}
/// While more than this waits to be written, the connection reads nothing
/// (a peer that sends PINGs or SETTINGS without reading the answers).
const MAX_WRITE_BACKLOG: usize = 4 * 1024 * 1024;
/// Largest header block assembled from HEADERS and CONTINUATION frames.
///
/// # What one connection's header decoding can hold
///
/// With `L` its SETTINGS_MAX_HEADER_LIST_SIZE and `T` its
/// SETTINGS_HEADER_TABLE_SIZE, at any moment at most:
///
/// - the block being assembled: at most this, in a buffer of under twice
///   it (128 KiB) — only while CONTINUATIONs arrive;
/// - the HPACK table: `T` of names and values, under `2 T` with its
///   entries' bookkeeping;
/// - while one block is decoded: names and values under `2 L` (the decoder
///   stops at `L`, [`spinlink_http2::hpack::Decoder::decode`]); their
///   places and the fields handed on, at most `L / 32` of them, under
///   `3.5 L`; one Huffman-decoded string or copied name, at most `L`.
///
/// For an agent (`L` 16 KiB, `T` 4 KiB) that is under 240 KiB, whatever
/// the block refers to; before the decoder stopped at `L`, a 64 KiB block
/// of references to one 4 KiB entry decoded to about 260 MB.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Bytes of one connection's received data that may wait at the other side
/// before its connection window stops being granted again.
const MAX_HELD: usize = 8 * 1024 * 1024;
/// How long the connection may sit without a frame before housekeeping gives
/// its read and write buffers back.
const HOUSEKEEPING: Duration = Duration::from_secs(5);

/// What this side announces in its SETTINGS, and the windows it grants.
#[derive(Debug, Clone, Copy)]
pub struct Local {
    /// SETTINGS_MAX_CONCURRENT_STREAMS (server side).
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window.
    pub stream_window: u32,
    /// The connection's receive window.
    pub conn_window: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub max_header_list_size: u32,
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub header_table_size: u32,
    /// Interval of keepalive PINGs.
    pub keepalive: Duration,
    /// How long a PING may go unanswered.
    pub keepalive_timeout: Duration,
    /// Server side: how long the client has, from the start, to send its
    /// preface and first SETTINGS (RFC 9113 §3.4); `None` waits for ever.
    pub preface_timeout: Option<Duration>,
}

impl Local {
    /// The SETTINGS frame, and the WINDOW_UPDATE that raises the connection
    /// window from its default, as one preamble.
    pub fn preamble(&self, side: Side) -> BytesMut {
        let mut out = BytesMut::with_capacity(64);
        if side == Side::Client {
            out.extend_from_slice(frame::PREFACE);
        }
        Settings {
            header_table_size: Some(self.header_table_size),
            enable_push: (side == Side::Client).then_some(false),
            max_concurrent_streams: (side == Side::Server).then_some(self.max_concurrent_streams),
            initial_window_size: Some(self.stream_window),
            max_frame_size: None,
            max_header_list_size: Some(self.max_header_list_size),
        }
        .write(&mut out);
        let raise = self.conn_window.saturating_sub(frame::DEFAULT_WINDOW);
        if raise > 0 {
            frame::write_window_update(&mut out, 0, raise);
        }
        out
    }
}

/// Where a received stream's frames go.
#[derive(Debug)]
pub enum Target {
    /// Forwarded to another connection or a bridge.
    Route(Route),
    /// Read and dropped (a refused stream, the `Control` request).
    Discard,
}

/// The receiving half of one stream.
pub struct InStream {
    /// What the peer may still send on it.
    window: i64,
    /// Bytes consumed and not yet granted again.
    unreleased: u32,
    /// Bytes forwarded that wait at the other side, not yet credited.
    held: usize,
    /// END_STREAM arrived (or reading stopped).
    recv_closed: bool,
    /// Whether a header block arrived (the request, or the response head).
    head_seen: bool,
    /// Where its frames go.
    pub target: Target,
    /// Held for the stream's life and dropped with it (the server's stream
    /// slot, lease and gauge).
    pub guard: Option<Box<dyn Send + Sync>>,
    /// The gRPC messages it carries, when their sizes are limited.
    messages: Option<Messages>,
}

impl InStream {
    /// A stream receiving into `target` with `window` granted.
    pub fn new(target: Target, window: u32) -> Self {
        Self {
            window: i64::from(window),
            unreleased: 0,
            held: 0,
            recv_closed: false,
            head_seen: false,
            target,
            guard: None,
            messages: None,
        }
    }

    /// Reads the gRPC message prefixes in its DATA: one declaring more than
    /// `limit` bytes resets the stream (`ENHANCE_YOUR_CALM`, which gRPC
    /// reads as `RESOURCE_EXHAUSTED`) before it is forwarded.
    #[must_use]
    pub fn with_message_limit(mut self, limit: u32) -> Self {
        self.messages = Some(Messages::new(limit));
        self
    }

    /// Keeps `guard` until the stream is gone.
    #[must_use]
    pub fn with_guard(mut self, guard: Box<dyn Send + Sync>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Marks the request as wholly received (it came with END_STREAM).
    #[must_use]
    pub fn recv_closed(mut self, closed: bool) -> Self {
        self.recv_closed = closed;
        self.head_seen = true;
        self
    }
}

/// What the role tells the connection to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Nothing.
    None,
    /// Send GOAWAY: no new streams; close once the open ones are done.
    GoAway,
    /// Close now.
    Close,
}

/// The side-specific parts of a connection.
pub trait Role: Send + 'static {
    /// Server or client.
    const SIDE: Side;

    /// Server side: the head of a stream the peer opened. Returns the stream,
    /// having written any immediate answer into `link`.
    fn open(&mut self, link: &Arc<Link>, id: u32, fields: Fields, end_stream: bool) -> InStream;

    /// Client side: whether a stream got its response head (`true`) or
    /// failed before it (`false`), for the instance's health.
    fn answered(&mut self, _ok: bool) {}

    /// Server side: the peer made the connection do work for nothing
    /// ([`Glitch`]). `false` when its budget is spent: the connection ends
    /// with GOAWAY `ENHANCE_YOUR_CALM` ([`Offence::Glitches`]).
    fn glitch(&mut self, _glitch: Glitch) -> bool {
        true
    }

    /// Server side: a stream carried to a sidecar ends by the peer's doing
    /// (its reset, or a stream error its frames caused) before the sidecar
    /// answered, so the sidecar gets a reset for a stream it may not have
    /// taken yet. `false` ends the connection ([`Offence::Cancels`]).
    fn cancelled_unanswered(&mut self) -> bool {
        true
    }

    /// Server side: a stream the peer opened was answered `REFUSED_STREAM`
    /// without being processed, for the refusal count.
    fn refused(&mut self, _why: StreamRefused) {}

    /// The connection holds `bytes` for its peer now ([`super::budget`]);
    /// `false` when the gateway's buffer budget needs it to end
    /// ([`Offence::MemoryBudget`]). `cx` is woken when that happens.
    fn within_budget(&mut self, _cx: &Context<'_>, _bytes: usize) -> bool {
        true
    }

    /// What the connection's task should do now: drain, idle, age signals.
    /// Registers wakeups for the next one with `cx`.
    fn poll_signal(
        &mut self,
        cx: &mut Context<'_>,
        open_streams: usize,
        link: &Arc<Link>,
    ) -> Signal;

    /// What the other halves of this connection's streams are told when the
    /// connection (or one stream here) dies.
    fn failure(&self) -> Failure;
}

/// Why a stream was refused before it was processed (server side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRefused {
    /// SETTINGS_MAX_CONCURRENT_STREAMS streams were already open.
    Limit,
    /// It came after this side's GOAWAY.
    GoingAway,
}

/// A WINDOW_UPDATE smaller than this (and not the last octets of a window)
/// is a [`Glitch`]: honest peers return credit in large steps.
pub const TINY_WINDOW_UPDATE: u32 = 1024;

/// A limit the peer went past, which ends the connection with GOAWAY and is
/// counted by name (the other protocol errors are counted together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offence {
    /// A header block that decodes to more than SETTINGS_MAX_HEADER_LIST_SIZE
    /// (the HPACK bomb). Decoding stopped at the limit, so the HPACK tables
    /// are out of step and the connection cannot go on; and a stream reset
    /// would let the peer send it again at once.
    HeaderListTooLarge,
    /// A WINDOW_UPDATE on the connection, or a change of
    /// SETTINGS_INITIAL_WINDOW_SIZE, that pushes a send window past 2^31−1
    /// (RFC 9113 §6.9.1, §6.9.2).
    WindowOverflow,
    /// The misbehaviour budget ran out ([`Glitch`]).
    Glitches,
    /// The gateway's buffers were over `listener.maxBufferedBytes` and this
    /// connection held among the most ([`super::budget`]).
    MemoryBudget,
    /// The peer's identity cancelled more carried streams before their
    /// answer than its budget allows ([`Role::cancelled_unanswered`]).
    Cancels,
}

impl Offence {
    /// The GOAWAY code: ENHANCE_YOUR_CALM for a limit, as nginx answers a
    /// header list past `large_client_header_buffers`; FLOW_CONTROL_ERROR
    /// where RFC 9113 names it.
    pub fn reason(self) -> Reason {
        match self {
            Self::HeaderListTooLarge | Self::Glitches | Self::MemoryBudget | Self::Cancels => {
                Reason::ENHANCE_YOUR_CALM
            }
            Self::WindowOverflow => Reason::FLOW_CONTROL_ERROR,
        }
    }

    /// What it is, also the GOAWAY's debug data.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HeaderListTooLarge => "header list larger than SETTINGS_MAX_HEADER_LIST_SIZE",
            Self::WindowOverflow => "flow-control window past 2^31-1",
            Self::Glitches => "too many frames or streams that did no work",
            Self::MemoryBudget => "holding too much of the gateway's buffer budget",
            Self::Cancels => "too many streams cancelled before their answer",
        }
    }
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Reading or writing failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol; GOAWAY was sent with this code.
    #[error("protocol: {0} ({1})")]
    Protocol(Reason, &'static str),
    /// The peer sent GOAWAY with an error code.
    #[error("peer sent GOAWAY {0}")]
    PeerGoAway(Reason),
    /// A keepalive PING went unanswered.
    #[error("keepalive timed out")]
    KeepaliveTimeout,
    /// The client did not start with the HTTP/2 preface (e.g. HTTP/1.1).
    #[error("not HTTP/2: bad connection preface")]
    Preface,
    /// The client's preface and SETTINGS did not arrive in time.
    #[error("no HTTP/2 preface within {0:?}")]
    PrefaceTimeout(Duration),
    /// The peer went past a limit; GOAWAY was sent with its code.
    #[error("{} ({})", .0.reason(), .0.as_str())]
    Offence(Offence),
}

/// An HTTP/2 connection being driven.
pub struct Conn<IO, R> {
    io: IO,
    link: Arc<Link>,
    role: R,
    local: Local,
    /// The start of a frame that has not fully arrived (reads go to the
    /// thread's scratch buffer).
    rbuf: BytesMut,
    /// What is being written.
    wbuf: BytesMut,
    /// Server side: bytes of the client preface still to check.
    preface_left: usize,
    decoder: Decoder,
    /// A header block awaiting its CONTINUATION frames.
    partial: Option<(u32, BytesMut, bool)>,
    streams: super::StreamMap<InStream>,
    /// Server side: the highest stream id the peer opened.
    last_peer_id: u32,
    /// What the peer may still send on the connection.
    recv_window: i64,
    /// Received and not yet granted again (connection level).
    conn_unreleased: u32,
    /// Bytes of this connection's received data held at other sides.
    held: usize,
    /// Whether the peer's first SETTINGS arrived.
    settings_seen: bool,
    /// Server side: when the preface and SETTINGS must have arrived by.
    preface_deadline: Option<Instant>,
    /// The PING awaiting its answer and when it went out.
    ping_sent: Option<Instant>,
    next_ping: Instant,
    last_frame: Instant,
    timer: Pin<Box<Sleep>>,
    /// GOAWAY sent: new streams are refused.
    goaway_sent: bool,
    /// The peer's GOAWAY: no new streams above this id.
    goaway_received: Option<u32>,
    /// Set when the connection must end after writing what is pending.
    closing: Option<Result<(), ConnError>>,
    scratch_credits: Vec<(u32, usize)>,
    scratch_ended: Vec<Ended>,
    scratch_opened: Vec<(u32, Route)>,
    /// Data bytes forwarded (for the bytes metric; taken by the owner).
    forwarded: u64,
    /// [`Conn::shut`] ran.
    shut_done: bool,
}

impl<IO, R> Conn<IO, R>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    R: Role,
{
    /// A connection over `io` whose sending side is `link` (created with
    /// [`Local::preamble`] for this side).
    pub fn new(io: IO, link: Arc<Link>, role: R, local: Local) -> Self {
        let now = Instant::now();
        Self {
            io,
            link,
            role,
            local,
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
            preface_left: if R::SIDE == Side::Server {
                frame::PREFACE.len()
            } else {
                0
            },
            decoder: Decoder::new(local.header_table_size as usize)
                .with_max_header_list_size(local.max_header_list_size as usize),
            partial: None,
            streams: super::StreamMap::default(),
            last_peer_id: 0,
            recv_window: i64::from(local.conn_window.max(frame::DEFAULT_WINDOW)),
            conn_unreleased: 0,
            held: 0,
            settings_seen: false,
            preface_deadline: local.preface_timeout.map(|t| now + t),
            ping_sent: None,
            next_ping: now + local.keepalive,
            last_frame: now,
            timer: Box::pin(tokio::time::sleep_until(
                now + HOUSEKEEPING.min(local.keepalive),
            )),
            goaway_sent: false,
            goaway_received: None,
            closing: None,
            scratch_credits: Vec::new(),
            scratch_ended: Vec::new(),
            scratch_opened: Vec::new(),
            forwarded: 0,
            shut_done: false,
        }
    }

    /// Whether the connection is ending (writing its last frames).
    pub fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// Data bytes forwarded since the last call.
    pub fn take_forwarded(&mut self) -> u64 {
        std::mem::take(&mut self.forwarded)
    }

    fn error(&mut self, reason: Reason, why: &'static str) {
        if self.closing.is_none() {
            frame::write_goaway(
                self.link.lock().buf_mut(),
                self.last_peer_id,
                reason,
                why.as_bytes(),
            );
            self.closing = Some(Err(ConnError::Protocol(reason, why)));
        }
    }

    /// Charges the peer for `glitch`; ends the connection when its budget
    /// is spent.
    fn glitch(&mut self, glitch: Glitch) {
        if !self.role.glitch(glitch) {
            self.offence(Offence::Glitches);
        }
    }

    /// Ends the connection for `offence`: GOAWAY with its code.
    fn offence(&mut self, offence: Offence) {
        if self.closing.is_none() {
            frame::write_goaway(
                self.link.lock().buf_mut(),
                self.last_peer_id,
                offence.reason(),
                offence.as_str().as_bytes(),
            );
            self.closing = Some(Err(ConnError::Offence(offence)));
        }
    }

    /// Takes what other tasks left: credits, ended streams, new routes.
    fn take_shared(&mut self) {
        let fail_all = {
            let mut out = self.link.lock();
            out.begin_poll();
            out.take_credits(&mut self.scratch_credits);
            out.take_ended(&mut self.scratch_ended);
            out.take_opened(&mut self.scratch_opened);
            out.take_fail_all()
        };
        for (id, route) in std::mem::take(&mut self.scratch_opened) {
            self.streams.insert(
                id,
                InStream::new(Target::Route(route), self.local.stream_window),
            );
        }
        let mut credits = std::mem::take(&mut self.scratch_credits);
        for (id, n) in credits.drain(..) {
            if let Some(s) = self.streams.get_mut(&id) {
                let n = n.min(s.held);
                s.held -= n;
                self.held -= n;
                s.unreleased = s.unreleased.saturating_add(n as u32);
            }
        }
        self.scratch_credits = credits;
        let mut ended = std::mem::take(&mut self.scratch_ended);
        for e in ended.drain(..) {
            self.sending_ended(e);
        }
        self.scratch_ended = ended;
        if let Some(message) = fail_all {
            let ids: Vec<u32> = self.streams.keys().copied().collect();
            for id in ids {
                self.send_reset(id, Reason::CANCEL);
                self.remove(id, Some(Failure::Unavailable(message.into())));
            }
        }
        self.release_windows();
    }

    /// Stream `e.id`'s sending half closed.
    fn sending_ended(&mut self, e: Ended) {
        let Some(s) = self.streams.get(&e.id) else {
            return;
        };
        if e.reset {
            // We reset it: the peer's half is dead too. On the client side
            // the other half (the agent's stream) ended it, which says
            // nothing about the sidecar's health: not an upstream failure,
            // or an agent resetting its own streams would get the sidecar
            // ejected for every tenant.
            self.remove_as(e.id, Some(Failure::Cancel), false);
        } else if s.recv_closed {
            self.remove(e.id, None);
        } else if R::SIDE == Side::Server {
            // The answer is complete while the request still streams: ask
            // the agent to stop sending (RFC 9113 §8.1) and let the sidecar's
            // half go.
            frame::write_reset(self.link.lock().buf_mut(), e.id, Reason::NO_ERROR);
            self.remove(e.id, Some(Failure::Cancel));
        }
        // Client side: the request is sent; the response goes on.
    }

    /// Removes stream `id`, telling its target `failure` if any.
    fn remove(&mut self, id: u32, failure: Option<Failure>) {
        self.remove_as(id, failure, true);
    }

    /// [`Conn::remove`]; `peer_fault`: on the client side, a stream that
    /// ends before its response head counts against the peer's health.
    fn remove_as(&mut self, id: u32, failure: Option<Failure>, peer_fault: bool) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        self.held -= s.held;
        if let (Some(f), Target::Route(route)) = (failure, &s.target) {
            route.sink.fail(route.id, f);
        }
        if R::SIDE == Side::Client && !s.head_seen && peer_fault {
            self.role.answered(false);
        }
    }

    /// Grants windows back where enough was consumed.
    fn release_windows(&mut self) {
        let stream_threshold = (self.local.stream_window / 4).max(1);
        let mut out = None;
        for (&id, s) in &mut self.streams {
            if s.unreleased >= stream_threshold && !s.recv_closed {
                let out = out.get_or_insert_with(|| self.link.lock());
                frame::write_window_update(out.buf_mut(), id, s.unreleased);
                s.window += i64::from(s.unreleased);
                s.unreleased = 0;
            }
        }
        let conn_threshold = (self.local.conn_window / 4).max(1);
        if self.conn_unreleased >= conn_threshold && self.held <= MAX_HELD {
            let out = out.get_or_insert_with(|| self.link.lock());
            frame::write_window_update(out.buf_mut(), 0, self.conn_unreleased);
            self.recv_window += i64::from(self.conn_unreleased);
            self.conn_unreleased = 0;
        }
    }

    /// Parses and handles the complete frames in `rbuf`, leaving a partial
    /// one in it.
    fn handle_frames(&mut self, rbuf: &mut BytesMut) {
        let mut at = 0;
        if self.preface_left > 0 {
            let checked = frame::PREFACE.len() - self.preface_left;
            let n = self.preface_left.min(rbuf.len());
            if rbuf[..n] != frame::PREFACE[checked..checked + n] {
                self.closing = Some(Err(ConnError::Preface));
                rbuf.clear();
                return;
            }
            self.preface_left -= n;
            at = n;
        }
        if self.preface_left == 0 {
            self.last_frame = Instant::now();
        }
        while self.closing.is_none() && self.preface_left == 0 {
            let Some(head) = Head::parse(&rbuf[at..]) else {
                break;
            };
            if head.len > frame::DEFAULT_MAX_FRAME_SIZE as usize {
                self.error(
                    Reason::FRAME_SIZE_ERROR,
                    "frame larger than SETTINGS_MAX_FRAME_SIZE",
                );
                break;
            }
            if rbuf.len() - at < HEAD_LEN + head.len {
                break;
            }
            let start = at + HEAD_LEN;
            at = start + head.len;
            // The first frame from the peer must be SETTINGS (§3.4).
            if !self.settings_seen && head.kind != frame::kind::SETTINGS {
                self.error(Reason::PROTOCOL_ERROR, "first frame not SETTINGS");
                break;
            }
            self.handle_frame(head, &rbuf[start..at]);
        }
        rbuf.advance(at);
    }

    fn handle_frame(&mut self, head: Head, payload: &[u8]) {
        if let Some((id, _, _)) = &self.partial
            && (head.kind != frame::kind::CONTINUATION || head.stream != *id)
        {
            return self.error(Reason::PROTOCOL_ERROR, "header block interrupted");
        }
        let frame = match Frame::parse(head, payload) {
            Ok(f) => f,
            Err(FrameError::Connection(reason, why)) => return self.error(reason, why),
            Err(FrameError::Stream(id, reason, _)) => return self.stream_error(id, reason),
        };
        match frame {
            Frame::Data {
                stream,
                end_stream,
                data,
                flow_len,
            } => self.on_data(stream, data, flow_len, end_stream),
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                block,
            } => {
                if end_headers {
                    self.on_header_block(stream, block, end_stream);
                } else {
                    let mut b = BytesMut::with_capacity(block.len() * 2);
                    b.extend_from_slice(block);
                    self.partial = Some((stream, b, end_stream));
                }
            }
            Frame::Continuation {
                end_headers, block, ..
            } => {
                let Some((id, mut b, end_stream)) = self.partial.take() else {
                    return self.error(Reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS");
                };
                if b.len() + block.len() > MAX_HEADER_BLOCK {
                    return self.error(Reason::ENHANCE_YOUR_CALM, "header block too large");
                }
                b.extend_from_slice(block);
                if end_headers {
                    self.on_header_block(id, &b, end_stream);
                } else {
                    self.partial = Some((id, b, end_stream));
                }
            }
            Frame::Priority => self.glitch(Glitch::Priority),
            Frame::Unknown => self.glitch(Glitch::UnknownFrame),
            Frame::Reset { stream, .. } => self.on_reset(stream),
            Frame::Settings(s) => {
                if self.settings_seen {
                    // The first is the preface's; an honest peer rarely
                    // sends another.
                    self.glitch(Glitch::Settings);
                }
                self.settings_seen = true;
                self.preface_deadline = None;
                let mut deliver = Deliver::default();
                let applied = {
                    let mut out = self.link.lock();
                    let applied = out.apply_settings(&s, &mut deliver);
                    if applied.is_ok() {
                        frame::write_settings_ack(out.buf_mut());
                    }
                    applied
                };
                deliver.run();
                if applied.is_err() {
                    self.offence(Offence::WindowOverflow);
                }
            }
            Frame::SettingsAck => {}
            Frame::Ping { ack: false, data } => {
                self.glitch(Glitch::Ping);
                frame::write_ping(self.link.lock().buf_mut(), true, data);
            }
            Frame::Ping { ack: true, .. } => self.ping_sent = None,
            Frame::GoAway {
                last_stream,
                reason,
                ..
            } => self.on_goaway(last_stream, reason),
            Frame::WindowUpdate { stream, increment } => {
                if stream != 0 && self.is_idle(stream) {
                    return self.error(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream");
                }
                if increment < TINY_WINDOW_UPDATE {
                    self.glitch(Glitch::TinyWindowUpdate);
                }
                let mut deliver = Deliver::default();
                let r = self
                    .link
                    .lock()
                    .window_update(stream, increment, &mut deliver);
                deliver.run();
                if r.is_err() {
                    if stream == 0 {
                        self.offence(Offence::WindowOverflow);
                    } else {
                        self.stream_error(stream, Reason::FLOW_CONTROL_ERROR);
                    }
                }
            }
        }
    }

    /// Whether `id` names a stream that was never opened.
    fn is_idle(&self, id: u32) -> bool {
        match R::SIDE {
            Side::Server => id > self.last_peer_id,
            // Client: odd ids are ours; the link knows the next one.
            Side::Client => {
                id.is_multiple_of(2) || !self.streams.contains_key(&id) && id >= self.link_next_id()
            }
        }
    }

    fn link_next_id(&self) -> u32 {
        self.link.lock().next_client_id()
    }

    /// Writes RST_STREAM for `id` (dropping what its sending half queued).
    fn send_reset(&self, id: u32, reason: Reason) {
        let mut out = self.link.lock();
        if out.is_open(id) {
            out.reset(id, reason);
        } else {
            frame::write_reset(out.buf_mut(), id, reason);
        }
    }

    /// Resets stream `id` with `reason` and tells its other half.
    fn stream_error(&mut self, id: u32, reason: Reason) {
        self.glitch(Glitch::StreamError);
        self.charge_cancel(id);
        self.send_reset(id, reason);
        if self.streams.contains_key(&id) {
            let failure = self.role.failure();
            self.remove(id, Some(failure));
        }
    }

    fn on_data(&mut self, id: u32, data: &[u8], flow_len: u32, end: bool) {
        if data.is_empty() && !end {
            self.glitch(Glitch::EmptyData);
        }
        if i64::from(flow_len) > self.recv_window {
            return self.error(Reason::FLOW_CONTROL_ERROR, "connection window exceeded");
        }
        self.recv_window -= i64::from(flow_len);
        self.conn_unreleased += flow_len;
        let Some(s) = self.streams.get_mut(&id) else {
            if self.is_idle(id) {
                return self.error(Reason::PROTOCOL_ERROR, "DATA on an idle stream");
            }
            // A stream already closed here: frames in flight are dropped.
            return;
        };
        if s.recv_closed {
            return self.stream_error(id, Reason::STREAM_CLOSED);
        }
        if !s.head_seen {
            // DATA before the response head (a request's head always came
            // first: it opened the stream).
            return self.stream_error(id, Reason::PROTOCOL_ERROR);
        }
        if i64::from(flow_len) > s.window {
            return self.stream_error(id, Reason::FLOW_CONTROL_ERROR);
        }
        s.window -= i64::from(flow_len);
        if let Some(Err(too_large)) = s.messages.as_mut().map(|m| m.read(data)) {
            tracing::warn!(
                link = %self.link.name(),
                stream = id,
                declared = too_large.declared,
                limit = too_large.limit,
                "message over listener.maxMessageBytes, stream reset"
            );
            return self.stream_error(id, Reason::ENHANCE_YOUR_CALM);
        }
        let mut release = flow_len - data.len() as u32;
        match &s.target {
            Target::Route(route) => {
                let sent = route.sink.data(route.id, data, end);
                release += sent as u32;
                let held = data.len() - sent;
                s.held += held;
                self.held += held;
                self.forwarded += data.len() as u64;
            }
            Target::Discard => release += data.len() as u32,
        }
        s.unreleased = s.unreleased.saturating_add(release);
        if end {
            s.recv_closed = true;
            if !self.link.lock().is_open(id) {
                self.remove(id, None);
            }
        }
    }

    fn on_header_block(&mut self, id: u32, block: &[u8], end_stream: bool) {
        // Every name and value in one buffer, the fields slices of it: one
        // allocation per block, and forwarding them copies nothing. Indexed
        // fields decode to far more than they take in the block, but the
        // decoder stops before the names and values pass the header list
        // limit, so this buffer's capacity stays under twice it.
        let limit = self.decoder.max_header_list_size();
        let mut all = BytesMut::with_capacity((block.len() * 4).max(512).min(limit));
        let mut spans = Spans::default();
        let decoded = self.decoder.decode(block, |n, v, _| {
            let start = all.len();
            all.extend_from_slice(n);
            all.extend_from_slice(v);
            spans.push((start, start + n.len(), all.len()));
        });
        match decoded {
            Ok(()) => {}
            Err(DecodeError::HeaderListTooLarge(_)) => {
                tracing::debug!(link = %self.link.name(), limit, "header list too large");
                return self.offence(Offence::HeaderListTooLarge);
            }
            Err(e) => {
                tracing::debug!(link = %self.link.name(), error = %e, "HPACK decoding failed");
                return self.error(Reason::COMPRESSION_ERROR, "header block does not decode");
            }
        }
        let all = all.freeze();
        let fields: Fields = spans
            .iter()
            .map(|&(a, b, c)| (all.slice(a..b), all.slice(b..c)))
            .collect();
        if let Some(s) = self.streams.get_mut(&id) {
            if s.recv_closed {
                return self.stream_error(id, Reason::STREAM_CLOSED);
            }
            let informational = R::SIDE == Side::Client && is_informational(&fields);
            if informational {
                return;
            }
            // A second block is trailers and must end the stream.
            if s.head_seen && !end_stream {
                return self.stream_error(id, Reason::PROTOCOL_ERROR);
            }
            if !valid_fields(&fields, R::SIDE, !s.head_seen) {
                return self.stream_error(id, Reason::PROTOCOL_ERROR);
            }
            let first = !s.head_seen;
            s.head_seen = true;
            if end_stream {
                s.recv_closed = true;
            }
            if let Target::Route(route) = &s.target {
                route.sink.headers(route.id, fields, end_stream);
            }
            if first && R::SIDE == Side::Client {
                self.role.answered(true);
            }
            if end_stream && !self.link.lock().is_open(id) {
                self.remove(id, None);
            }
            return;
        }
        match R::SIDE {
            Side::Client => {
                // An answer on a stream reset here: dropped (its block was
                // decoded above, which keeps HPACK in step).
                if self.is_idle(id) {
                    self.error(Reason::PROTOCOL_ERROR, "HEADERS on a stream never opened");
                }
            }
            Side::Server => {
                if id.is_multiple_of(2) || id <= self.last_peer_id {
                    return self.error(Reason::PROTOCOL_ERROR, "stream id not new or not odd");
                }
                self.last_peer_id = id;
                let refused = if self.goaway_sent {
                    // After GOAWAY, new streams are not processed (§6.8).
                    Some(StreamRefused::GoingAway)
                } else if self.streams.len() >= self.local.max_concurrent_streams as usize {
                    Some(StreamRefused::Limit)
                } else {
                    None
                };
                if let Some(why) = refused {
                    frame::write_reset(self.link.lock().buf_mut(), id, Reason::REFUSED_STREAM);
                    self.role.refused(why);
                    return;
                }
                if !valid_fields(&fields, Side::Server, true) {
                    frame::write_reset(self.link.lock().buf_mut(), id, Reason::PROTOCOL_ERROR);
                    return;
                }
                let stream = self.role.open(&self.link, id, fields, end_stream);
                let gone = stream.recv_closed && !self.link.lock().is_open(id);
                self.streams.insert(id, stream);
                if gone {
                    self.remove(id, None);
                }
            }
        }
    }

    fn on_reset(&mut self, id: u32) {
        if self.is_idle(id) {
            return self.error(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream");
        }
        self.charge_cancel(id);
        self.link.lock().forget(id);
        if self.streams.contains_key(&id) {
            let failure = self.role.failure();
            self.remove(id, Some(failure));
            self.glitch(Glitch::PeerReset);
        }
    }

    /// Server side: charges the role for carried stream `id` ending by the
    /// peer's doing before its answer ([`Role::cancelled_unanswered`]).
    fn charge_cancel(&mut self, id: u32) {
        if R::SIDE != Side::Server {
            return;
        }
        let carried = self
            .streams
            .get(&id)
            .is_some_and(|s| matches!(&s.target, Target::Route(r) if r.sink.is_connection()));
        if carried && !self.link.lock().answered(id) && !self.role.cancelled_unanswered() {
            self.offence(Offence::Cancels);
        }
    }

    fn on_goaway(&mut self, last: u32, reason: Reason) {
        self.goaway_received = Some(last);
        self.link.refuse_new();
        if R::SIDE == Side::Client {
            // Streams above `last` were never processed: safe to reopen.
            let unprocessed: Vec<u32> = self
                .streams
                .keys()
                .copied()
                .filter(|&id| id > last)
                .collect();
            for id in unprocessed {
                self.link.lock().forget(id);
                self.remove(
                    id,
                    Some(Failure::Unavailable(
                        "upstream closing; reopen the stream".into(),
                    )),
                );
            }
        }
        if reason != Reason::NO_ERROR {
            self.closing = Some(Err(ConnError::PeerGoAway(reason)));
        }
    }

    /// Reads into the thread's scratch buffer after what is left of a
    /// partial frame, handles the complete frames, and keeps the rest.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let mut buf = SCRATCH.take();
        buf.clear();
        // Frames handed on keep their part of the buffer; reads go on in
        // the rest until it runs short. Renewing it takes the allocation
        // back when everything handed on has been dropped, and allocates
        // only when some of it is still held.
        if buf.capacity() < READ_MIN {
            buf.reserve(READ_SCRATCH);
        }
        buf.extend_from_slice(&self.rbuf);
        self.rbuf.clear();
        let polled = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut buf);
        if let Poll::Ready(Ok(n)) = polled
            && n > 0
        {
            self.handle_frames(&mut buf);
        }
        // The start of a frame still arriving; a buffer of its own only then.
        if buf.is_empty() {
            if self.rbuf.capacity() > 0 {
                self.rbuf = BytesMut::new();
            }
        } else {
            self.rbuf.extend_from_slice(&buf);
        }
        buf.clear();
        SCRATCH.set(buf);
        polled
    }

    /// Writes what is pending; `Ready` once everything was written.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            if self.wbuf.is_empty() {
                // The link starts a new buffer; this one is freed once
                // written, so a quiet connection holds neither.
                self.wbuf = self.link.lock().take_buf(BytesMut::new());
                if self.wbuf.is_empty() {
                    return Pin::new(&mut self.io).poll_flush(cx);
                }
            }
            while !self.wbuf.is_empty() {
                let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf))?;
                if n == 0 {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                self.wbuf.advance(n);
            }
            super::link::recycle(std::mem::take(&mut self.wbuf));
        }
    }

    /// Timers: the preface deadline, keepalive PINGs, their timeout,
    /// housekeeping.
    fn poll_timers(&mut self, cx: &mut Context<'_>) -> Result<(), ConnError> {
        loop {
            let now = Instant::now();
            if let Some(deadline) = self.preface_deadline
                && now >= deadline
            {
                let waited = self.local.preface_timeout.unwrap_or_default();
                return Err(ConnError::PrefaceTimeout(waited));
            }
            let mut next = match self.ping_sent {
                Some(sent) if now >= sent + self.local.keepalive_timeout => {
                    return Err(ConnError::KeepaliveTimeout);
                }
                Some(sent) => sent + self.local.keepalive_timeout,
                None if now >= self.next_ping => {
                    frame::write_ping(self.link.lock().buf_mut(), false, *b"spinlink");
                    self.ping_sent = Some(now);
                    self.next_ping = now + self.local.keepalive;
                    now + self.local.keepalive_timeout
                }
                None => self.next_ping,
            };
            let quiet_at = self.last_frame + HOUSEKEEPING;
            if now >= quiet_at {
                self.housekeeping();
            } else {
                next = next.min(quiet_at);
            }
            if let Some(deadline) = self.preface_deadline {
                next = next.min(deadline);
            }
            // Re-armed only to fire earlier (or once fired): a deadline that
            // moved later just wakes the task early, to look again.
            if next < self.timer.deadline() || self.timer.is_elapsed() {
                self.timer.as_mut().reset(next);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
        }
    }

    /// Gives memory back on a quiet connection.
    fn housekeeping(&mut self) {
        if self.rbuf.is_empty() && self.rbuf.capacity() > 0 {
            self.rbuf = BytesMut::new();
        }
        if self.wbuf.is_empty() && self.wbuf.capacity() > 0 {
            self.wbuf = BytesMut::new();
        }
        if self.streams.capacity() > 16 && self.streams.len() < self.streams.capacity() / 4 {
            self.streams.shrink_to_fit();
        }
    }

    /// Drives the connection until it ends.
    pub fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        self.link.register(cx.waker());
        self.take_shared();
        let holding = self.wbuf.len() + self.held + self.link.lock().held();
        if self.closing.is_none() && !self.role.within_budget(cx, holding) {
            tracing::warn!(link = %self.link.name(), holding, "over the gateway's buffer budget, connection ended");
            self.offence(Offence::MemoryBudget);
        }
        if self.closing.is_none() {
            match self.role.poll_signal(cx, self.streams.len(), &self.link) {
                Signal::None => {}
                Signal::GoAway => self.go_away(),
                Signal::Close => self.closing = Some(Ok(())),
            }
        }
        if self.closing.is_none()
            && let Err(e) = self.poll_timers(cx)
        {
            self.closing = Some(Err(e));
        }
        let mut budget = READ_BUDGET;
        while self.closing.is_none() {
            let backlog = self.wbuf.len() + self.link.lock().buffered();
            if backlog > MAX_WRITE_BACKLOG {
                break;
            }
            match self.poll_read(cx) {
                Poll::Pending => break,
                Poll::Ready(Ok(0)) => {
                    // The peer closed its side.
                    self.closing = Some(Ok(()));
                }
                Poll::Ready(Ok(n)) => {
                    // Handling frames can free windows and end streams.
                    self.take_shared();
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        cx.waker().wake_by_ref();
                        break;
                    }
                }
                Poll::Ready(Err(e)) => self.closing = Some(Err(e.into())),
            }
        }
        if self.closing.is_none() && self.goaway_sent && self.streams.is_empty() {
            self.closing = Some(Ok(()));
        }
        if self.closing.is_some() && !self.shut_done {
            // Nothing more is relayed; what is pending (a GOAWAY) still goes out.
            self.shut();
        }
        match self.poll_write(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Pending => {}
            Poll::Ready(Err(e)) => {
                if self.closing.is_none() {
                    self.closing = Some(Err(e.into()));
                }
                return Poll::Ready(self.closing.take().unwrap_or(Ok(())));
            }
        }
        match &self.closing {
            None => Poll::Pending,
            Some(_) => {
                // Write what is pending (a GOAWAY) before going; the owner
                // bounds how long that may take.
                if self.wbuf.is_empty() && self.link.lock().buffered() == 0 {
                    let _ = Pin::new(&mut self.io).poll_shutdown(cx);
                    Poll::Ready(self.closing.take().unwrap_or(Ok(())))
                } else {
                    Poll::Pending
                }
            }
        }
    }

    /// Sends GOAWAY: streams up to the last one opened go on, none after.
    pub fn go_away(&mut self) {
        if !self.goaway_sent {
            self.goaway_sent = true;
            frame::write_goaway(
                self.link.lock().buf_mut(),
                self.last_peer_id,
                Reason::NO_ERROR,
                b"",
            );
            self.link.refuse_new();
        }
    }

    /// Ends the connection's streams: the other halves are told the
    /// role's failure; the link takes nothing more.
    pub fn shut(&mut self) {
        if self.shut_done {
            return;
        }
        self.shut_done = true;
        let failure = self.role.failure();
        let mut told: Vec<Route> = Vec::new();
        for (_, s) in self.streams.drain() {
            if let Target::Route(route) = &s.target {
                route.sink.fail(route.id, failure.clone());
                told.push(route.clone());
            }
            if R::SIDE == Side::Client && !s.head_seen {
                self.role.answered(false);
            }
        }
        self.held = 0;
        for route in self.link.close() {
            if !told
                .iter()
                .any(|t| t.id == route.id && Arc::ptr_eq(&t.sink, &route.sink))
            {
                route.sink.fail(route.id, failure.clone());
                if R::SIDE == Side::Client {
                    self.role.answered(false);
                }
            }
        }
    }
}

/// Whether a response head is informational (1xx), which a client skips.
fn is_informational(fields: &Fields) -> bool {
    fields
        .iter()
        .find(|(n, _)| &n[..] == b":status")
        .is_some_and(|(_, v)| v.first() == Some(&b'1'))
}

/// Where each field of a block being decoded lies in its buffer (name
/// start, value start, end): on the stack for the usual dozen or so, so
/// decoding a block allocates only its buffer and its field list.
#[derive(Default)]
struct Spans {
    inline: [(usize, usize, usize); Spans::INLINE],
    len: usize,
    more: Vec<(usize, usize, usize)>,
}

impl Spans {
    const INLINE: usize = 16;

    fn push(&mut self, span: (usize, usize, usize)) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = span;
                self.len += 1;
            }
            None => self.more.push(span),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(usize, usize, usize)> {
        self.inline[..self.len].iter().chain(&self.more)
    }
}

/// Checks a header block as RFC 9113 §8.2 and §8.3 require: lowercase
/// names, pseudo fields first and only the ones the side may receive, no
/// connection-specific fields, `te` only as `trailers`; a request head has
/// `:method`, `:scheme` and `:path`, a response head `:status`; trailers
/// carry no pseudo fields.
pub fn valid_fields(fields: &Fields, side: Side, head: bool) -> bool {
    let mut regular = false;
    let (mut method, mut scheme, mut path, mut status) = (0, 0, 0, 0);
    for (name, value) in fields {
        if name.is_empty() {
            return false;
        }
        if name[0] == b':' {
            if regular || !head {
                return false;
            }
            match (&name[..], side) {
                (b":method", Side::Server) => method += 1,
                (b":scheme", Side::Server) => scheme += 1,
                (b":path", Side::Server) => {
                    if value.is_empty() {
                        return false;
                    }
                    path += 1;
                }
                (b":authority", Side::Server) => {}
                (b":status", Side::Client) => status += 1,
                _ => return false,
            }
            continue;
        }
        regular = true;
        if !name.iter().all(|&b| NAME_BYTE[usize::from(b)]) {
            return false;
        }
        if matches!(
            &name[..],
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade"
        ) {
            return false;
        }
        if &name[..] == b"te" && &value[..] != b"trailers" {
            return false;
        }
        if breaks_a_line(value) {
            return false;
        }
    }
    if !head {
        return true;
    }
    match side {
        Side::Server => method == 1 && scheme == 1 && path == 1,
        Side::Client => status == 1,
    }
}

/// Whether `value` holds NUL, CR or LF (RFC 9113 §8.2.1). Values are the
/// long part of a block (tokens, paths): eight bytes are checked at a time.
fn breaks_a_line(value: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Whether any byte of `word` is `b`: a byte of `word ^ b·ONES` is zero
    // exactly where, and subtracting one there borrows into its top bit.
    let has = |word: u64, b: u8| {
        let x = word ^ (u64::from(b) * ONES);
        x.wrapping_sub(ONES) & !x & (ONES << 7) != 0
    };
    let (words, rest) = value.as_chunks::<8>();
    words.iter().any(|w| {
        let w = u64::from_le_bytes(*w);
        has(w, 0) | has(w, b'\r') | has(w, b'\n')
    }) || rest.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n')
}

/// The bytes an HTTP/2 field name may hold: RFC 9110's `tchar` without
/// uppercase letters (RFC 9113 §8.2.1), as a table.
const NAME_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_lowercase()
            || c.is_ascii_digit()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests;
