//! Relaying a facade request live through the account's `Relay` stream: the
//! request head (selected headers only, never credentials) and body go down,
//! the response head is awaited (bounded), and the response body streams back
//! to the client chunk by chunk (watches, logs). A client that goes away
//! mid-request gets its request cancelled in the agent.
//!
//! A successful write to a cached kind is answered only after its response
//! object is folded into the cache ([`crate::cache::Cache::fold_write`]), so
//! the writer's next read sees it (read-your-writes). The answer is read in
//! whichever encoding the API server wrote it, JSON or protobuf (kubectl
//! 1.32+ creates in protobuf), and passed on to the client as it came: the
//! client gets the API server's own bytes. Every relayed request is
//! recorded in the store's journal ([`crate::accounts::journal`]) with the
//! time of each hop.

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

use super::route::{Query, ResourcePath};
use crate::accounts::{Account, Operation, Outcome};
use crate::cache::KindKey;
use crate::http::body::{self, Body, BoxError};
use crate::ownership;
use crate::relay::RelayHandle;
use spinlink_kube_api::{Status, protobuf};

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

/// Largest write response buffered to fold into the cache; a larger one
/// streams through unfolded (the watch brings it a moment later).
pub const FOLD_LIMIT: usize = 8 * 1024 * 1024;

