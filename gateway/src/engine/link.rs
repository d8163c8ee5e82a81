//! A [`Link`]: the sending side of one HTTP/2 connection, shared by its own
//! connection task (which writes it to the socket) and by the tasks of other
//! connections, which forward their streams' frames into it.
//!
//! Everything a connection sends is encoded here, under one lock, in the
//! order it will reach the wire — which HPACK requires. Flow control is
//! applied here too: DATA goes out only within the windows the peer granted;
//! what does not fit waits in its stream's queue (bounded by the window the
//! *sending* side granted its own peer, so a stalled stream holds at most one
//! window) and is credited back to its source when it leaves
//! ([`Sink::credit`]). A stream's trailers or end wait behind its queued
//! data; a reset drops it.
//!
//! Lock order: a task never holds its own link's lock while taking another's;
//! credits and failures for other links are collected under the lock and
//! delivered after it is released ([`Deliver`]).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use futures::task::AtomicWaker;
use spinlink_http2::frame::{self, Reason};
use spinlink_http2::hpack::{Encoder, Indexing};

/// Header fields as they cross between connections: lowercase names, pseudo
/// fields first, in order.
pub type Fields = Vec<(Bytes, Bytes)>;

/// How one side tells the other that its half of a relayed stream failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The agent (or a local consumer) gave up: reset the stream.
    Cancel,
    /// The sidecar side broke: the agent gets `Unavailable` with this message
    /// (retryable: reopen the stream).
    Unavailable(Cow<'static, str>),
}

/// What the other half of a relayed stream is written into. Implemented by
/// [`Link`] and by the bridges to in-process HTTP bodies.
pub trait Sink: Send + Sync + 'static {
    /// A header block for stream `id`: a request or response head, or
    /// trailers; `end` closes the stream's sending side.
    fn headers(&self, id: u32, fields: Fields, end: bool);
    /// Data for stream `id`. Returns how many of the bytes no longer hold a
    /// window on the source's side: sent at once, or dropped because the
    /// stream is gone. The rest is queued and credited later.
    fn data(&self, id: u32, data: &[u8], end: bool) -> usize;
    /// The source's half failed.
    fn fail(&self, id: u32, failure: Failure);
    /// `n` bytes this side forwarded from stream `id` have left the other
    /// side: the window they held may be granted again.
    fn credit(&self, id: u32, n: usize);
    /// Whether the other side is another connection (a sidecar's, for an
    /// agent's stream), not a bridge into this process.
    fn is_connection(&self) -> bool {
        false
    }
}

/// Where a stream's frames go, on another connection (or a bridge).
#[derive(Clone)]
pub struct Route {
    /// The other side.
    pub sink: Arc<dyn Sink>,
    /// Its stream id there.
    pub id: u32,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Route({})", self.id)
    }
}

/// Credits and failures owed to other links, delivered once the lock that
/// produced them is released.
#[derive(Default)]
pub struct Deliver {
    credits: Vec<(Route, usize)>,
}

impl Deliver {
    /// Delivers everything collected.
    pub fn run(self) {
        for (route, n) in self.credits {
            route.sink.credit(route.id, n);
        }
    }

    fn credit(&mut self, route: &Route, n: usize) {
        if n > 0 {
            match self.credits.last_mut() {
                Some((r, m)) if r.id == route.id && Arc::ptr_eq(&r.sink, &route.sink) => *m += n,
                _ => self.credits.push((route.clone(), n)),
            }
        }
    }
}

/// Which end of the connection this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Accepted from an agent: a failed stream ends with gRPC trailers.
    Server,
    /// Dialled to a sidecar: a failed stream is reset.
    Client,
}

/// Something waiting in a stream's queue.
#[derive(Debug)]
enum Pending {
    Data(Bytes, bool),
    Headers(Fields, bool),
}

/// The sending half of one stream.
#[derive(Debug)]
struct OutStream {
    /// What the peer lets this side send on the stream.
    window: i64,
    queue: VecDeque<Pending>,
    /// Data bytes in `queue`.
    queued: usize,
    /// Whose data this is: credited as queued bytes leave.
    source: Option<Route>,
    /// Whether a header block has gone out (a failure before one is a
    /// trailers-only response).
    headers_sent: bool,
    /// END_STREAM or RST_STREAM is queued: nothing more is accepted.
    closing: bool,
}

impl OutStream {
    fn new(window: i64, source: Option<Route>, headers_sent: bool, closing: bool) -> Self {
        Self {
            window,
            queue: VecDeque::new(),
            queued: 0,
            source,
            headers_sent,
            closing,
        }
    }
}

