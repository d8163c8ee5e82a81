//! HTTP/1.1 to upstream servers on an exchange of the gateway's own: the
//! request's task writes the request and reads the answer on the
//! connection itself, with no connection task between them and no copy
//! of the request kept to send it again (its head is one buffer, sent
//! again as it is).
//!
//! The answer is read as RFC 9112 §6.3 frames it and as nginx 1.22's proxy
//! module reads it (`tests/nginx_diff.rs` checks each framing against real
//! nginx): interim (1xx) answers but `101` are skipped; a `HEAD` request's
//! answer, `204` and `304` have no body; `Transfer-Encoding` ending in
//! `chunked` is chunked (in HTTP/1.0 too) and any other is read until the
//! server closes, a `Content-Length` beside it ignored (the connection is
//! then not kept); else `Content-Length` (every value the same number) is
//! the body's length; else the body is read until the server closes.
//! Differing `Content-Length` values and an answer without a status line
//! are refused (nginx 1.22 gives its client something unreadable there).
//! Every part is bounded: the head (status line, headers, and a chunked
//! body's trailers) at [`MAX_HEAD`] bytes and [`MAX_HEADERS`] fields, a
//! chunk-size line at [`MAX_CHUNK_LINE`]; a body streams through in the
//! frames it arrives in.
//!
//! The request's body goes out while the answer's head is awaited and, if
//! the answer comes first, while the answer is read. A connection is kept
//! for the next request when the answer is HTTP/1.1 without `Connection:
//! close`, its body had a length (or chunks) and was read to its end, the
//! request went out whole, and nothing followed the answer (nginx drops
//! what an upstream sends past the answer and closes).
//!
//! The framing is worked out by plain functions over a buffer
//! ([`parse_head`], [`Framing::of`], [`Framing::decode`]), which the fuzz
//! target `h1_answer` drives with any bytes cut at any points.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use http_body::{Body as _, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What a request to an upstream carries.
pub(crate) type ReqBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Most bytes an answer's head (or a chunked body's trailers) may take.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in an answer's head (or its trailers).
pub(crate) const MAX_HEADERS: usize = 100;
/// Most bytes a chunk-size line (extensions included) may take.
pub(crate) const MAX_CHUNK_LINE: usize = 4096;
/// What one read asks the socket for.
const READ_SIZE: usize = 16 * 1024;

/// What a connection to an upstream server runs over: TCP, or TLS on it.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The connection failed (closed, reset, or any I/O error) before the
    /// answer's head was read.
    #[error("upstream connection failed: {0}")]
    Failed(#[source] std::io::Error),
    /// The answer is not HTTP/1.1 the gateway accepts.
    #[error("invalid answer from upstream: {0}")]
    Invalid(&'static str),
    /// The answer's body ended before its length.
    #[error("upstream connection ended inside the body: {0}")]
    Truncated(#[source] std::io::Error),
    /// The request's body failed (the client's, or the gateway's own
    /// bound on it).
    #[error(transparent)]
    Body(BoxError),
    /// Nothing of the request could be written for the send timeout, or
    /// its answer's head did not come within the read timeout after it had
    /// gone out.
    #[error("upstream timed out {0}")]
    TimedOut(&'static str),
}

impl Error {
    /// The connection failed before answering: the request may be sent
    /// again on another.
    pub(super) fn is_connection_failure(&self) -> bool {
        matches!(self, Self::Failed(_))
    }

    /// A timeout ended the exchange.
    pub(super) fn is_timeout(&self) -> bool {
        matches!(self, Self::TimedOut(_))
    }
}

/// How long a request waits on an upstream server, phase by phase, as
/// nginx times them. An exchange waits between two writes of the request
/// while it goes out (`send`), then from its end to the answer's head
/// (`read`, which nginx starts once the request is sent): a request whose
/// body streams in slowly from its client is not cut off by the read
/// timeout while it is still moving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// Connecting, the TLS handshake included (`proxy_connect_timeout`,
    /// `grpc_connect_timeout`): the dialler's.
    pub connect: std::time::Duration,
    /// Between two writes of the request to an HTTP/1.1 server
    /// (`proxy_send_timeout`).
    pub send: std::time::Duration,
    /// To the answer's head (`proxy_read_timeout`, `grpc_read_timeout`):
    /// from the request's end over HTTP/1.1, from its start over HTTP/2.
    pub read: std::time::Duration,
}

/// A connection to an upstream server, between exchanges or lent to one
/// answer's body.
pub(super) struct Conn {
    io: Box<dyn Io>,
    /// Bytes read and not yet taken.
    buf: BytesMut,
}

impl Conn {
    pub(super) fn from_io(io: Box<dyn Io>) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
        }
    }

    /// Whether an idle connection can carry a request: the server has
    /// neither closed it nor sent anything unasked. Reads without waiting
    /// (a socket with nothing new makes no system call).
    pub(super) fn is_usable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.poll_read(&mut cx).is_pending()
    }

    /// Reads what the socket has into `buf`: the number of bytes, 0 at its
    /// end.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    /// Sends a request (`head` from [`encode_head`], then `body` framed as
    /// `out`) and reads the answer's head; `head_request` says the request
    /// was `HEAD` (its answer has no body).
    pub(super) async fn exchange(
        mut self,
        head: Bytes,
        out: Out,
        body: ReqBody,
        head_request: bool,
        timeouts: Timeouts,
    ) -> Result<http::Response<Answer>, Error> {
        let mut sending = Sending {
            pending: head,
            out,
            body: (out != Out::None).then_some(body),
            done: false,
            failed: false,
            written: 0,
        };
        // One timer, moved on as the request goes out ([`Timeouts`]); a
        // request without a body goes out at once and starts on the read
        // timeout.
        let mut writing = out != Out::None;
        let mut written = 0;
        let timer = tokio::time::sleep(if writing {
            timeouts.send
        } else {
            timeouts.read
        });
        let mut timer = std::pin::pin!(timer);
        let parsed = poll_fn(|cx| {
            if !sending.done && !sending.failed {
                match sending.poll(cx, &mut self.io) {
                    Poll::Ready(Ok(())) => sending.done = true,
                    Poll::Ready(Err(Error::Failed(e))) => {
                        // Whatever the server answered before failing is
                        // still read below; its end is the error.
                        tracing::debug!(error = %e, "writing to upstream failed");
                        sending.failed = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            if let Poll::Ready(head) = self.poll_head(cx) {
                return Poll::Ready(head);
            }
            let still_writing = !sending.done && !sending.failed;
            if still_writing != writing || (still_writing && sending.written != written) {
                writing = still_writing;
                written = sending.written;
                let wait = if writing {
                    timeouts.send
                } else {
                    timeouts.read
                };
                timer.as_mut().reset(tokio::time::Instant::now() + wait);
            }
            ready!(timer.as_mut().poll(cx));
            Poll::Ready(Err(Error::TimedOut(if writing {
                "sending the request"
            } else {
                "waiting for the answer"
            })))
        })
        .await?;
        let head = parsed;
        let framing = Framing::of(&head, head_request)?;
        let keep_alive = framing.keeps_alive(&head) && !sending.failed;
        // An answer can come before the request's body has all gone out:
        // the rest goes on while the answer is read (as hyper's client did,
        // for a server that answers as it reads), and the connection is
        // kept only if it all went.
        let sending = (!sending.done && !sending.failed).then_some(sending);
        let mut response = http::Response::new(Answer {
            conn: Some(self),
            framing,
            keep_alive,
            sending,
        });
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        if let Some(reason) = head.reason {
            response.extensions_mut().insert(reason);
        }
        Ok(response)
    }

    /// Reads until a final answer's head is whole, skipping interim ones.
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Head, Error>> {
        loop {
            if let Some(head) = final_head(&mut self.buf)? {
                return Poll::Ready(Ok(head));
            }
            let n = ready!(self.poll_read(cx)).map_err(Error::Failed)?;
            if n == 0 {
                return Poll::Ready(Err(Error::Failed(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed before answering",
                ))));
            }
        }
    }

    /// The connection and what was read past the answer's head: for a `101`
    /// answer, the start of the upgraded stream.
    pub(super) fn into_parts(self) -> (Box<dyn Io>, Bytes) {
        (self.io, self.buf.freeze())
    }
}

/// How a request's body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Out {
    /// No body.
    None,
    /// This many bytes.
    Length(u64),
    /// Chunked.
    Chunked,
}