/// A relayed response body: chunks as the agent sends them, after `prefix`.
struct RelayBody {
    prefix: Option<Bytes>,
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
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
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
        self.prefix.is_none() && self.guard.done
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

/// The cached kind a write to `path` changes, if its answer is the object.
fn folded_kind(account: &Account, method: &http::Method, path: &str) -> Option<KindKey> {
    if !matches!(
        *method,
        http::Method::POST | http::Method::PUT | http::Method::PATCH | http::Method::DELETE
    ) {
        return None;
    }
    let rp = ResourcePath::parse(path)?;
    // Collection POSTs answer with the new object; `status` with the whole
    // object; other subresources (scale, eviction) with something else.
    let whole = rp.subresource.is_empty() || rp.subresource == ["status"];
    let named = rp.name.is_some() || *method == http::Method::POST;
    if !(whole && named) {
        return None;
    }
    account
        .read_cache()
        .kind(&rp.group, &rp.version, &rp.resource)?;
    Some(KindKey {
        group: rp.group,
        version: rp.version,
        resource: rp.resource,
    })
}

/// Finishes the operation record and keeps it in the account's history.
fn record(
    account: &Account,
    mut op: Operation,
    status: u16,
    outcome: Outcome,
    message: Option<String>,
) {
    op.answered = Some(chrono::Utc::now());
    op.status = status;
    op.outcome = outcome;
    op.message = message;
    account.record_operation(&op);
}

/// Records a request the facade refused without relaying it.
pub fn record_refusal<B>(account: &Account, req: &Request<B>, k8s_path: &str, status: &Status) {
    let now = chrono::Utc::now();
    account.record_operation(&Operation {
        id: account.next_request_id(),
        instance: String::new(),
        method: req.method().as_str().to_owned(),
        path: k8s_path.to_owned(),
        query: req.uri().query().unwrap_or_default().to_owned(),
        kubectl_command: req
            .headers()
            .get("kubectl-command")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        received: now,
        sent_to_agent: None,
        agent_started: None,
        agent_finished: None,
        answered: Some(now),
        status: status.code,
        outcome: Outcome::Refused,
        message: Some(status.message.clone()),
    });
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
    let (parts, body) = req.into_parts();
    let raw_query = parts.uri.query().unwrap_or("").to_owned();
    let id = account.next_request_id();
    let op = Operation {
        id,
        instance: String::new(),
        method: parts.method.as_str().to_owned(),
        path: k8s_path.clone(),
        query: raw_query.clone(),
        kubectl_command: parts
            .headers
            .get("kubectl-command")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        received: chrono::Utc::now(),
        sent_to_agent: None,
        agent_started: None,
        agent_finished: None,
        answered: None,
        status: 0,
        outcome: Outcome::Answered,
        message: None,
    };
    let fail = |account: &Account, op: Operation, outcome: Outcome, status: Status| {
        record(
            account,
            op,
            status.code,
            outcome,
            Some(status.message.clone()),
        );
        body::status(&status)
    };
    let fold = folded_kind(&account, &parts.method, &k8s_path);
    let query = Query::parse(Some(&raw_query));
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
    // A read with no body changed nothing, so when its stream closes before
    // any answer (the agent's connection or its gateway went away) it goes
    // again on the account's next stream, once, within its timeout. A write
    // is never sent twice: the agent may have applied it.
    let resend = end_stream && matches!(parts.method, http::Method::GET | http::Method::HEAD);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut body = Some(body);
    let mut closed: Option<u64> = None;
    let mut op = op;
    let (answer, sent, exchange_body, mut guard) = loop {
        let wait_until = match closed {
            None => deadline,
            Some(_) => deadline.min(tokio::time::Instant::now() + RESEND_WAIT),
        };
        let Some((handle, exchange)) = exchange_on(&account, id, closed, wait_until).await else {
            if account.relays_closing().is_cancelled() {
                // Nothing went to the agent: the client may send it again,
                // to the account's next owner.
                let status = Status::unavailable(format!(
                    "this sidecar is draining; account {:?} is moving to another; retry",
                    account.name()
                ))
                .retry_after(1);
                let mut resp = fail(&account, op, Outcome::Unavailable, status);
                ownership::mark_retryable(&mut resp);
                return resp;
            }
            let status = match closed {
                None => Status::unavailable(format!(
                    "account {:?} has no relay stream from its agent",
                    account.name()
                )),
                Some(_) => Status::unavailable(CLOSED_BEFORE_ANSWER),
            };
            return fail(&account, op, Outcome::Unavailable, status);
        };
        let mut guard = CancelGuard {
            handle: handle.clone(),
            id,
            done: false,
        };
        // Stamped before the send: the wait for room in the stream is part
        // of the trip to the agent, and the agent cannot start before this.
        let sent = chrono::Utc::now();
        if handle
            .send(relay_down::Msg::Head(head.clone()))
            .await
            .is_ok()
        {
            op.sent_to_agent = Some(sent);
            if let Some(body) = body.take().filter(|_| !end_stream) {
                tokio::spawn(send_body(handle.clone(), id, body));
            }
            match tokio::time::timeout_at(deadline, exchange.head).await {
                Err(_) => {
                    let status = Status::timeout(format!(
                        "the agent did not answer within {}s",
                        timeout.as_secs()
                    ));
                    return fail(&account, op, Outcome::Timeout, status);
                }
                Ok(Ok(answer)) => break (answer, sent, exchange.body, guard),
                Ok(Err(_)) => {} // the stream closed before it answered
            }
        }
        guard.done = true;
        if !resend || closed.is_some() {
            let status = Status::unavailable(CLOSED_BEFORE_ANSWER);
            return fail(&account, op, Outcome::Unavailable, status);
        }
        tracing::debug!(
            account = account.name(),
            id,
            "relay stream closed before the answer; sending the read again"
        );
        closed = Some(handle.serial());
    };
    if let Some(agent) = answer.agent {
        op.place_agent_part(sent, chrono::Utc::now(), agent);
    }
    let head = match answer.head {
        Err(failure) => {
            guard.done = true;
            return fail(&account, op, Outcome::Failed, failure);
        }
        Ok(head) => head,
    };
    let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut rx = exchange_body;
    let mut prefix = None;
    if let Some(kind) = fold.filter(|_| status.is_success()) {
        let (bytes, complete) = collect(&mut rx, FOLD_LIMIT).await;
        if complete {
            guard.done = true;
            let content_type = head
                .headers
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
                .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
                .unwrap_or_default();
            fold_into_cache(&account, &kind, &bytes, &content_type, &parts.method);
        }
        prefix = Some(bytes);
    }
    record(&account, op, status.as_u16(), Outcome::Answered, None);
    let mut resp = Response::new(
        RelayBody {
            prefix: prefix.filter(|p| !p.is_empty()),
            rx,
            guard,
        }
        .boxed(),
    );
    *resp.status_mut() = status;
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

/// What a request whose relay stream closed before it answered fails with.
pub const CLOSED_BEFORE_ANSWER: &str = "the relay stream to the agent closed before it answered";

/// How long a read whose relay stream closed under it waits for the agent's
/// next stream (within its own timeout): an agent whose gateway went away is
/// back through another one in well under this.
pub const RESEND_WAIT: Duration = Duration::from_secs(5);

/// Registers request `id` on the account's newest relay stream, unless that
/// is the stream `closed` (which closed under it: then wait, until
/// `wait_until`, for the agent's next one). A stream that drains takes no new
/// request; the tunnel detaches it at once, so the next look finds the one
/// that replaced it. `None` when there is no stream to use, or once the
/// sidecar drains ([`Account::relays_closing`]).
async fn exchange_on(
    account: &Account,
    id: u64,
    closed: Option<u64>,
    wait_until: tokio::time::Instant,
) -> Option<(RelayHandle, crate::relay::Exchange)> {
    let mut changes = account.changes();
    let closing = account.relays_closing();
    loop {
        if closing.is_cancelled() {
            return None;
        }
        let newest = account.relay().filter(|h| Some(h.serial()) != closed);
        match newest {
            Some(handle) => {
                if let Some(exchange) = handle.register(id) {
                    return Some((handle, exchange));
                }
            }
            // No stream at all: fail at once, as a request that finds the
            // agent away does; a resend waits for the agent to come back.
            None if closed.is_none() => return None,
            None => {}
        }
        tokio::select! {
            changed = tokio::time::timeout_at(wait_until, changes.changed()) => match changed {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return None,
            },
            () = closing.cancelled() => return None,
        }
    }
}

/// Reads the body until it ends or passes `limit`; returns what was read
/// and whether it was all of it.
async fn collect(rx: &mut mpsc::Receiver<Bytes>, limit: usize) -> (Bytes, bool) {
    let mut buf = bytes::BytesMut::new();
    while buf.len() <= limit {
        match rx.recv().await {
            Some(chunk) => buf.extend_from_slice(&chunk),
            None => return (buf.freeze(), true),
        }
    }
    (buf.freeze(), false)
}

/// Folds a write's answer into the cache (see the module docs). An answer
/// that does not decode (a kind with no protobuf schema here) is not
/// folded; the watch brings the object a moment later.
fn fold_into_cache(
    account: &Account,
    kind: &KindKey,
    body: &[u8],
    content_type: &str,
    method: &http::Method,
) {
    let decoded = if protobuf::is_media_type(content_type) {
        protobuf::decode(body).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice::<serde_json::Value>(body).map_err(|e| e.to_string())
    };
    let object = match decoded {
        Ok(object) => object,
        Err(error) => {
            tracing::debug!(%error, content_type, "a write's answer was not folded into the cache");
            return;
        }
    };
    // A Status (some DELETEs answer one) names no object to fold.
    if object.get("kind").and_then(|k| k.as_str()) == Some("Status") {
        return;
    }
    // A DELETE answered with the object leaves it in place while finalizers
    // run or its grace period does (a pod stops its containers first); the
    // watch brings its removal. Only an object with neither is gone now.
    let meta = &object["metadata"];
    let finalizing = meta["finalizers"].as_array().is_some_and(|f| !f.is_empty());
    let terminating = meta["deletionGracePeriodSeconds"]
        .as_i64()
        .is_some_and(|g| g > 0);
    let pending = meta.get("deletionTimestamp").is_some() && (finalizing || terminating);
    let gone = *method == http::Method::DELETE && !pending;
    account.write_cache().fold_write(kind, &object, gone);
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