/// A stream whose sending half just closed, for its connection task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The stream.
    pub id: u32,
    /// Closed by RST_STREAM (the whole stream is gone), not END_STREAM.
    pub reset: bool,
}

/// The shared state behind a [`Link`].
pub struct Out {
    side: Side,
    /// Frames ready for the socket, in order.
    buf: BytesMut,
    /// The connection is gone: everything sent to it is dropped.
    closed: bool,
    /// The connection-level window the peer granted.
    conn_window: i64,
    /// Data bytes in every stream's queue.
    queued: usize,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE.
    initial_window: i64,
    /// The peer's SETTINGS_MAX_FRAME_SIZE.
    max_frame: usize,
    encoder: Encoder,
    streams: super::StreamMap<OutStream>,
    /// Streams with queued frames, in the order they blocked.
    blocked: VecDeque<u32>,
    /// Credits from other links for this connection's received data.
    credits: Vec<(u32, usize)>,
    /// Streams whose sending half closed since the task last looked.
    ended: Vec<Ended>,
    /// Routes for streams other tasks opened here (client side), taken by
    /// this connection's task before it reads their first answer.
    opened: Vec<(u32, Route)>,
    /// Client side: the next stream id.
    next_id: u32,
    /// Client side: the peer's SETTINGS_MAX_CONCURRENT_STREAMS.
    max_streams: u32,
    /// Client side: no new streams (GOAWAY received, ids exhausted, closed).
    refusing: bool,
    /// Every stream must end with `Unavailable` and this message (the
    /// instance left rotation); the task does it.
    fail_all: Option<&'static str>,
    /// The task has been woken and not yet run.
    wake_pending: bool,
}

/// One HTTP/2 connection's sending side and its task's waker.
pub struct Link {
    out: Mutex<Out>,
    waker: AtomicWaker,
    /// For logs and metrics: the peer's address or the upstream URL.
    name: Arc<str>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What a write buffer starts with.
const WRITE_CHUNK: usize = 8 * 1024;
/// Largest written buffer kept for the next one.
const SPARE_MAX: usize = 64 * 1024;
/// Written buffers one thread keeps (a worker writes to its agent
/// connections and to its upstream connections in the same turn).
const SPARES: usize = 8;

thread_local! {
    /// Written-out buffers, emptied, for the next links on this thread that
    /// start one: a connection writing in bursts reuses an allocation
    /// instead of making one per burst, and a quiet connection still holds
    /// none.
    static SPARE: std::cell::RefCell<Vec<BytesMut>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer [`recycle`] kept on this thread, if any.
fn spare() -> Option<BytesMut> {
    SPARE.with_borrow_mut(Vec::pop)
}

/// Keeps `buf`, once written, for the next write buffer started on this
/// thread (when it is not too large and nothing else holds part of it).
pub fn recycle(mut buf: BytesMut) {
    buf.clear();
    if buf.capacity() < WRITE_CHUNK {
        // Written bytes are skipped, not freed: this takes them back (in
        // place when nothing else holds part of the allocation).
        buf.reserve(WRITE_CHUNK);
    }
    if (WRITE_CHUNK..=SPARE_MAX).contains(&buf.capacity()) {
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARES {
                spare.push(buf);
            }
        });
    }
}

/// Largest client stream id before the connection must be replaced.
const LAST_CLIENT_ID: u32 = frame::MAX_WINDOW - 1;

impl Link {
    /// A link for a connection on `side`, named `name` in logs. `preamble`
    /// is what goes out first (the client preface and SETTINGS).
    pub fn new(side: Side, name: Arc<str>, preamble: BytesMut, encoder: Encoder) -> Arc<Self> {
        Arc::new(Self {
            out: Mutex::new(Out {
                side,
                buf: preamble,
                closed: false,
                conn_window: i64::from(frame::DEFAULT_WINDOW),
                queued: 0,
                initial_window: i64::from(frame::DEFAULT_WINDOW),
                max_frame: frame::DEFAULT_MAX_FRAME_SIZE as usize,
                encoder,
                streams: super::StreamMap::default(),
                blocked: VecDeque::new(),
                credits: Vec::new(),
                ended: Vec::new(),
                opened: Vec::new(),
                next_id: 1,
                max_streams: u32::MAX,
                refusing: false,
                fail_all: None,
                wake_pending: false,
            }),
            waker: AtomicWaker::new(),
            name,
        })
    }