/// Writing a request: its head, then its body's frames.
struct Sending {
    /// Bytes to write before anything else.
    pending: Bytes,
    out: Out,
    body: Option<ReqBody>,
    done: bool,
    /// The connection failed while writing.
    failed: bool,
    /// Bytes written so far: progress, for the send timeout.
    written: u64,
}

impl Sending {
    fn poll(&mut self, cx: &mut Context<'_>, io: &mut Box<dyn Io>) -> Poll<Result<(), Error>> {
        loop {
            while self.pending.has_remaining() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.pending))
                    .map_err(Error::Failed)?;
                if n == 0 {
                    return Poll::Ready(Err(Error::Failed(std::io::ErrorKind::WriteZero.into())));
                }
                self.pending.advance(n);
                self.written += n as u64;
            }
            // Out before waiting on the body: over TLS, a write the socket
            // took only in part leaves records that only a flush sends.
            ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(Error::Failed)?;
            let Some(body) = self.body.as_mut() else {
                return Poll::Ready(Ok(()));
            };
            match ready!(Pin::new(body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers are not sent on (nginx does not either).
                        continue;
                    };
                    match &mut self.out {
                        Out::Length(left) => {
                            let n = data.len() as u64;
                            if n > *left {
                                return Poll::Ready(Err(Error::Body(
                                    "request body longer than its Content-Length".into(),
                                )));
                            }
                            *left -= n;
                            self.pending = data;
                        }
                        Out::Chunked if data.is_empty() => {}
                        Out::Chunked => {
                            let mut chunk = BytesMut::with_capacity(data.len() + 20);
                            chunk.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                            chunk.extend_from_slice(&data);
                            chunk.extend_from_slice(b"\r\n");
                            self.pending = chunk.freeze();
                        }
                        Out::None => {}
                    }
                }
                Some(Err(e)) => return Poll::Ready(Err(Error::Body(e))),
                None => {
                    match self.out {
                        Out::Length(0) | Out::None => {}
                        Out::Length(_) => {
                            return Poll::Ready(Err(Error::Body(
                                "request body shorter than its Content-Length".into(),
                            )));
                        }
                        Out::Chunked => self.pending = Bytes::from_static(b"0\r\n\r\n"),
                    }
                    self.body = None;
                }
            }
        }
    }
}

/// A request's head as HTTP/1.1 writes it, and how its body follows: the
/// body's own length when the request says it (`Content-Length`) or the
/// body knows it, else chunked; none when the body is already at its end.
pub(super) fn encode_head(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &ReqBody,
) -> Result<(Bytes, Out), Error> {
    let own_length = headers.get(header::CONTENT_LENGTH);
    let out = if body.is_end_stream() {
        Out::None
    } else if let Some(v) = own_length {
        let n = v
            .to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or(Error::Body("request Content-Length not a number".into()))?;
        Out::Length(n)
    } else {
        body.size_hint().exact().map_or(Out::Chunked, Out::Length)
    };
    let fields: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    let mut buf = BytesMut::with_capacity(method.as_str().len() + path.len() + 14 + fields + 40);
    buf.extend_from_slice(method.as_str().as_bytes());
    buf.extend_from_slice(b" ");
    buf.extend_from_slice(path.as_bytes());
    buf.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        buf.extend_from_slice(name.as_str().as_bytes());
        buf.extend_from_slice(b": ");
        buf.extend_from_slice(value.as_bytes());
        buf.extend_from_slice(b"\r\n");
    }
    // The body's framing, unless the request's own `Content-Length` says it.
    match out {
        Out::Length(n) if own_length.is_none() => {
            buf.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
        }
        Out::Chunked => buf.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    buf.extend_from_slice(b"\r\n");
    Ok((buf.freeze(), out))
}

