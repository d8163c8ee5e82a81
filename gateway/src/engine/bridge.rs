//! A [`Bridge`] connects one stream on a [`Link`] to in-process code that
//! speaks `http` requests and responses: the gateway's own gRPC answers on
//! agent connections (`Hello`), and requests it sends to sidecars itself
//! (health checks, and tunnel streams from ingress connections, which hyper
//! serves).
//!
//! Frames arriving for the stream become a [`BridgeBody`]; consuming it
//! credits the connection, so the peer can send only what the body's reader
//! keeps up with. Writing a body into the stream waits for credit when the
//! peer's window is full ([`Bridge::write_body`]).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::Frame;
use tokio::sync::{Notify, mpsc};

use super::link::{Failure, Fields, Link, Route, Sink};

/// Bytes a writer may have queued at the link, beyond what the peer's
/// window took, before it waits for credit.
const WRITE_AHEAD: usize = 64 * 1024;

/// What arrives for a bridged stream.
#[derive(Debug)]
enum Event {
    Head(Fields, bool),
    Data(Bytes, bool),
    Trailers(Fields),
    Failed(Failure),
}

/// Why a bridged stream's body ended early.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BridgeError {
    /// The other side reset or lost the stream.
    #[error("stream cancelled")]
    Cancelled,
    /// The sidecar side is gone; the message says why.
    #[error("{0}")]
    Unavailable(String),
    /// A header block that is not valid HTTP.
    #[error("invalid header block: {0}")]
    InvalidHeaders(&'static str),
}

impl From<Failure> for BridgeError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Cancel => BridgeError::Cancelled,
            Failure::Unavailable(m) => BridgeError::Unavailable(m.into_owned()),
        }
    }
}

/// One bridged stream: a [`Sink`] its connection writes into, and the
/// credit its own writes wait for.
pub struct Bridge {
    tx: Mutex<Option<mpsc::UnboundedSender<Event>>>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    /// Bytes written into the link and not yet sent by it.
    queued: Mutex<usize>,
    credited: Notify,
    head_seen: Mutex<bool>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge").finish_non_exhaustive()
    }
}

impl Bridge {
    /// A bridge; `head_seen` when the stream's head is already known (a
    /// request the gateway answers), so the first block to arrive is
    /// trailers.
    pub fn new(head_seen: bool) -> Arc<Self> {
        // Unbounded on purpose: what arrives is bounded by the window this
        // side grants, which only the body's consumption gives back.
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            tx: Mutex::new(Some(tx)),
            rx: Mutex::new(Some(rx)),
            queued: Mutex::new(0),
            credited: Notify::new(),
            head_seen: Mutex::new(head_seen),
        })
    }

    fn send(&self, event: Event) {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let last = matches!(
            event,
            Event::Failed(_) | Event::Trailers(_) | Event::Data(_, true) | Event::Head(_, true)
        );
        if let Some(t) = tx.as_ref() {
            let _ = t.send(event);
        }
        if last {
            *tx = None;
        }
    }

    /// The body of what arrives, crediting `source` (the stream on its
    /// connection) as it is read. With `cancel_on_drop`, dropping it before
    /// its end resets the stream (an answer nobody reads any more); without,
    /// the stream just stops being read (a request the gateway answered
    /// without needing all of it: the connection ends it once the answer is
    /// complete).
    pub fn body(&self, source: Route, cancel_on_drop: bool) -> BridgeBody {
        let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
        BridgeBody {
            rx,
            source,
            trailers: None,
            done: false,
            cancel_on_drop,
        }
    }

    /// Waits for the response head (client side): its status and headers,
    /// and the body after it.
    pub async fn response(&self, source: Route) -> Result<http::Response<BridgeBody>, BridgeError> {
        let mut body = self.body(source, true);
        let Some(rx) = body.rx.as_mut() else {
            return Err(BridgeError::Cancelled);
        };
        match rx.recv().await {
            Some(Event::Head(fields, end)) => {
                let (status, headers) = response_head(&fields)?;
                body.done = end;
                let mut response = http::Response::new(body);
                *response.status_mut() = status;
                *response.headers_mut() = headers;
                *response.version_mut() = http::Version::HTTP_2;
                Ok(response)
            }
            Some(Event::Failed(f)) => Err(f.into()),
            Some(_) | None => Err(BridgeError::Cancelled),
        }
    }

    /// Writes `body` into stream `id` of `link` (whose queued data credits
    /// this bridge), then `trailers` or the end of the stream.
    pub async fn write_body<B>(&self, link: &Arc<Link>, id: u32, body: B) -> Result<(), BridgeError>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let mut body = std::pin::pin!(body);
        if body.is_end_stream() {
            link.data(id, &[], true);
            return Ok(());
        }
        loop {
            let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
            match frame {
                None => {
                    link.data(id, &[], true);
                    return Ok(());
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "bridged body failed; resetting the stream");
                    link.fail(id, Failure::Cancel);
                    return Err(BridgeError::Cancelled);
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let end = body.is_end_stream();
                        let sent = link.data(id, &data, end);
                        self.wait_credit(data.len() - sent).await;
                        if end {
                            return Ok(());
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            link.headers(id, header_fields(&trailers), true);
                        }
                        return Ok(());
                    }
                },
            }
        }
    }

    /// Counts `n` bytes queued at the link and waits while too much is.
    async fn wait_credit(&self, n: usize) {
        *self.queued.lock().unwrap_or_else(|e| e.into_inner()) += n;
        loop {
            let notified = self.credited.notified();
            if *self.queued.lock().unwrap_or_else(|e| e.into_inner()) <= WRITE_AHEAD {
                return;
            }
            if self.tx.lock().unwrap_or_else(|e| e.into_inner()).is_none()
                && self.rx.lock().unwrap_or_else(|e| e.into_inner()).is_none()
            {
                // The stream is gone both ways: nothing will be credited.
                return;
            }
            notified.await;
        }
    }
}