    /// The name given at creation.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The shared state, for this connection's own task.
    pub fn lock(&self) -> MutexGuard<'_, Out> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the connection task's waker.
    pub fn register(&self, waker: &std::task::Waker) {
        self.waker.register(waker);
    }

    /// Runs `f` on the shared state and wakes the connection task if it left
    /// something for it.
    fn with<R>(&self, f: impl FnOnce(&mut Out) -> R) -> R {
        let (r, wake) = {
            let mut out = self.lock();
            let r = f(&mut out);
            // One wake per poll of the task: it takes everything at once.
            let wake = !out.wake_pending && out.has_work();
            if wake {
                out.wake_pending = true;
            }
            (r, wake)
        };
        if wake {
            self.waker.wake();
        }
        r
    }

    /// Client side: opens a stream with `fields` (a request head; `end` if
    /// it has no body), answered into `route`. Returns its id, or `None` when
    /// the connection takes no new streams.
    pub fn open(&self, fields: &Fields, end: bool, route: Route) -> Option<u32> {
        self.with(|out| {
            if out.closed || out.refusing || out.streams.len() as u32 >= out.max_streams {
                return None;
            }
            let id = out.next_id;
            if id >= LAST_CLIENT_ID {
                out.refusing = true;
                return None;
            }
            out.next_id += 2;
            let stream = OutStream::new(out.initial_window, Some(route.clone()), true, end);
            out.streams.insert(id, stream);
            out.opened.push((id, route));
            out.encode_headers(id, fields, end);
            if end {
                out.end(id, false);
            }
            Some(id)
        })
    }

    /// Server side: makes stream `id` (opened by the peer) able to send;
    /// `source` is credited as its queued data leaves.
    pub fn accept(&self, id: u32, source: Option<Route>) {
        let mut out = self.lock();
        let stream = OutStream::new(out.initial_window, source, false, false);
        out.streams.insert(id, stream);
    }

    /// Sets whom stream `id`'s queued data is credited to.
    pub fn set_source(&self, id: u32, source: Route) {
        if let Some(s) = self.lock().streams.get_mut(&id) {
            s.source = Some(source);
        }
    }

    /// Whether the connection takes new streams (client side).
    pub fn is_usable(&self) -> bool {
        let out = self.lock();
        !out.closed && !out.refusing && (out.streams.len() as u32) < out.max_streams
    }

    /// Marks the connection closed; returns every stream still open for
    /// sending, and every route not yet taken by the task, with whom to
    /// tell, so the caller can fail them.
    pub fn close(&self) -> Vec<Route> {
        let mut out = self.lock();
        out.closed = true;
        out.refusing = true;
        out.blocked.clear();
        let mut all: Vec<Route> = out.opened.drain(..).map(|(_, route)| route).collect();
        out.queued = 0;
        let sources: Vec<Route> = out.streams.drain().filter_map(|(_, s)| s.source).collect();
        for route in sources {
            if !all
                .iter()
                .any(|r| r.id == route.id && Arc::ptr_eq(&r.sink, &route.sink))
            {
                all.push(route);
            }
        }
        all
    }

    /// Client side: takes no new streams from now on.
    pub fn refuse_new(&self) {
        self.lock().refusing = true;
    }

    /// Ends every stream on the connection: the other halves get
    /// `Unavailable` with `message`, the streams here are reset.
    pub fn fail_all(&self, message: &'static str) {
        self.with(|out| out.fail_all = Some(message));
    }

    /// Wakes the connection task (e.g. to look at a signal).
    pub fn wake(&self) {
        self.waker.wake();
    }
}

impl Sink for Link {
    fn headers(&self, id: u32, fields: Fields, end: bool) {
        self.with(|out| out.send_headers(id, fields, end));
    }

    fn data(&self, id: u32, data: &[u8], end: bool) -> usize {
        self.with(|out| out.send_data(id, data, end))
    }

    fn fail(&self, id: u32, failure: Failure) {
        self.with(|out| out.fail(id, failure));
    }

    fn credit(&self, id: u32, n: usize) {
        self.with(|out| out.credits.push((id, n)));
    }

    fn is_connection(&self) -> bool {
        true
    }
}

impl Out {
    /// Whether the task has anything to do: frames to write, credits or
    /// ended streams to look at.
    fn has_work(&self) -> bool {
        !self.buf.is_empty()
            || !self.credits.is_empty()
            || !self.ended.is_empty()
            || !self.opened.is_empty()
            || self.fail_all.is_some()
    }