/// Takes the final answer's head off the front of `buf` once it is whole,
/// dropping interim (1xx but `101`) answers before it: `None` while more is
/// needed, an error once `buf` holds more than a head may take without one.
fn final_head(buf: &mut BytesMut) -> Result<Option<Head>, Error> {
    while let Some(head) = parse_head(buf)? {
        if !head.status.is_informational() || head.status == StatusCode::SWITCHING_PROTOCOLS {
            return Ok(Some(head));
        }
    }
    if buf.len() >= MAX_HEAD {
        return Err(Error::Invalid("answer head too large"));
    }
    Ok(None)
}

/// An answer's head.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    /// The reason phrase, when not the status's usual one.
    pub(crate) reason: Option<hyper::ext::ReasonPhrase>,
    pub(crate) headers: HeaderMap,
}

/// Takes one answer head off the front of `buf` once it is whole: `None`
/// while more is needed. Header values share the buffer's memory.
pub(crate) fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, Error> {
    // Where a field's name and value lie, found while `buf` is borrowed.
    struct At {
        name: (usize, usize),
        value: (usize, usize),
    }
    if buf.is_empty() {
        return Ok(None);
    }
    let base = buf.as_ptr() as usize;
    let end = buf.len();
    // An empty part may lie anywhere; the rest lie in `buf`.
    let at = |s: &[u8]| {
        if s.is_empty() {
            return (0, 0);
        }
        // httparse gives parts of the buffer it parsed; were one
        // elsewhere, it would read as empty, never out of bounds.
        (s.as_ptr() as usize)
            .checked_sub(base)
            .filter(|start| start + s.len() <= end)
            .map_or((0, 0), |start| (start, s.len()))
    };
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Error::Invalid("too many headers")),
        Err(_) => return Err(Error::Invalid("unreadable head")),
    };
    if len > MAX_HEAD {
        return Err(Error::Invalid("answer head too large"));
    }
    let (Some(code), Some(minor)) = (response.code, response.version) else {
        return Err(Error::Invalid("unreadable status line"));
    };
    let status = StatusCode::from_u16(code).map_err(|_| Error::Invalid("status out of range"))?;
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    // httparse gives an empty reason for one that is not UTF-8: the
    // status's own is written then.
    let reason = match response.reason {
        Some(r) if !r.is_empty() && Some(r) != status.canonical_reason() => Some(
            hyper::ext::ReasonPhrase::try_from(r.as_bytes())
                .map_err(|_| Error::Invalid("unreadable reason phrase"))?,
        ),
        _ => None,
    };
    // Held inline for the usual few headers.
    let found: smallvec::SmallVec<[At; 24]> = response
        .headers
        .iter()
        .map(|h| At {
            name: at(h.name.as_bytes()),
            value: at(h.value),
        })
        .collect();
    let head = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(found.len());
    for At { name, value } in &found {
        let name = HeaderName::from_bytes(&head[name.0..name.0 + name.1])
            .map_err(|_| Error::Invalid("unreadable header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(value.0..value.0 + value.1))
            .map_err(|_| Error::Invalid("unreadable header value"))?;
        headers.append(name, value);
    }
    Ok(Some(Head {
        status,
        version,
        reason,
        headers,
    }))
}

/// How an answer's body is framed, and how far it has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (or nothing left of it).
    Empty,
    /// This many bytes left.
    Length(u64),
    /// Chunked, at this point of it.
    Chunked(Chunk),
    /// Until the server closes.
    Close,
}

/// Where a chunked body's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk: trailers, then the empty line.
    Trailers,
}

/// What one step of reading a body gives.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body has ended.
    End,
}

impl Framing {
    /// How the answer with `head` frames its body (`head_request`: it
    /// answers a `HEAD`).
    pub(crate) fn of(head: &Head, head_request: bool) -> Result<Self, Error> {
        let status = head.status;
        if head_request
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Ok(Self::Empty);
        }
        let headers = &head.headers;
        if headers.contains_key(header::TRANSFER_ENCODING) {
            let last = headers
                .get_all(header::TRANSFER_ENCODING)
                .iter()
                .next_back()
                .and_then(|v| v.as_bytes().rsplit(|&b| b == b',').next())
                .map(|c| c.trim_ascii());
            return Ok(match last {
                Some(c) if c.eq_ignore_ascii_case(b"chunked") => Self::Chunked(Chunk::Size),
                _ => Self::Close,
            });
        }
        let mut length = None;
        for value in headers.get_all(header::CONTENT_LENGTH) {
            for part in value.as_bytes().split(|&b| b == b',') {
                let part = part.trim_ascii();
                if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
                    return Err(Error::Invalid("unreadable Content-Length"));
                }
                let n: u64 = std::str::from_utf8(part)
                    .ok()
                    .and_then(|p| p.parse().ok())
                    .ok_or(Error::Invalid("unreadable Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(Error::Invalid("differing Content-Length values"));
                }
                length = Some(n);
            }
        }
        Ok(match length {
            None => Self::Close,
            Some(0) => Self::Empty,
            Some(n) => Self::Length(n),
        })
    }

    /// Whether the connection may carry another request once this body is
    /// read to its end.
    fn keeps_alive(self, head: &Head) -> bool {
        head.version == Version::HTTP_11
            && self != Self::Close
            && head.status != StatusCode::SWITCHING_PROTOCOLS
            // Both framings named: the server's own reading is in doubt.
            && !(head.headers.contains_key(header::TRANSFER_ENCODING)
                && head.headers.contains_key(header::CONTENT_LENGTH))
            && !head.headers.get_all(header::CONNECTION).iter().any(|v| {
                v.as_bytes()
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
            })
    }

    /// The next step of the body from `buf` (`eof`: nothing more will
    /// come): `None` while more is needed.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut, eof: bool) -> Result<Option<Step>, Error> {
        let truncated = || {
            Error::Truncated(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before the body's end",
            ))
        };
        loop {
            match self {
                Self::Empty => return Ok(Some(Step::End)),
                Self::Length(0) => *self = Self::Empty,
                Self::Length(left) => {
                    if buf.is_empty() {
                        return if eof { Err(truncated()) } else { Ok(None) };
                    }
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                    *left -= n as u64;
                    let data = buf.split_to(n).freeze();
                    if *left == 0 {
                        // Ended with its last byte: the connection is
                        // free before the next poll.
                        *self = Self::Empty;
                    }
                    return Ok(Some(Step::Data(data)));
                }
                Self::Close => {
                    if buf.is_empty() {
                        if eof {
                            *self = Self::Empty;
                            continue;
                        }
                        return Ok(None);
                    }
                    return Ok(Some(Step::Data(buf.split().freeze())));
                }
                Self::Chunked(chunk) => {
                    let step = chunk.decode(buf)?;
                    if step.is_none() && eof {
                        return Err(truncated());
                    }
                    if matches!(step, Some(Step::End | Step::Trailers(_))) {
                        *self = Self::Empty;
                    }
                    return Ok(step);
                }
            }
        }
    }
}

