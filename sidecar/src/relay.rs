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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use spinlink_proto::v1::{self, relay_down, relay_up};
use tokio::sync::{mpsc, oneshot};

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

impl Answer {
    fn failed(status: Status) -> Self {
        Self {
            head: Err(status),
            agent: None,
        }
    }
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

/// The facade's handle on an account's relay stream; cheap to clone.
#[derive(Debug, Clone)]
pub struct RelayHandle {
    serial: u64,
    tx: mpsc::Sender<v1::RelayDown>,
    pending: Arc<Mutex<HashMap<u64, Pending>>>,
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
            pending: Arc::default(),
        }
    }

    /// Identifies this stream among the account's successive ones.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers request `id` before its head is sent.
    pub fn register(&self, id: u64) -> Exchange {
        let (head_tx, head) = oneshot::channel();
        let (body_tx, body) = mpsc::channel(DEFAULT_BODY_CAPACITY);
        self.pending().insert(
            id,
            Pending {
                head: Some(head_tx),
                body: body_tx,
            },
        );
        Exchange { head, body }
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

    /// Fails every request still waiting: the stream is gone.
    pub fn fail_all(&self) {
        let drained: Vec<Pending> = self.pending().drain().map(|(_, p)| p).collect();
        for mut p in drained {
            if let Some(tx) = p.head.take() {
                let _ = tx.send(Answer::failed(Status::unavailable(
                    "the relay stream to the agent closed before it answered",
                )));
            }
        }
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
        let mut ex = h.register(1);
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
        let ex = h.register(7);
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
    async fn stream_end_fails_waiting_requests_with_503() {
        let (tx, _rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        let ex = h.register(1);
        h.fail_all();
        assert_eq!(ex.head.await.unwrap().head.unwrap_err().code, 503);
    }

    #[tokio::test]
    async fn dropped_client_and_stalled_client_are_cancelled() {
        let (tx, mut rx) = mpsc::channel(4);
        let h = RelayHandle::new(tx);
        drop(h.register(1));
        h.on_head(head(1));
        let msg = rx.recv().await.unwrap().msg;
        assert_eq!(msg, Some(relay_down::Msg::Cancel(v1::Cancel { id: 1 })));

        let ex = h.register(2);
        h.on_head(head(2));
        for _ in 0..=DEFAULT_BODY_CAPACITY {
            h.on_body(chunk(2, b"x", false));
        }
        let msg = rx.recv().await.unwrap().msg;
        assert_eq!(msg, Some(relay_down::Msg::Cancel(v1::Cancel { id: 2 })));
        assert_eq!(h.in_flight(), 0);
        drop(ex);
    }
}
