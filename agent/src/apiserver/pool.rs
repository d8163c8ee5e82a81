//! A few HTTP/2 connections to one API server, each carrying at most
//! [`MAX_STREAMS_PER_CONNECTION`] requests at a time.
//!
//! hyper's pooled client keeps one HTTP/2 connection per server and, when the
//! server's `SETTINGS_MAX_CONCURRENT_STREAMS` is reached, queues further
//! requests on it rather than dialling another connection. Watches hold their
//! stream for minutes, so a queued watch would wait that long. The pool
//! therefore has slots, each a hyper client of its own (so at most one HTTP/2
//! connection), and sends every request through the first slot with a
//! stream free, adding a slot when all are full: 62 watches take one
//! connection, 250 take three.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy;
use prometheus_client::metrics::gauge::Gauge;

/// Requests one connection carries at a time. The API server allows 100
/// concurrent streams per connection (`--http2-max-streams-per-connection`,
/// lowered from Go's 250 in 2023 against rapid-reset floods), as RFC 9113
/// recommends as the least a server should allow. Counted from sending the
/// request until its response body is done or dropped, which is never
/// shorter than the stream, so the server's limit is never reached.
pub const MAX_STREAMS_PER_CONNECTION: usize = 100;

/// Makes a slot's hyper client; its connections count in the gauge given.
pub type MakeClient<C> = dyn Fn(Gauge) -> legacy::Client<C, kube::client::Body> + Send + Sync;

/// The pool: cheap to clone, all clones share the slots.
pub struct Pool<C> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for Pool<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<C> std::fmt::Debug for Pool<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let streams: Vec<usize> = self
            .shared
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|s| s.streams())
            .collect();
        f.debug_struct("Pool").field("streams", &streams).finish()
    }
}

struct Shared<C> {
    make: Box<MakeClient<C>>,
    max_streams: usize,
    slots: Mutex<Vec<Arc<Slot<C>>>>,
}

struct Slot<C> {
    client: legacy::Client<C, kube::client::Body>,
    /// Requests in flight on this slot.
    streams: Gauge,
    /// The slot's open connections.
    connections: Gauge,
    /// Held by the one request that opens the slot's connection; see
    /// [`Pool::send`].
    first: tokio::sync::Mutex<()>,
}

impl<C> Slot<C> {
    fn streams(&self) -> usize {
        usize::try_from(self.streams.get()).unwrap_or_default()
    }
}

impl<C> Pool<C>
where
    C: legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    /// A pool whose slots' clients `make` builds.
    pub fn new(make: Box<MakeClient<C>>) -> Self {
        Self::with_max_streams(make, MAX_STREAMS_PER_CONNECTION)
    }

    /// [`Pool::new`] with another per-connection limit (tests).
    pub fn with_max_streams(make: Box<MakeClient<C>>, max_streams: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                make,
                max_streams: max_streams.max(1),
                slots: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The first slot with a stream free (a new one when none has), with the
    /// stream taken.
    fn lease(&self) -> (Arc<Slot<C>>, Lease) {
        let mut slots = self.shared.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match slots.iter().find(|s| s.streams() < self.shared.max_streams) {
            Some(slot) => slot.clone(),
            None => {
                let connections = Gauge::default();
                let slot = Arc::new(Slot {
                    client: (self.shared.make)(connections.clone()),
                    streams: Gauge::default(),
                    connections,
                    first: tokio::sync::Mutex::new(()),
                });
                slots.push(slot.clone());
                slot
            }
        };
        slot.streams.inc();
        let lease = Lease(slot.streams.clone());
        (slot, lease)
    }

    /// Sends `request` on a slot with a stream free.
    ///
    /// Until the server has answered over TLS, the client cannot know it
    /// will speak HTTP/2, so hyper would dial once for every request of a
    /// burst (the agent's watches all start together) and drop all
    /// connections but one after the handshakes. A request to a slot without
    /// a connection therefore goes alone, and the others of the burst follow
    /// once its answer has arrived, on the connection it opened (or, from an
    /// HTTP/1.1 server, each on one of their own).
    async fn send(
        &self,
        request: Request<kube::client::Body>,
    ) -> Result<Response<Body>, legacy::Error> {
        let (slot, lease) = self.lease();
        let first = if slot.connections.get() == 0 {
            let guard = slot.first.lock().await;
            // Opened by the request that held it meanwhile?
            (slot.connections.get() == 0).then_some(guard)
        } else {
            None
        };
        let response = slot.client.request(request).await;
        drop(first);
        Ok(response?.map(|body| Body {
            body,
            lease: Some(lease),
        }))
    }

    /// Open connections and requests in flight, per slot (tests).
    pub fn usage(&self) -> Vec<(i64, usize)> {
        self.shared
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|s| (s.connections.get(), s.streams()))
            .collect()
    }
}

impl<C> tower::Service<Request<kube::client::Body>> for Pool<C>
where
    C: legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    type Response = Response<Body>;
    type Error = legacy::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper's client is always ready; slots are chosen per request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let pool = self.clone();
        Box::pin(async move { pool.send(request).await })
    }
}

/// A stream of a slot, taken until dropped.
#[derive(Debug)]
struct Lease(Gauge);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A response body that frees its slot's stream when it ends or is dropped.
#[derive(Debug)]
pub struct Body {
    body: Incoming,
    lease: Option<Lease>,
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.lease = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
