//! The relay client: Kubernetes API requests the facade could not answer
//! from the cache go down an account's `Relay` stream to the agent as
//! `RequestHead` + `BodyChunk`s, and the agent's `ResponseHead` +
//! `BodyChunk`s (or `RelayError`) come back up.
//!
//! A [`RelayHandle`] is what an account holds and the facade uses: the
//! sender of `RelayDown` messages and the table of requests waiting for
//! their response. The tunnel reads the stream ([`crate::tunnel`]) and
//! hands every message to [`RelayHandle::deliver`], so it never waits on a
//! client: each request's body goes into its own bounded channel, and a
//! client too slow to drain it has its request cancelled rather than
//! stalling the others.
//!
//! When the account moves to a newer stream (make-before-break), the agent
//! sends `RelayDrain` on the old one: the handle takes no new requests
//! ([`RelayHandle::register`] says so), and once the requests it carries
//! are answered it ends the stream ([`RelayHandle::ended`]), which tells the
//! agent nothing more will come on it. No request is lost to a timer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use spinlink_proto::v1::{self, relay_down, relay_up};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use spinlink_kube_api::Status;

/// Messages queued towards the agent per relay stream.
pub const DEFAULT_DOWN_CAPACITY: usize = 64;
/// Body chunks buffered per relayed response before its client counts as
/// stalled and the request is cancelled.
pub const DEFAULT_BODY_CAPACITY: usize = 256;

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A response head from the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// HTTP status.
    pub status: u16,
    /// Response headers as the API server sent them.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// What a relayed request's head resolves to.
pub type HeadResult = Result<Head, Status>;

/// When the agent took a request and when it had the answer, as the agent's
/// clock read them (`AgentTiming`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentTimes {
    /// The request had arrived whole and the agent began on it.
    pub started: DateTime<Utc>,
    /// The agent had its answer (response head or failure) and sent it up.
    pub finished: DateTime<Utc>,
}

impl AgentTimes {
    /// Reads the wire's timing; `None` when the agent sent none (an agent
    /// older than the field) or nonsense.
    pub fn from_wire(timing: Option<v1::AgentTiming>) -> Option<Self> {
        let t = timing?;
        let started = DateTime::from_timestamp_micros(t.started_unix_micros)?;
        let finished = DateTime::from_timestamp_micros(t.finished_unix_micros)?;
        (t.started_unix_micros > 0 && started <= finished).then_some(Self { started, finished })
    }
}

/// The agent's answer to a relayed request's head: the head or the failure
/// to report, and the agent's timing when it sent one.
#[derive(Debug)]
pub struct Answer {
    /// The response head, or the failure to report.
    pub head: HeadResult,
    /// The agent's part, on its own clock.
    pub agent: Option<AgentTimes>,
}

#[derive(Debug)]
struct Pending {
    head: Option<oneshot::Sender<Answer>>,
    body: mpsc::Sender<Bytes>,
}

/// A relayed request's receiving ends.
#[derive(Debug)]
pub struct Exchange {
    /// Resolves with the response head or the failure to report.
    pub head: oneshot::Receiver<Answer>,
    /// The response body's chunks; closed when the body ends.
    pub body: mpsc::Receiver<Bytes>,
}

/// The requests a stream carries, and whether it still takes new ones.
#[derive(Debug, Default)]
struct Table {
    requests: HashMap<u64, Pending>,
    /// The agent sent `RelayDrain`: no new requests here.
    draining: bool,
    /// The sidecar drains: no new requests here either, and `settled` once
    /// none is left (the stream itself goes on until the sidecar ends it).
    closing: bool,
}

/// The facade's handle on an account's relay stream; cheap to clone.
#[derive(Debug, Clone)]
pub struct RelayHandle {
    serial: u64,
    tx: mpsc::Sender<v1::RelayDown>,
    table: Arc<Mutex<Table>>,
    /// Cancelled when a draining stream has answered everything: the
    /// tunnel then ends the stream towards the agent.
    ended: CancellationToken,
    /// Cancelled when a closing stream has answered everything.
    settled: CancellationToken,
}