impl Chunk {
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Step>, Error> {
        loop {
            match *self {
                Self::Size => {
                    let window = &buf[..buf.len().min(MAX_CHUNK_LINE)];
                    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
                        if buf.len() >= MAX_CHUNK_LINE {
                            return Err(Error::Invalid("chunk-size line too long"));
                        }
                        return Ok(None);
                    };
                    let size = chunk_size(&window[..lf])?;
                    buf.advance(lf + 1);
                    *self = if size == 0 {
                        Self::Trailers
                    } else {
                        Self::Data(size)
                    };
                }
                Self::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let left = left - n as u64;
                    *self = if left == 0 {
                        Self::DataEnd
                    } else {
                        Self::Data(left)
                    };
                    return Ok(Some(Step::Data(buf.split_to(n).freeze())));
                }
                Self::DataEnd => {
                    // CRLF, or a bare LF (nginx reads it too).
                    let end = match &buf[..] {
                        [b'\n', ..] => 1,
                        [b'\r', b'\n', ..] => 2,
                        [] | [b'\r'] => return Ok(None),
                        _ => return Err(Error::Invalid("chunk data not followed by CRLF")),
                    };
                    buf.advance(end);
                    *self = Self::Size;
                }
                Self::Trailers => {
                    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    return match httparse::parse_headers(buf, &mut fields) {
                        Ok(httparse::Status::Complete((len, _))) if len > MAX_HEAD => {
                            Err(Error::Invalid("trailers too large"))
                        }
                        Ok(httparse::Status::Complete((len, fields))) => {
                            let mut trailers = HeaderMap::new();
                            for f in fields.iter() {
                                let name = HeaderName::from_bytes(f.name.as_bytes())
                                    .map_err(|_| Error::Invalid("unreadable trailer name"))?;
                                let value = HeaderValue::from_bytes(f.value)
                                    .map_err(|_| Error::Invalid("unreadable trailer value"))?;
                                trailers.append(name, value);
                            }
                            buf.advance(len);
                            Ok(Some(if trailers.is_empty() {
                                Step::End
                            } else {
                                Step::Trailers(trailers)
                            }))
                        }
                        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => Ok(None),
                        Ok(httparse::Status::Partial) => Err(Error::Invalid("trailers too large")),
                        Err(_) => Err(Error::Invalid("unreadable trailers")),
                    };
                }
            }
        }
    }
}

/// A chunk-size line's size: hex digits, then optional whitespace and
/// `;`-extensions (ignored), then CRLF or a bare LF, as nginx reads it
/// (the LF already cut off).
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(Error::Invalid("unreadable chunk size"));
    }
    let rest = &line[digits..];
    let ext = rest.trim_ascii_start();
    if !(ext.is_empty() || ext[0] == b';')
        || rest.iter().any(|&b| b < 0x20 && b != b'\t' || b == 0x7f)
    {
        return Err(Error::Invalid("unreadable chunk extension"));
    }
    let digits = std::str::from_utf8(&line[..digits]).map_err(|_| Error::Invalid("chunk size"))?;
    u64::from_str_radix(digits, 16).map_err(|_| Error::Invalid("unreadable chunk size"))
}

/// An upstream answer's body, read off its connection; the connection is
/// there to take back ([`Answer::reusable`]) once the body has ended.
pub(super) struct Answer {
    conn: Option<Conn>,
    framing: Framing,
    keep_alive: bool,
    /// The rest of the request, while it is still going out.
    sending: Option<Sending>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("framing", &self.framing)
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

impl Answer {
    /// The connection, when the body has been read to its end and the
    /// connection can carry another request.
    pub(super) fn reusable(&mut self) -> Option<Conn> {
        if self.framing == Framing::Empty && self.keep_alive && self.sending.is_none() {
            self.conn.take().filter(|c| c.buf.is_empty())
        } else {
            None
        }
    }