impl Sink for Bridge {
    fn headers(&self, _id: u32, fields: Fields, end: bool) {
        let first = {
            let mut seen = self.head_seen.lock().unwrap_or_else(|e| e.into_inner());
            !std::mem::replace(&mut *seen, true)
        };
        if first {
            self.send(Event::Head(fields, end));
        } else {
            self.send(Event::Trailers(fields));
        }
    }

    fn data(&self, _id: u32, data: &[u8], end: bool) -> usize {
        self.send(Event::Data(Bytes::copy_from_slice(data), end));
        0
    }

    fn fail(&self, _id: u32, failure: Failure) {
        self.send(Event::Failed(failure));
        // A writer waiting for credit gives up.
        *self.queued.lock().unwrap_or_else(|e| e.into_inner()) = 0;
        self.credited.notify_waiters();
    }

    fn credit(&self, _id: u32, n: usize) {
        let mut q = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        *q = q.saturating_sub(n);
        drop(q);
        self.credited.notify_waiters();
    }
}

/// What arrived for a bridged stream, as an HTTP body. Dropping it early
/// resets the stream.
pub struct BridgeBody {
    rx: Option<mpsc::UnboundedReceiver<Event>>,
    source: Route,
    trailers: Option<HeaderMap>,
    done: bool,
    cancel_on_drop: bool,
}

impl std::fmt::Debug for BridgeBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeBody")
            .field("done", &self.done)
            .finish()
    }
}

impl Drop for BridgeBody {
    fn drop(&mut self) {
        if !self.done && self.cancel_on_drop {
            self.source.sink.fail(self.source.id, Failure::Cancel);
        }
    }
}

impl http_body::Body for BridgeBody {
    type Data = Bytes;
    type Error = BridgeError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BridgeError>>> {
        if let Some(t) = self.trailers.take() {
            self.done = true;
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let Some(rx) = self.rx.as_mut() else {
            self.done = true;
            return Poll::Ready(Some(Err(BridgeError::Cancelled)));
        };
        match rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(BridgeError::Cancelled)))
            }
            Poll::Ready(Some(Event::Data(data, end))) => {
                // Read: the window it held may be granted again.
                self.source.sink.credit(self.source.id, data.len());
                if end {
                    self.done = true;
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Event::Trailers(fields))) => {
                self.done = true;
                match fields_to_map(&fields) {
                    Ok(map) => Poll::Ready(Some(Ok(Frame::trailers(map)))),
                    Err(e) => Poll::Ready(Some(Err(e))),
                }
            }
            Poll::Ready(Some(Event::Head(..))) => {
                self.done = true;
                Poll::Ready(Some(Err(BridgeError::InvalidHeaders("a second head"))))
            }
            Poll::Ready(Some(Event::Failed(f))) => {
                self.done = true;
                Poll::Ready(Some(Err(f.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }
}

/// Regular header fields as a map (pseudo fields skipped).
pub fn fields_to_map(fields: &Fields) -> Result<HeaderMap, BridgeError> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (n, v) in fields {
        if n.first() == Some(&b':') {
            continue;
        }
        let name =
            HeaderName::from_bytes(n).map_err(|_| BridgeError::InvalidHeaders("header name"))?;
        let value = HeaderValue::from_maybe_shared(v.clone())
            .map_err(|_| BridgeError::InvalidHeaders("header value"))?;
        map.append(name, value);
    }
    Ok(map)
}

fn response_head(fields: &Fields) -> Result<(StatusCode, HeaderMap), BridgeError> {
    let status = fields
        .iter()
        .find(|(n, _)| &n[..] == b":status")
        .and_then(|(_, v)| StatusCode::from_bytes(v).ok())
        .ok_or(BridgeError::InvalidHeaders(":status"))?;
    Ok((status, fields_to_map(fields)?))
}

/// A header map as fields (regular fields only).
pub fn header_fields(map: &HeaderMap) -> Fields {
    map.iter()
        .map(|(n, v)| {
            (
                Bytes::copy_from_slice(n.as_str().as_bytes()),
                Bytes::copy_from_slice(v.as_bytes()),
            )
        })
        .collect()
}

/// A response head as fields: `:status` then the headers.
pub fn response_fields(status: StatusCode, headers: &HeaderMap) -> Fields {
    let mut fields = Vec::with_capacity(headers.len() + 1);
    fields.push((
        Bytes::from_static(b":status"),
        Bytes::copy_from_slice(status.as_str().as_bytes()),
    ));
    fields.extend(header_fields(headers));
    fields
}
