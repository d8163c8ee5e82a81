//! Watch streams: newline-delimited JSON events, each written as its own chunk
//! (HTTP/1.1) or DATA frame (HTTP/2) as it happens.
//!
//! One task per watch reads the store's event ring from its cursor whenever the
//! store's resourceVersion changes, and writes into a small bounded channel drained by
//! the response body; when the client goes away the channel closes and the task ends.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::custom_table::any_table;
use super::router::Body;
use crate::store::{EventType, Sim, WatchFilter};
use crate::table::IncludeObject;

/// Frames buffered between a watch task and its response body.
const WATCH_BUFFER: usize = 64;

/// One watch request.
pub(crate) struct WatchRequest {
    pub filter: WatchFilter,
    /// Continue after this resourceVersion; `None`: start with the current objects.
    pub from: Option<u64>,
    /// `sendInitialEvents=true`: end the initial objects with an `initial-events-end` bookmark.
    pub send_initial: bool,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    pub bookmark_interval: Duration,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Render objects as Tables (`kubectl get -w`).
    pub table: Option<IncludeObject>,
}

/// Starts the watch task and returns the streaming response.
pub(crate) fn respond(sim: Sim, req: WatchRequest, shutdown: CancellationToken) -> Response<Body> {
    let (tx, mut rx) = mpsc::channel::<Bytes>(WATCH_BUFFER);
    tokio::spawn(run(sim, req, tx, shutdown));
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|o| o.map(|b| Ok::<_, Infallible>(Frame::data(b))))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// One event line, written as the server writes JSON.
fn frame(ty: &str, object: &Value) -> Bytes {
    Bytes::from(spinlink_kube_api::json::encode(
        &json!({"type": ty, "object": object}),
    ))
}

struct Writer {
    req: WatchRequest,
    tx: mpsc::Sender<Bytes>,
}

impl Writer {
    /// Sends one event; `false` when the client is gone.
    async fn event(&self, ty: EventType, obj: &Arc<Value>) -> bool {
        let bytes = match self.req.table {
            Some(include) => {
                let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
                frame(
                    ty.as_str(),
                    &any_table(self.req.filter.res, [&**obj], meta, include),
                )
            }
            None if self.req.filter.res.custom.is_some()
                && obj["apiVersion"] != self.req.filter.res.api_version =>
            {
                let mut o = (**obj).clone();
                o["apiVersion"] = json!(self.req.filter.res.api_version);
                frame(ty.as_str(), &o)
            }
            None => frame(ty.as_str(), obj),
        };
        self.tx.send(bytes).await.is_ok()
    }

    async fn bookmark(&self, rv: u64, initial_end: bool) -> bool {
        let res = self.req.filter.res;
        let mut obj = json!({"kind": res.kind, "apiVersion": res.api_version, "metadata": {"resourceVersion": rv.to_string()}});
        if initial_end {
            obj["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.tx.send(frame("BOOKMARK", &obj)).await.is_ok()
    }

    async fn error(&self, status: &crate::Status) {
        let _ = self.tx.send(frame("ERROR", &status.to_value())).await;
    }
}

async fn run(sim: Sim, req: WatchRequest, tx: mpsc::Sender<Bytes>, shutdown: CancellationToken) {
    // Subscribe before reading the store so no write between the two is missed.
    let mut changes = sim.subscribe();
    let w = Writer { req, tx };
    let (initial, mut cursor) = match sim.watch_start(&w.req.filter, w.req.from) {
        Ok(x) => x,
        Err(status) => return w.error(&status).await,
    };
    for (ty, obj) in &initial {
        if !w.event(*ty, obj).await {
            return;
        }
    }
    if w.req.send_initial && !w.bookmark(cursor, true).await {
        return;
    }
    let deadline = w.req.timeout.map(|t| Instant::now() + t);
    let period = w.req.bookmark_interval.max(Duration::from_millis(10));
    let mut bookmarks = tokio::time::interval_at(Instant::now() + period, period);
    // The first pass replays the retained history after `from` without waiting.
    let mut replay = true;
    loop {
        let bookmark_due = if std::mem::take(&mut replay) {
            false
        } else {
            tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = w.tx.closed() => return,
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                false
            }
            _ = bookmarks.tick(), if w.req.bookmarks => true,
            }
        };
        match sim.events_since(&w.req.filter, cursor) {
            Ok((events, next)) => {
                for (ty, obj) in &events {
                    if !w.event(*ty, obj).await {
                        return;
                    }
                }
                cursor = next;
            }
            Err(status) => return w.error(&status).await,
        }
        // A deleted CRD ends the watches on its resources (after their DELETED events),
        // as the real server closes them.
        if !sim.serves(w.req.filter.res) {
            return;
        }
        if bookmark_due && !w.bookmark(cursor, false).await {
            return;
        }
    }
}