    /// The connection itself, for an upgraded (`101`) exchange.
    pub(super) fn into_conn(mut self) -> Option<Conn> {
        self.conn.take()
    }
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(sending) = this.sending.as_mut()
            && let Poll::Ready(sent) = sending.poll(cx, &mut conn.io)
        {
            if let Err(e) = sent {
                tracing::debug!(error = %e, "the rest of a request to an upstream failed");
                this.keep_alive = false;
            }
            this.sending = None;
        }
        let mut eof = false;
        loop {
            match this.framing.decode(&mut conn.buf, eof) {
                Ok(Some(Step::Data(data))) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Some(Step::Trailers(t))) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Ok(Some(Step::End)) => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => {
                    this.keep_alive = false;
                    this.framing = Framing::Empty;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            match ready!(conn.poll_read(cx)) {
                Ok(0) => {
                    eof = true;
                    this.keep_alive = false;
                }
                Ok(_) => {}
                Err(e) => {
                    this.keep_alive = false;
                    this.framing = Framing::Empty;
                    return Poll::Ready(Some(Err(Error::Truncated(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Empty
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Empty => SizeHint::with_exact(0),
            Framing::Length(n) => match &self.conn {
                Some(_) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
            _ => SizeHint::default(),
        }
    }
}

/// What reading one answer gave, for comparing readings
/// ([`read_pieces`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reading {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    /// The length the head declared, if any.
    pub(crate) length: Option<u64>,
    pub(crate) body: Vec<u8>,
    pub(crate) trailers: Vec<(String, Vec<u8>)>,
    /// Whether the connection could carry another request.
    pub(crate) keeps_alive: bool,
    /// Bytes after the answer.
    pub(crate) left: usize,
}

/// Reads one answer from `pieces`, as the exchange does off a connection
/// that delivers them one read at a time and then closes: the same head
/// parsing, framing and body decoding, without the socket.
pub(crate) fn read_pieces(pieces: &[&[u8]], head_request: bool) -> Result<Reading, String> {
    let mut buf = BytesMut::new();
    let mut next = pieces.iter();
    let head = loop {
        if let Some(head) = final_head(&mut buf).map_err(|e| e.to_string())? {
            break head;
        }
        match next.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None => return Err("closed before answering".to_owned()),
        }
    };
    let fields = |map: &HeaderMap| {
        map.iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect::<Vec<_>>()
    };
    let mut framing = Framing::of(&head, head_request).map_err(|e| e.to_string())?;
    let first = framing;
    let mut body = Vec::new();
    let mut trailers = Vec::new();
    let mut eof = false;
    loop {
        match framing.decode(&mut buf, eof).map_err(|e| e.to_string())? {
            Some(Step::Data(data)) => body.extend_from_slice(&data),
            Some(Step::Trailers(t)) => trailers = fields(&t),
            Some(Step::End) => break,
            None => match next.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => eof = true,
            },
        }
    }
    let left = buf.len() + next.map(|p| p.len()).sum::<usize>();
    Ok(Reading {
        status: head.status.as_u16(),
        headers: fields(&head.headers),
        length: match first {
            Framing::Length(n) => Some(n),
            Framing::Empty => Some(0),
            _ => None,
        },
        body,
        trailers,
        keeps_alive: first.keeps_alive(&head) && !eof,
        left,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `answer` read whole, as an answer to a `HEAD` when `head_request`.
    fn read(answer: &str, head_request: bool) -> Result<Reading, String> {
        read_pieces(&[answer.as_bytes()], head_request)
    }

    /// The body, whether the connection is kept, and what follows.
    fn framed(answer: &str, head_request: bool) -> (String, bool, usize) {
        let r = read(answer, head_request).unwrap_or_else(|e| panic!("{answer:?}: {e}"));
        (String::from_utf8(r.body).unwrap(), r.keeps_alive, r.left)
    }

    /// How an answer's body is framed, and when its connection is kept:
    /// as hyper 1.12's HTTP/1.1 client (`Client::decoder` and the
    /// keep-alive rules in src/proto/h1/role.rs), which the ingress used
    /// before this exchange, and as nginx's proxy module where the two
    /// differ (an HTTP/1.0 answer closes the connection,
    /// `ngx_http_proxy_process_status`). What a client gets for each
    /// framing is checked against real nginx by `tests/nginx_diff.rs`
    /// (`RAW_ANSWERS`).
    #[test]
    fn answers_are_framed_as_rfc_9112_and_nginx_read_them() {
        let cases: &[(&str, bool, (&str, bool, usize))] = &[
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                false,
                ("ok", true, 0),
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok",
                false,
                ("ok", true, 0),
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
                false,
                ("ok", true, 5),
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
                true,
                ("", true, 0),
            ),
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n",
                false,
                ("", true, 0),
            ),
            ("HTTP/1.1 304 Not Modified\r\n\r\n", false, ("", true, 0)),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;a=b\r\nok\r\n1\r\n!\r\n0\r\n\r\n",
                false,
                ("ok!", true, 0),
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                false,
                ("ok", true, 0),
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nuntil close",
                false,
                ("until close", false, 0),
            ),
            (
                "HTTP/1.1 200 OK\r\n\r\nuntil close",
                false,
                ("until close", false, 0),
            ),
            (
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
                false,
                ("ok", false, 0),
            ),
            (
                "HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 2\r\n\r\nok",
                false,
                ("ok", false, 0),
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
                false,
                ("ok", false, 0),
            ),
            (
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok",
                false,
                ("ok", false, 0),
            ),
            (
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                false,
                ("ok", true, 0),
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\nframes",
                false,
                ("", false, 6),
            ),
        ];
        for (answer, head_request, want) in cases {
            assert_eq!(
                framed(answer, *head_request),
                (want.0.to_owned(), want.1, want.2),
                "{answer:?}"
            );
        }
        // Both framings named: chunked wins, and the connection goes.
        assert_eq!(
            framed(
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                false
            ),
            ("ok".to_owned(), false, 0)
        );
        // HTTP/1.0 with chunked: read (nginx 1.22.1 does; hyper refused).
        assert_eq!(
            framed(
                "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                false
            ),
            ("ok".to_owned(), false, 0)
        );
        for answer in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2, 3\r\n\r\nok",
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
            "HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\nok",
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nok",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n",
            "HTTP/1.1 200 OK\r\n",
            "HTTP/2 200 OK\r\n\r\n",
            "HTTP/1.1 099 Odd\r\n\r\n",
        ] {
            assert!(read(answer, false).is_err(), "{answer:?} accepted");
        }
    }

    /// Chunked bodies as RFC 9112 §7.1 writes them: hex sizes with optional
    /// extensions, CRLF after each chunk's data, trailers after the last;
    /// a bare LF for a CRLF is read as nginx 1.22.1 reads it
    /// (`tests/nginx_diff.rs`, `/raw/chunked-bare-lf`).
    #[test]
    fn chunked_bodies_and_their_trailers_are_read_strictly() {
        let r = read(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nA \t;ext=\"v\"\r\n0123456789\r\n0\r\ngrpc-status: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(r.body, b"0123456789");
        assert_eq!(r.trailers, [("grpc-status".to_owned(), b"0".to_vec())]);
        let chunked = |body: &str| {
            read(
                &format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{body}"),
                false,
            )
        };
        let bare = chunked("2\nok\n0\nx: 1\n\n").unwrap();
        assert_eq!((&bare.body[..], bare.trailers.len()), (&b"ok"[..], 1));
        for bad in [
            "2\r\nokX\r\n0\r\n\r\n",
            "2\rok\r\n0\r\n\r\n",
            "\r\nok\r\n0\r\n\r\n",
            "x2\r\nok\r\n0\r\n\r\n",
            "2 x\r\nok\r\n0\r\n\r\n",
            "2;a\x01\r\nok\r\n0\r\n\r\n",
            "10000000000000000\r\n",
            "0\r\nbad trailer\r\n\r\n",
        ] {
            assert!(chunked(bad).is_err(), "{bad:?} accepted");
        }
        let long = format!("2;{}\r\nok\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE));
        assert_eq!(
            chunked(&long).unwrap_err(),
            "invalid answer from upstream: chunk-size line too long"
        );
        let fits = format!("2;{}\r\nok\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE - 5));
        assert_eq!(chunked(&fits).unwrap().body, b"ok");
    }

    /// A head (or trailers) past [`MAX_HEAD`] is refused however it
    /// arrives; one that fits is read.
    #[test]
    fn heads_are_bounded() {
        let with = |n: usize| {
            format!(
                "HTTP/1.1 200 OK\r\nx: {}\r\ncontent-length: 0\r\n\r\n",
                "v".repeat(n)
            )
        };
        let overhead = with(0).len();
        let fits = with(MAX_HEAD - overhead);
        let over = with(MAX_HEAD - overhead + 1);
        for cut in [1, 1000, usize::MAX] {
            let pieces = |s: &str| -> Vec<Vec<u8>> {
                s.as_bytes()
                    .chunks(cut.min(s.len()))
                    .map(<[u8]>::to_vec)
                    .collect()
            };
            let p = pieces(&fits);
            let p: Vec<&[u8]> = p.iter().map(Vec::as_slice).collect();
            assert!(read_pieces(&p, false).is_ok(), "cut {cut}");
            let p = pieces(&over);
            let p: Vec<&[u8]> = p.iter().map(Vec::as_slice).collect();
            assert_eq!(
                read_pieces(&p, false).unwrap_err(),
                "invalid answer from upstream: answer head too large",
                "cut {cut}"
            );
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x{i}: v\r\n")).collect();
        assert!(read(&format!("HTTP/1.1 200 OK\r\n{many}\r\n"), false).is_err());
        let trailers = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx: {}\r\n\r\n",
            "v".repeat(MAX_HEAD)
        );
        assert!(read(&trailers, false).is_err());
    }

    /// A reason phrase other than the status's own is kept for the client,
    /// as hyper's client kept it (`ReasonPhrase`).
    #[test]
    fn an_unusual_reason_phrase_is_kept() {
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 Fine\r\nx: 1\r\n\r\n"[..]);
        let head = parse_head(&mut buf).unwrap().unwrap();
        assert_eq!(head.reason.unwrap().as_bytes(), b"Fine");
        assert_eq!(head.headers["x"], "1");
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
        assert!(parse_head(&mut buf).unwrap().unwrap().reason.is_none());
    }

    /// One connection to a raw server that hands each accepted connection
    /// to `serve`.
    async fn conn_to<F, Fut>(serve: F) -> Conn
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            serve(s).await;
        });
        Conn::from_io(Box::new(
            tokio::net::TcpStream::connect(addr).await.unwrap(),
        ))
    }

    fn body_of(data: &'static [u8], exact: bool) -> ReqBody {
        use http_body_util::BodyExt as _;
        if exact {
            http_body_util::Full::new(Bytes::from_static(data))
                .map_err(|never| match never {})
                .boxed_unsync()
        } else {
            // No length known: one frame from a stream.
            let frames =
                futures::stream::iter([Ok::<_, BoxError>(Frame::data(Bytes::from_static(data)))]);
            http_body_util::StreamBody::new(frames).boxed_unsync()
        }
    }

    /// A request's framing as hyper's client chose it (`Client::set_length`
    /// in src/proto/h1/role.rs): none for a body already at its end, the
    /// request's own `Content-Length`, else the body's known length, else
    /// chunked (hyper sent no body at all for a GET, HEAD or CONNECT of
    /// unknown length; the gateway sends it chunked, nothing lost).
    #[test]
    fn requests_are_framed_by_their_length_or_chunked() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("up"));
        let (head, out) = encode_head(&Method::GET, "/a?b", &headers, &body_of(b"", true)).unwrap();
        assert_eq!(&head[..], b"GET /a?b HTTP/1.1\r\nhost: up\r\n\r\n");
        assert_eq!(out, Out::None);
        let (head, out) = encode_head(&Method::PUT, "/", &headers, &body_of(b"abc", true)).unwrap();
        assert_eq!(
            &head[..],
            b"PUT / HTTP/1.1\r\nhost: up\r\ncontent-length: 3\r\n\r\n"
        );
        assert_eq!(out, Out::Length(3));
        let (head, out) =
            encode_head(&Method::GET, "/", &headers, &body_of(b"abc", false)).unwrap();
        assert_eq!(
            &head[..],
            b"GET / HTTP/1.1\r\nhost: up\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        assert_eq!(out, Out::Chunked);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        let (head, out) =
            encode_head(&Method::POST, "/", &headers, &body_of(b"abc", false)).unwrap();
        assert_eq!(
            &head[..],
            b"POST / HTTP/1.1\r\nhost: up\r\ncontent-length: 3\r\n\r\n"
        );
        assert_eq!(out, Out::Length(3));
    }

    /// Reads one request (head and a chunked or sized body) off `s`: its bytes.
    async fn read_request(s: &mut tokio::net::TcpStream) -> Vec<u8> {
        use tokio::io::AsyncReadExt as _;
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !(got.ends_with(b"0\r\n\r\n") || got.ends_with(b"\r\n\r\nabc")) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed mid-request: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    /// A chunked body goes out as chunks and a last chunk; the answer's
    /// body comes back in order and frees the connection at its end.
    #[tokio::test]
    async fn an_exchange_sends_the_body_chunked_and_reads_the_answer() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let conn = conn_to(|mut s| async move {
            use tokio::io::AsyncWriteExt as _;
            let got = read_request(&mut s).await;
            s.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\ndone")
                .await
                .unwrap();
            let _ = tx.send(got);
            std::future::pending::<()>().await;
        })
        .await;
        let body = body_of(b"abc", false);
        let (head, out) = encode_head(&Method::POST, "/up", &HeaderMap::new(), &body).unwrap();
        let resp = conn.exchange(head, out, body, false, WAITS).await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(
            rx.await.unwrap(),
            b"POST /up HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        );
        let mut answer = resp.into_body();
        let mut got = Vec::new();
        while let Some(frame) =
            std::future::poll_fn(|cx| Pin::new(&mut answer).poll_frame(cx)).await
        {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(got, b"done");
        assert!(answer.reusable().is_some(), "kept: read to its end");
    }

    /// An answer that comes before the request's body has all gone out
    /// (a 413, say) is the answer; the connection is not kept once the
    /// answer ends with the body still going out.
    #[tokio::test]
    async fn an_early_answer_ends_the_exchange_and_the_connection() {
        let conn = conn_to(|mut s| async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut buf = [0u8; 1024];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            std::future::pending::<()>().await;
        })
        .await;
        // A body that never ends.
        let body = http_body_util::StreamBody::new(futures::stream::pending::<
            Result<Frame<Bytes>, BoxError>,
        >());
        let body: ReqBody = http_body_util::BodyExt::boxed_unsync(body);
        let (head, out) = encode_head(&Method::PUT, "/", &HeaderMap::new(), &body).unwrap();
        let resp = conn.exchange(head, out, body, false, WAITS).await.unwrap();
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let mut answer = resp.into_body();
        assert!(answer.is_end_stream());
        assert!(answer.reusable().is_none());
    }

    /// `f`'s output, failing the test if it takes over 10 s.
    async fn within<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(std::time::Duration::from_secs(10), f)
            .await
            .expect("done within 10 s")
    }

    /// A server that answers as it reads (its answer's head first, then
    /// each piece of the request echoed back): the request's body keeps
    /// going out while the answer is read, and the connection is kept
    /// once both have ended.
    #[tokio::test]
    async fn the_body_goes_on_while_the_answer_is_read() {
        let conn = conn_to(|mut s| async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            // Each chunk of the request comes back as a chunk of the
            // answer, whose head goes once the request's head is in.
            let mut buf = [0u8; 1024];
            let mut seen = Vec::new();
            let mut answered = false;
            loop {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0);
                seen.extend_from_slice(&buf[..n]);
                if !answered {
                    let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    seen.drain(..end + 4);
                    s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                        .await
                        .unwrap();
                    answered = true;
                }
                if seen.ends_with(b"0\r\n\r\n") {
                    s.write_all(b"0\r\n\r\n").await.unwrap();
                    std::future::pending::<()>().await;
                }
                if seen.ends_with(b"\r\n") && seen.len() > 2 {
                    s.write_all(&seen).await.unwrap();
                    seen.clear();
                }
            }
        })
        .await;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let body: ReqBody = http_body_util::BodyExt::boxed_unsync(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let (head, out) = encode_head(&Method::POST, "/echo", &HeaderMap::new(), &body).unwrap();
        tx.send(Ok(Frame::data(Bytes::from_static(b"abc"))))
            .await
            .unwrap();
        let resp = within(conn.exchange(head, out, body, false, WAITS))
            .await
            .unwrap();
        let mut answer = resp.into_body();
        let mut next = async || {
            std::future::poll_fn(|cx| Pin::new(&mut answer).poll_frame(cx))
                .await
                .map(|f| f.unwrap().into_data().unwrap())
        };
        assert_eq!(within(next()).await.as_deref(), Some(&b"abc"[..]));
        tx.send(Ok(Frame::data(Bytes::from_static(b"defg"))))
            .await
            .unwrap();
        assert_eq!(within(next()).await.as_deref(), Some(&b"defg"[..]));
        drop(tx);
        assert_eq!(within(next()).await, None);
        assert!(answer.reusable().is_some(), "kept: both ended");
    }