/// The table of a stream's requests, locked; ends a draining stream, and
/// settles a closing one, that is left with none when it is let go.
struct Requests<'a> {
    table: std::sync::MutexGuard<'a, Table>,
    handle: &'a RelayHandle,
}

impl std::ops::Deref for Requests<'_> {
    type Target = HashMap<u64, Pending>;
    fn deref(&self) -> &Self::Target {
        &self.table.requests
    }
}

impl std::ops::DerefMut for Requests<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.table.requests
    }
}

impl Drop for Requests<'_> {
    fn drop(&mut self) {
        if self.table.requests.is_empty() {
            if self.table.draining {
                self.handle.ended.cancel();
            }
            if self.table.closing {
                self.handle.settled.cancel();
            }
        }
    }
}

/// The relay stream is gone.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("relay stream closed")]
pub struct Closed;

impl RelayHandle {
    /// A handle sending on `tx`.
    pub fn new(tx: mpsc::Sender<v1::RelayDown>) -> Self {
        Self {
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            tx,
            table: Arc::default(),
            ended: CancellationToken::new(),
            settled: CancellationToken::new(),
        }
    }

    /// Identifies this stream among the account's successive ones.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    fn pending(&self) -> Requests<'_> {
        Requests {
            table: self.table.lock().unwrap_or_else(PoisonError::into_inner),
            handle: self,
        }
    }

    /// Registers request `id` before its head is sent; `None` once the
    /// stream drains (the account has a newer one: send it there) or
    /// closes (the sidecar drains).
    pub fn register(&self, id: u64) -> Option<Exchange> {
        let mut pending = self.pending();
        if pending.table.draining || pending.table.closing {
            return None;
        }
        let (head_tx, head) = oneshot::channel();
        let (body_tx, body) = mpsc::channel(DEFAULT_BODY_CAPACITY);
        pending.insert(
            id,
            Pending {
                head: Some(head_tx),
                body: body_tx,
            },
        );
        Some(Exchange { head, body })
    }

    /// The agent moved the account to a newer stream: take no new requests,
    /// and end this stream once those it carries are answered.
    pub fn drain(&self) {
        self.pending().table.draining = true;
    }

    /// The sidecar drains: take no new requests. The token is cancelled
    /// once every request the stream carries is answered (at once when it
    /// carries none); the stream stays open until the sidecar ends it.
    pub fn close(&self) -> CancellationToken {
        self.pending().table.closing = true;
        self.settled.clone()
    }

    /// Whether the agent said this stream drains.
    #[cfg(test)]
    fn draining(&self) -> bool {
        self.pending().table.draining
    }

    /// Cancelled once a draining stream has answered every request it
    /// carried: the stream towards the agent ends then.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Sends a message to the agent, waiting for room.
    pub async fn send(&self, msg: relay_down::Msg) -> Result<(), Closed> {
        self.tx
            .send(v1::RelayDown { msg: Some(msg) })
            .await
            .map_err(|_| Closed)
    }

    /// Forgets request `id` and tells the agent to stop it. Callable from
    /// `Drop`: it never waits.
    pub fn cancel(&self, id: u64) {
        if self.pending().remove(&id).is_none() {
            return;
        }
        self.send_cancel(id);
    }

    fn send_cancel(&self, id: u64) {
        let msg = v1::RelayDown {
            msg: Some(relay_down::Msg::Cancel(v1::Cancel { id })),
        };
        match self.tx.try_send(msg) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(msg)) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let tx = self.tx.clone();
                    rt.spawn(async move {
                        let _ = tx.send(msg).await;
                    });
                }
            }
        }
    }

    /// How many requests wait for a response (for tests and diagnostics).
    pub fn in_flight(&self) -> usize {
        self.pending().len()
    }

    /// Routes one message of the agent's to the request it answers.
    pub fn deliver(&self, msg: relay_up::Msg) {
        match msg {
            relay_up::Msg::Head(h) => self.on_head(h),
            relay_up::Msg::Body(b) => self.on_body(b),
            relay_up::Msg::Error(e) => self.on_error(e),
            relay_up::Msg::Drain(v1::RelayDrain {}) => self.drain(),
            relay_up::Msg::Heartbeat(_) | relay_up::Msg::Open(_) => {}
        }
    }

    fn on_head(&self, head: v1::ResponseHead) {
        let mut pending = self.pending();
        let Some(p) = pending.get_mut(&head.id) else {
            return;
        };
        let Some(tx) = p.head.take() else {
            tracing::debug!(id = head.id, "second response head ignored");
            return;
        };
        let status = u16::try_from(head.status).unwrap_or(502);
        let answer = Answer {
            head: Ok(Head {
                status,
                headers: head
                    .headers
                    .into_iter()
                    .map(|h| (h.name, h.value))
                    .collect(),
            }),
            agent: AgentTimes::from_wire(head.timing),
        };
        if tx.send(answer).is_err() {
            // The client went away while the agent was answering.
            pending.remove(&head.id);
            drop(pending);
            self.send_cancel(head.id);
        }
    }

    fn on_body(&self, chunk: v1::BodyChunk) {
        let mut pending = self.pending();
        let Some(p) = pending.get_mut(&chunk.id) else {
            return;
        };
        if !chunk.data.is_empty() {
            match p.body.try_send(Bytes::from(chunk.data)) {
                Ok(()) => {}
                Err(e) => {
                    if matches!(e, mpsc::error::TrySendError::Full(_)) {
                        tracing::warn!(
                            id = chunk.id,
                            "relayed response not read fast enough; cancelled"
                        );
                    }
                    pending.remove(&chunk.id);
                    drop(pending);
                    self.send_cancel(chunk.id);
                    return;
                }
            }
        }
        if chunk.end_stream {
            // Dropping the sender ends the client's body.
            pending.remove(&chunk.id);
        }
    }

    fn on_error(&self, error: v1::RelayError) {
        let Some(mut p) = self.pending().remove(&error.id) else {
            return;
        };
        tracing::debug!(id = error.id, status = error.status, message = %error.message, "relayed request failed in the agent");
        if let Some(tx) = p.head.take() {
            let _ = tx.send(Answer {
                head: Err(Status::from_code(error.status, error.message)),
                agent: AgentTimes::from_wire(error.timing),
            });
        }
        // With a head already sent, dropping the sender ends the body.
    }

    /// Lets go of every request still waiting: the stream is gone. Their
    /// heads' senders drop, which tells the facade the stream closed before
    /// it answered (a read may then go again on the account's next stream).
    pub fn fail_all(&self) {
        // Taken out under the lock, dropped (waking their requests) after it.
        let drained: Vec<Pending> = self.pending().drain().map(|(_, p)| p).collect();
        drop(drained);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(id: u64) -> v1::ResponseHead {
        v1::ResponseHead {
            id,
            status: 201,
            headers: vec![v1::Header {
                name: "content-type".into(),
                value: b"application/json".to_vec(),
            }],
            timing: Some(v1::AgentTiming {
                started_unix_micros: 1_700_000_000_000_000,
                finished_unix_micros: 1_700_000_000_002_500,
            }),
        }
    }

    fn chunk(id: u64, data: &[u8], end: bool) -> v1::BodyChunk {
        v1::BodyChunk {
            id,
            data: data.to_vec(),
            end_stream: end,
        }
    }

    #[tokio::test]
    async fn head_then_body_then_end() {
        let (tx, _rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        let mut ex = h.register(1).unwrap();
        h.on_head(head(1));
        h.on_body(chunk(1, b"ab", false));
        h.on_body(chunk(1, b"cd", true));
        let got = ex.head.await.unwrap();
        let agent = got.agent.unwrap();
        assert_eq!(
            agent.finished - agent.started,
            chrono::Duration::microseconds(2500)
        );
        assert_eq!(got.head.unwrap().status, 201);
        assert_eq!(ex.body.recv().await.unwrap(), "ab");
        assert_eq!(ex.body.recv().await.unwrap(), "cd");
        assert!(ex.body.recv().await.is_none());
        assert_eq!(h.in_flight(), 0);
    }

    #[tokio::test]
    async fn error_before_head_becomes_a_failure() {
        let (tx, _rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        let ex = h.register(7).unwrap();
        h.on_error(v1::RelayError {
            id: 7,
            status: 0,
            message: "api server unreachable".into(),
            timing: None,
        });
        let answer = ex.head.await.unwrap();
        assert_eq!(answer.agent, None, "an older agent reports no timing");
        let f = answer.head.unwrap_err();
        assert_eq!(f.code, 502);
        assert_eq!(f.message, "api server unreachable");
    }

    #[tokio::test]
    async fn stream_end_lets_go_of_waiting_requests() {
        let (tx, _rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        let ex = h.register(1).unwrap();
        h.fail_all();
        assert!(ex.head.await.is_err(), "the head's sender is gone");
        assert_eq!(h.in_flight(), 0);
    }

    #[tokio::test]
    async fn dropped_client_and_stalled_client_are_cancelled() {
        let (tx, mut rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        drop(h.register(1).unwrap());
        h.on_head(head(1));
        let msg = rx.recv().await.unwrap().msg;
        assert_eq!(msg, Some(relay_down::Msg::Cancel(v1::Cancel { id: 1 })));

        let ex = h.register(2).unwrap();
        h.on_head(head(2));
        for _ in 0..=DEFAULT_BODY_CAPACITY {
            h.on_body(chunk(2, b"x", false));
        }
        let msg = rx.recv().await.unwrap().msg;
        assert_eq!(msg, Some(relay_down::Msg::Cancel(v1::Cancel { id: 2 })));
        assert_eq!(h.in_flight(), 0);
        drop(ex);
    }

    #[tokio::test]
    async fn a_draining_stream_takes_no_new_request_and_ends_once_answered() {
        let (tx, _rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        let mut ex = h.register(1).unwrap();
        h.deliver(relay_up::Msg::Drain(v1::RelayDrain {}));
        assert!(h.draining());
        assert!(
            h.register(2).is_none(),
            "a draining stream takes no request"
        );
        assert!(!h.ended().is_cancelled(), "request 1 is still in flight");
        h.on_head(head(1));
        h.on_body(chunk(1, b"ab", false));
        assert!(!h.ended().is_cancelled(), "its body is still coming");
        h.on_body(chunk(1, b"", true));
        assert!(h.ended().is_cancelled());
        assert_eq!(ex.head.await.unwrap().head.unwrap().status, 201);
        assert_eq!(ex.body.recv().await.unwrap(), "ab");
        assert!(ex.body.recv().await.is_none());
    }

    #[tokio::test]
    async fn a_closing_stream_takes_no_new_request_and_settles_once_answered() {
        let (tx, _rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        let ex = h.register(1).unwrap();
        let settled = h.close();
        assert!(h.register(2).is_none(), "a closing stream takes no request");
        assert!(!settled.is_cancelled(), "request 1 is still in flight");
        h.on_head(head(1));
        assert!(!settled.is_cancelled(), "its body is still coming");
        h.on_body(chunk(1, b"", true));
        assert!(settled.is_cancelled());
        assert!(
            !h.ended().is_cancelled(),
            "the stream itself ends with the sidecar, not when settled"
        );
        drop(ex);

        let (tx, _rx) = mpsc::channel(4);
        let idle = RelayHandle::new(tx);
        assert!(
            idle.close().is_cancelled(),
            "nothing in flight: settled at once"
        );
    }

    #[tokio::test]
    async fn an_idle_stream_ends_when_it_drains_and_a_busy_one_only_when_drained() {
        let (tx, _rx) = mpsc::channel(4);
        let idle = RelayHandle::new(tx.clone());
        idle.drain();
        // Nothing in flight: it ends at once.
        assert_eq!(idle.in_flight(), 0);
        assert!(idle.ended().is_cancelled());

        let busy = RelayHandle::new(tx);
        let _ex = busy.register(1).unwrap();
        busy.on_head(head(1));
        assert!(
            !busy.ended().is_cancelled(),
            "not draining: never ends by itself"
        );
        busy.on_body(chunk(1, b"", true));
        assert!(
            !busy.ended().is_cancelled(),
            "not draining: never ends by itself"
        );
    }
}