    /// Whether the connection takes no new streams (client side).
    pub fn is_refusing(&self) -> bool {
        self.refusing
    }

    /// Called by the connection task as it starts looking at the shared
    /// state: from now on, new work wakes it again.
    pub fn begin_poll(&mut self) {
        self.wake_pending = false;
    }

    /// Takes the frames ready for the socket, leaving `spare` (an empty
    /// buffer whose capacity is reused) in their place.
    pub fn take_buf(&mut self, spare: BytesMut) -> BytesMut {
        std::mem::replace(&mut self.buf, spare)
    }

    /// Whether a header block has gone out on stream `id` (on the server
    /// side: the stream has its answer).
    pub fn answered(&self, id: u32) -> bool {
        self.streams.get(&id).is_some_and(|s| s.headers_sent)
    }

    /// Forgets stream `id`'s sending half without a word to the peer (it
    /// reset the stream).
    pub fn forget(&mut self, id: u32) {
        if let Some(s) = self.streams.remove(&id) {
            self.queued -= s.queued;
            self.blocked.retain(|&b| b != id);
        }
    }

    /// Bytes waiting for the socket.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes held for the peer: waiting for the socket, and queued in
    /// streams behind the windows it has not granted yet.
    pub fn held(&self) -> usize {
        self.buf.len() + self.queued
    }

    /// Appends a frame this connection's own task writes (SETTINGS, PING,
    /// WINDOW_UPDATE, GOAWAY, RST_STREAM).
    pub fn buf_mut(&mut self) -> &mut BytesMut {
        self.room(frame::HEAD_LEN + 8)
    }

    /// The write buffer with room for `n` more bytes. A fresh buffer starts
    /// at [`WRITE_CHUNK`] rather than growing from nothing frame by frame.
    fn room(&mut self, n: usize) -> &mut BytesMut {
        if self.buf.capacity() == 0
            && let Some(spare) = spare()
        {
            self.buf = spare;
        }
        if self.buf.capacity() - self.buf.len() < n {
            self.buf.reserve(n.max(WRITE_CHUNK));
        }
        &mut self.buf
    }

    /// Takes the credits other links left.
    pub fn take_credits(&mut self, into: &mut Vec<(u32, usize)>) {
        into.append(&mut self.credits);
    }

    /// Takes the streams whose sending half closed.
    pub fn take_ended(&mut self, into: &mut Vec<Ended>) {
        into.append(&mut self.ended);
    }