    /// Over TLS, a body's last bytes go out even when the body then waits:
    /// a write the socket took only in part leaves TLS records behind,
    /// which only a flush sends. A slow reader behind small socket buffers
    /// keeps the socket full, so the last write of a 4 MiB chunk leaves
    /// some.
    #[tokio::test]
    async fn a_body_over_tls_goes_out_whole_before_the_next_piece() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        const SIZE: usize = 4 << 20;
        let dir = tempfile::tempdir().unwrap();
        let pki = spinlink_tls::dev::DevPki::ensure(dir.path(), &[]).unwrap();
        let (cert, key) = (pki.cert("sidecar"), pki.key("sidecar"));
        let server = spinlink_tls::config::server_config(
            spinlink_tls::config::ServerFiles {
                cert: &cert,
                key: &key,
                client_ca: None,
            },
            spinlink_tls::config::ClientAuth::Off,
            &[b"http/1.1"],
        )
        .unwrap();
        let client = spinlink_tls::config::client_config(
            spinlink_tls::config::ClientFiles {
                ca: &pki.ca_cert(),
                identity: None,
            },
            &[b"http/1.1"],
        )
        .unwrap();
        // Small socket buffers on both sides: the socket is full at nearly
        // every write.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(8 * 1024).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();
        let (got, got_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server));
            let mut s = acceptor.accept(s).await.unwrap();
            let mut seen = 0usize;
            let mut buf = vec![0u8; 16 * 1024];
            let mut got = Some(got);
            loop {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed after {seen} bytes");
                seen += n;
                // The head, the chunk's size line and its CRLF: all of it
                // in means the body's first piece went out whole.
                if seen >= SIZE
                    && let Some(got) = got.take()
                {
                    let _ = got.send(());
                }
                if buf[..n].ends_with(b"0\r\n\r\n") {
                    s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                        .await
                        .unwrap();
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        });
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(8 * 1024).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .unwrap();
        let conn = Conn::from_io(Box::new(tls));
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let body: ReqBody = http_body_util::BodyExt::boxed_unsync(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let (head, out) = encode_head(&Method::PUT, "/big", &HeaderMap::new(), &body).unwrap();
        tx.send(Ok(Frame::data(Bytes::from(vec![b'x'; SIZE]))))
            .await
            .unwrap();
        let exchange = tokio::spawn(conn.exchange(head, out, body, false, WAITS));
        within(got_rx).await.expect("the first piece arrived whole");
        drop(tx);
        let resp = within(exchange).await.unwrap().unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    }

