//! Relaying a facade request live through the account's `Relay` stream: the
//! request head (selected headers only, never credentials) and body go down,
//! the response head is awaited (bounded), and the response body streams back
//! to the client chunk by chunk (watches, logs). A client that goes away
//! mid-request gets its request cancelled in the agent.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use spinlink_proto::v1::{self, relay_down};
use tokio::sync::mpsc;

use super::body::{self, Body, BoxError};
use super::route::Query;
use crate::accounts::Account;
use crate::tunnel::relay::RelayHandle;
use spinlink_kube_api::Status;

/// Request headers passed to the agent; everything else (Authorization,
/// cookies, proxy headers) stays here.
pub const FORWARDED_REQUEST_HEADERS: &[&str] =
    &["content-type", "accept", "kubectl-command", "user-agent"];

/// Response headers that describe this hop, not the response.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Cancels the request in the agent unless it finished.
struct CancelGuard {
    handle: RelayHandle,
    id: u64,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            self.handle.cancel(self.id);
        }
    }
}

/// A relayed response body: chunks as the agent sends them.
struct RelayBody {
    rx: mpsc::Receiver<Bytes>,
    guard: CancelGuard,
}

impl HttpBody for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Poll::Ready(None) => {
                this.guard.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.guard.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

fn deadline_millis(query: &Query) -> i64 {
    query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<i64>().ok())
        .filter(|t| *t > 0)
        .map_or(0, |t| {
            chrono::Utc::now().timestamp_millis() + t.saturating_mul(1000)
        })
}

/// Relays `req` (its Kubernetes path `k8s_path`) to the agent.
pub async fn relay<B>(
    account: Arc<Account>,
    req: Request<B>,
    k8s_path: String,
    timeout: Duration,
) -> Response<Body>
where
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
{
    let Some(handle) = account.relay() else {
        return body::status(&Status::unavailable(format!(
            "account {:?} has no relay stream from its agent",
            account.name()
        )));
    };
    let (parts, body) = req.into_parts();
    let raw_query = parts.uri.query().unwrap_or("").to_owned();
    let query = Query::parse(Some(&raw_query));
    let id = account.next_request_id();
    let exchange = handle.register(id);
    let mut guard = CancelGuard {
        handle: handle.clone(),
        id,
        done: false,
    };
    let headers = FORWARDED_REQUEST_HEADERS
        .iter()
        .flat_map(|name| {
            parts.headers.get_all(*name).iter().map(|v| v1::Header {
                name: (*name).to_owned(),
                value: v.as_bytes().to_vec(),
            })
        })
        .collect();
    let end_stream = body.is_end_stream();
    let head = v1::RequestHead {
        id,
        method: parts.method.as_str().to_owned(),
        path: k8s_path,
        query: raw_query,
        headers,
        deadline_unix_millis: deadline_millis(&query),
        end_stream,
    };
    if handle.send(relay_down::Msg::Head(head)).await.is_err() {
        guard.done = true;
        return body::status(&Status::unavailable("the relay stream to the agent closed"));
    }
    if !end_stream {
        tokio::spawn(send_body(handle.clone(), id, body));
    }
    let head = match tokio::time::timeout(timeout, exchange.head).await {
        Err(_) => {
            return body::status(&Status::timeout(format!(
                "the agent did not answer within {}s",
                timeout.as_secs()
            )));
        }
        Ok(Err(_)) => {
            guard.done = true;
            return body::status(&Status::unavailable("the relay stream to the agent closed"));
        }
        Ok(Ok(Err(failure))) => {
            guard.done = true;
            return body::status(&failure);
        }
        Ok(Ok(Ok(head))) => head,
    };
    let mut resp = Response::new(
        RelayBody {
            rx: exchange.body,
            guard,
        }
        .boxed(),
    );
    *resp.status_mut() = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in head.headers {
        let lower = name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lower.as_str()) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(lower.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            resp.headers_mut().append(n, v);
        }
    }
    resp
}

/// Streams the client's request body to the agent as `BodyChunk`s.
async fn send_body<B>(handle: RelayHandle, id: u64, mut body: B)
where
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
{
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let chunk = v1::BodyChunk {
                    id,
                    data: data.to_vec(),
                    end_stream: false,
                };
                if handle.send(relay_down::Msg::Body(chunk)).await.is_err() {
                    return;
                }
            }
            None => {
                let last = v1::BodyChunk {
                    id,
                    data: Vec::new(),
                    end_stream: true,
                };
                let _ = handle.send(relay_down::Msg::Body(last)).await;
                return;
            }
            Some(Err(e)) => {
                tracing::debug!(id, error = %e, "client request body failed; cancelling");
                handle.cancel(id);
                return;
            }
        }
    }
}