    /// Takes a pending [`Link::fail_all`].
    pub fn take_fail_all(&mut self) -> Option<&'static str> {
        self.fail_all.take()
    }

    /// Takes the routes of streams other tasks opened (client side).
    pub fn take_opened(&mut self, into: &mut Vec<(u32, Route)>) {
        into.append(&mut self.opened);
    }

    /// Client side: the id the next stream will get.
    pub fn next_client_id(&self) -> u32 {
        self.next_id
    }

    /// Whether stream `id` still has its sending half.
    pub fn is_open(&self, id: u32) -> bool {
        self.streams.contains_key(&id)
    }

    /// Applies the peer's SETTINGS, collecting in `deliver` the credits owed
    /// to sources of streams a larger initial window unblocked. `Err` when
    /// the change takes a stream's window past 2^31−1.
    pub fn apply_settings(
        &mut self,
        s: &frame::Settings,
        deliver: &mut Deliver,
    ) -> Result<(), WindowOverflow> {
        if let Some(n) = s.max_frame_size {
            self.max_frame = n as usize;
        }
        if let Some(n) = s.header_table_size {
            self.encoder.set_peer_limit(n);
        }
        if let Some(n) = s.max_concurrent_streams {
            self.max_streams = n;
        }
        if let Some(n) = s.initial_window_size {
            let delta = i64::from(n) - self.initial_window;
            self.initial_window = i64::from(n);
            // Every open stream's window moves by the change (§6.9.2); one
            // pushed past 2^31−1 is a connection error (FLOW_CONTROL_ERROR).
            let max = i64::from(frame::MAX_WINDOW);
            let mut overflow = false;
            for s in self.streams.values_mut() {
                s.window += delta;
                overflow |= s.window > max;
            }
            if overflow {
                return Err(WindowOverflow);
            }
            if delta > 0 {
                self.flush_blocked(deliver);
            }
        }
        Ok(())
    }

    /// Applies a WINDOW_UPDATE from the peer. `Err` when it overflows the
    /// window (a flow-control error: for the connection if `id` is 0).
    pub fn window_update(
        &mut self,
        id: u32,
        inc: u32,
        deliver: &mut Deliver,
    ) -> Result<(), WindowOverflow> {
        let max = i64::from(frame::MAX_WINDOW);
        if id == 0 {
            self.conn_window += i64::from(inc);
            if self.conn_window > max {
                return Err(WindowOverflow);
            }
        } else if let Some(s) = self.streams.get_mut(&id) {
            s.window += i64::from(inc);
            if s.window > max {
                return Err(WindowOverflow);
            }
        } else {
            return Ok(());
        }
        self.flush_blocked(deliver);
        Ok(())
    }

    /// Sends what the windows now allow from blocked streams, oldest first.
    fn flush_blocked(&mut self, deliver: &mut Deliver) {
        let mut rounds = self.blocked.len();
        while rounds > 0 && self.conn_window > 0 {
            rounds -= 1;
            let Some(id) = self.blocked.pop_front() else {
                break;
            };
            let still = self.drain_queue(id, deliver);
            if still {
                self.blocked.push_back(id);
            }
        }
    }

    /// Sends from stream `id`'s queue while the windows allow; returns
    /// whether anything is still queued.
    fn drain_queue(&mut self, id: u32, deliver: &mut Deliver) -> bool {
        loop {
            let Some(s) = self.streams.get_mut(&id) else {
                return false;
            };
            let Some(front) = s.queue.front_mut() else {
                return false;
            };
            match front {
                Pending::Data(bytes, end) => {
                    let end = *end;
                    let allowed = s.window.min(self.conn_window).max(0) as usize;
                    if allowed == 0 && !bytes.is_empty() {
                        return true;
                    }
                    let n = allowed.min(bytes.len());
                    let chunk = bytes.split_to(n);
                    let done = bytes.is_empty();
                    s.window -= n as i64;
                    s.queued -= n;
                    self.queued -= n;
                    self.conn_window -= n as i64;
                    if let Some(source) = &s.source {
                        deliver.credit(source, n);
                    }
                    if done {
                        s.queue.pop_front();
                    }
                    let max_frame = self.max_frame;
                    let buf = self.room(chunk.len() + 2 * frame::HEAD_LEN);
                    write_data_frames(buf, id, &chunk, done && end, max_frame);
                    if done && end {
                        self.end(id, false);
                        return false;
                    }
                    if !done {
                        return true;
                    }
                }
                Pending::Headers(..) => {
                    let Some(Pending::Headers(fields, end)) = s.queue.pop_front() else {
                        unreachable!("front was headers");
                    };
                    s.headers_sent = true;
                    self.encode_headers(id, &fields, end);
                    if end {
                        self.end(id, false);
                        return false;
                    }
                }
            }
        }
    }

    fn encode_headers(&mut self, id: u32, fields: &Fields, end: bool) {
        // Encoded in place after room for the frame header, which is filled
        // in once the block's length is known; a block longer than a frame
        // (rare) is split into CONTINUATIONs.
        let at = self.buf.len();
        self.room(512).extend_from_slice(&[0; frame::HEAD_LEN]);
        self.encoder.encode(
            fields.iter().map(|(n, v)| {
                // Tokens and credentials are never put in a table.
                let indexing = if sensitive(n) {
                    Indexing::Never
                } else {
                    Indexing::Indexed
                };
                (&n[..], &v[..], indexing)
            }),
            &mut self.buf,
        );
        let len = self.buf.len() - at - frame::HEAD_LEN;
        if len <= self.max_frame {
            let mut flags = frame::flag::END_HEADERS;
            if end {
                flags |= frame::flag::END_STREAM;
            }
            let head = frame::Head {
                len,
                kind: frame::kind::HEADERS,
                flags,
                stream: id,
            };
            self.buf[at..at + frame::HEAD_LEN].copy_from_slice(&head.to_bytes());
        } else {
            let block = self.buf.split_off(at + frame::HEAD_LEN);
            self.buf.truncate(at);
            frame::write_headers(&mut self.buf, id, &block, end, self.max_frame);
        }
    }

    /// The stream's sending half is done: forget it and tell the task.
    fn end(&mut self, id: u32, reset: bool) {
        if let Some(s) = self.streams.remove(&id) {
            self.queued -= s.queued;
        }
        self.ended.push(Ended { id, reset });
    }

    fn send_headers(&mut self, id: u32, fields: Fields, end: bool) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.closing {
            return;
        }
        s.closing = end;
        if !s.queue.is_empty() {
            s.queue.push_back(Pending::Headers(fields, end));
            return;
        }
        s.headers_sent = true;
        self.encode_headers(id, &fields, end);
        if end {
            self.end(id, false);
        }
    }

    fn send_data(&mut self, id: u32, data: &[u8], end: bool) -> usize {
        let Some(s) = self.streams.get_mut(&id) else {
            return data.len();
        };
        if s.closing {
            return data.len();
        }
        s.closing = end;
        if !s.queue.is_empty() {
            s.queued += data.len();
            self.queued += data.len();
            s.queue
                .push_back(Pending::Data(Bytes::copy_from_slice(data), end));
            return 0;
        }
        let allowed = s.window.min(self.conn_window).max(0) as usize;
        let n = allowed.min(data.len());
        s.window -= n as i64;
        self.conn_window -= n as i64;
        let all = n == data.len();
        if !all {
            s.queued += data.len() - n;
            self.queued += data.len() - n;
            s.queue
                .push_back(Pending::Data(Bytes::copy_from_slice(&data[n..]), end));
            self.blocked.push_back(id);
        }
        if n > 0 || (all && end) {
            let max_frame = self.max_frame;
            let buf = self.room(n + 2 * frame::HEAD_LEN);
            write_data_frames(buf, id, &data[..n], all && end, max_frame);
        }
        if all && end {
            self.end(id, false);
        }
        n
    }

    /// Resets stream `id` now (queued frames are dropped) with `reason`.
    pub fn reset(&mut self, id: u32, reason: Reason) {
        if self.streams.contains_key(&id) {
            frame::write_reset(self.room(16), id, reason);
            self.end(id, true);
        }
    }

    fn fail(&mut self, id: u32, failure: Failure) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        match (self.side, failure) {
            (Side::Client, _) | (Side::Server, Failure::Cancel) => {
                frame::write_reset(self.room(16), id, Reason::CANCEL);
                self.end(id, true);
            }
            (Side::Server, Failure::Unavailable(message)) => {
                if s.closing {
                    return;
                }
                // What was already relayed still reaches the agent, then the
                // status that tells it to reopen the stream.
                let fields =
                    grpc_status_fields(14, &message, !s.headers_sent && s.queue.is_empty());
                self.send_headers(id, fields, true);
            }
        }
    }
}