    /// A server that closes before answering fails the exchange as a
    /// connection failure (the request may be sent again); one that sends
    /// garbage does not.
    #[tokio::test]
    async fn a_close_before_answering_is_a_connection_failure() {
        let conn = conn_to(|mut s| async move {
            read_request_head(&mut s).await;
        })
        .await;
        let body = body_of(b"", true);
        let (head, out) = encode_head(&Method::GET, "/", &HeaderMap::new(), &body).unwrap();
        let e = conn
            .exchange(head, out, body, false, WAITS)
            .await
            .unwrap_err();
        assert!(e.is_connection_failure(), "{e}");
        let conn = conn_to(|mut s| async move {
            use tokio::io::AsyncWriteExt as _;
            read_request_head(&mut s).await;
            s.write_all(b"SSH-2.0-OpenSSH\r\n\r\n").await.unwrap();
        })
        .await;
        let body = body_of(b"", true);
        let (head, out) = encode_head(&Method::GET, "/", &HeaderMap::new(), &body).unwrap();
        let e = conn
            .exchange(head, out, body, false, WAITS)
            .await
            .unwrap_err();
        assert!(!e.is_connection_failure(), "{e}");
    }

    /// Timeouts the exchanges here never meet.
    const WAITS: Timeouts = Timeouts {
        connect: std::time::Duration::from_secs(60),
        send: std::time::Duration::from_secs(60),
        read: std::time::Duration::from_secs(60),
    };

    /// A body that comes in `parts` pieces `gap` apart, then ends (or, with
    /// `stall`, never ends).
    fn paced_body(parts: usize, gap: std::time::Duration, stall: bool) -> ReqBody {
        use futures::StreamExt as _;
        use http_body_util::BodyExt as _;
        let pieces = futures::stream::iter(0..parts).then(move |_| async move {
            tokio::time::sleep(gap).await;
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"part")))
        });
        let tail = futures::stream::iter([()]).filter_map(move |()| async move {
            if stall {
                std::future::pending::<()>().await;
            }
            None
        });
        http_body_util::StreamBody::new(pieces.chain(tail)).boxed_unsync()
    }

    /// nginx's timers on the way out: between two writes of the request
    /// the send timeout, and only from its end the read timeout — so a
    /// body that streams in for longer than the read timeout is answered.
    /// A request that stops moving times out sending; an answer that does
    /// not come, reading.
    #[tokio::test]
    async fn the_read_timeout_starts_once_the_request_has_gone() {
        let short = std::time::Duration::from_millis(200);
        let gap = std::time::Duration::from_millis(120);
        // The server reads the whole request (head, then a chunked body to
        // its last chunk), then answers.
        let answering = || {
            conn_to(|mut s| async move {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.ends_with(b"0\r\n\r\n") {
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0, "closed mid-request");
                    got.extend_from_slice(&buf[..n]);
                }
                s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                    .await
                    .unwrap();
                std::future::pending::<()>().await;
            })
        };
        let waits = Timeouts {
            send: std::time::Duration::from_secs(5),
            read: short,
            ..WAITS
        };
        // Five pieces 120 ms apart: 600 ms going out, three read timeouts.
        let body = paced_body(5, gap, false);
        let (head, out) = encode_head(&Method::PUT, "/up", &HeaderMap::new(), &body).unwrap();
        assert_eq!(out, Out::Chunked);
        let resp = within(answering().await.exchange(head, out, body, false, waits))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);

        // A body that stops: the send timeout.
        let waits = Timeouts {
            send: short,
            ..WAITS
        };
        let body = paced_body(1, gap, true);
        let (head, out) = encode_head(&Method::PUT, "/up", &HeaderMap::new(), &body).unwrap();
        let e = within(answering().await.exchange(head, out, body, false, waits))
            .await
            .unwrap_err();
        assert!(e.is_timeout() && e.to_string().contains("sending"), "{e}");
        assert!(!e.is_connection_failure(), "{e}");

        // Sent, never answered: the read timeout.
        let waits = Timeouts {
            read: short,
            ..WAITS
        };
        let silent = conn_to(|mut s| async move {
            read_request_head(&mut s).await;
            std::future::pending::<()>().await;
        })
        .await;
        let body = body_of(b"", true);
        let (head, out) = encode_head(&Method::GET, "/", &HeaderMap::new(), &body).unwrap();
        let e = within(silent.exchange(head, out, body, false, waits))
            .await
            .unwrap_err();
        assert!(e.is_timeout() && e.to_string().contains("waiting"), "{e}");
    }

    async fn read_request_head(s: &mut tokio::net::TcpStream) {
        use tokio::io::AsyncReadExt as _;
        let mut buf = [0u8; 1024];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
    }

    /// An idle connection the server closed, or sent something on unasked,
    /// is not used again.
    #[tokio::test]
    async fn an_idle_connection_is_usable_until_the_server_closes_or_speaks() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut conn = conn_to(|s| async move {
            let _ = rx.await;
            drop(s);
        })
        .await;
        assert!(conn.is_usable());
        tx.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while conn.is_usable() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the close seen");
        let mut conn = conn_to(|mut s| async move {
            use tokio::io::AsyncWriteExt as _;
            s.write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
                .await
                .unwrap();
            std::future::pending::<()>().await;
        })
        .await;
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while conn.is_usable() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the unasked answer seen");
    }
}