/// A WINDOW_UPDATE, or a new SETTINGS_INITIAL_WINDOW_SIZE, took a window
/// above 2^31 - 1 (RFC 9113 §6.9.1, §6.9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowOverflow;

/// Whether a header must never be indexed by HPACK (§7.1.3).
fn sensitive(name: &[u8]) -> bool {
    matches!(
        name,
        b"authorization" | b"proxy-authorization" | b"cookie" | b"set-cookie"
    ) || name.starts_with(b"spinlink-token")
        || name.starts_with(b"spinlink-bootstrap")
}

/// Appends `data` as DATA frames of at most `max_frame` bytes; an empty
/// `data` with `end` is one empty frame.
fn write_data_frames(buf: &mut BytesMut, id: u32, data: &[u8], end: bool, max_frame: usize) {
    if data.is_empty() {
        if end {
            frame::write_data(buf, id, &[], true);
        }
        return;
    }
    let mut chunks = data.chunks(max_frame).peekable();
    while let Some(chunk) = chunks.next() {
        frame::write_data(buf, id, chunk, end && chunks.peek().is_none());
    }
}

/// A gRPC status as header fields: trailers, or with `head` a whole
/// trailers-only response.
pub fn grpc_status_fields(code: u16, message: &str, head: bool) -> Fields {
    let mut fields = Fields::with_capacity(4);
    if head {
        fields.push((Bytes::from_static(b":status"), Bytes::from_static(b"200")));
        fields.push((
            Bytes::from_static(b"content-type"),
            Bytes::from_static(b"application/grpc"),
        ));
    }
    fields.push((
        Bytes::from_static(b"grpc-status"),
        Bytes::from(code.to_string()),
    ));
    if !message.is_empty() {
        let encoded = percent_encode_grpc(message);
        fields.push((Bytes::from_static(b"grpc-message"), Bytes::from(encoded)));
    }
    fields
}

/// gRPC's `grpc-message` encoding: printable ASCII except `%` as is, every
/// other byte as `%XX`.
fn percent_encode_grpc(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
