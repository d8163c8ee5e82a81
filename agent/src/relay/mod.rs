//! An account's `Relay` stream: the sidecar sends Kubernetes API requests
//! (head, body chunks, cancel), the agent checks each against the account's
//! relay policy ([`crate::policy`]), runs it in its own task against the API server
//! ([`execute`]) and streams the response back.

pub mod execute;

use std::collections::HashMap;
use std::sync::Arc;

use spinlink_proto::v1::{self, RelayUp, relay_down, relay_up};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{AbortHandle, JoinSet};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cluster::Cluster;
use crate::connection::session::Session;
use crate::connection::stream_request;
use crate::metrics::Metrics;
use crate::{Error, Result};

/// Relayed requests running at once per account; more are refused with 429.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// Messages queued for the relay stream before request tasks wait.
pub const DEFAULT_RELAY_QUEUE: usize = 256;
/// Largest request body accepted (the API server's own limit is 3 MiB).
pub const MAX_REQUEST_BODY: usize = 16 * 1024 * 1024;

const STREAM: &str = "relay";

/// A request whose body is still arriving.
struct Pending {
    head: v1::RequestHead,
    body: Vec<u8>,
}

/// Opens the account's relay stream on the session's connection and serves
/// requests until the stream fails, or, once `drain` is cancelled (the
/// account moved to a new connection), until the sidecar ends it: the agent
/// sends `RelayDrain`, the sidecar sends new requests to the newest stream
/// and ends this one once it has the answers to every request it sent here,
/// those still on their way included. No timer decides that a request will
/// not come (a sidecar too old to know `RelayDrain` leaves the stream to the
/// connection's drain deadline). `opened` is told when the sidecar has the
/// stream (it sends new requests to the newest stream). Every request is
/// counted in `metrics` by verb and outcome.
pub async fn run(
    session: &Session,
    cluster: &Cluster,
    metrics: &Metrics,
    drain: CancellationToken,
    opened: tokio::sync::watch::Sender<bool>,
) -> Result<()> {
    let account = cluster.account.clone();
    let (tx, rx) = mpsc::channel(DEFAULT_RELAY_QUEUE);
    let open = RelayUp {
        msg: Some(relay_up::Msg::Open(v1::RelayOpen {
            account: account.clone(),
            agent_id: session.agent_id().to_owned(),
        })),
    };
    // Queued before the call: the first message leaves with the stream.
    tx.send(open)
        .await
        .map_err(|_| Error::Task("relay queue closed".into()))?;
    let token = session.token(&account).await?;
    let request = stream_request(ReceiverStream::new(rx), &account, &token)?;
    let mut inbound = session
        .client()
        .relay(request)
        .await
        .map_err(|source| Error::OpenStream {
            account: account.clone(),
            stream: STREAM,
            source,
        })?
        .into_inner();
    info!(%account, "relay stream open");
    // The response headers came back: the sidecar attached the stream.
    opened.send_replace(true);

    let limit = Arc::new(Semaphore::new(DEFAULT_MAX_IN_FLIGHT));
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut running: HashMap<u64, AbortHandle> = HashMap::new();
    let mut tasks: JoinSet<u64> = JoinSet::new();

    loop {
        let draining = drain.is_cancelled();
        let down = tokio::select! {
            down = inbound.message() => down,
            Some(done) = tasks.join_next() => {
                if let Ok(id) = done {
                    running.remove(&id);
                }
                continue;
            }
            () = drain.cancelled(), if !draining => {
                let drain = RelayUp {
                    msg: Some(relay_up::Msg::Drain(v1::RelayDrain {})),
                };
                if tx.send(drain).await.is_err() {
                    return Err(Error::StreamClosed {
                        account,
                        stream: STREAM,
                    });
                }
                info!(%account, in_flight = running.len() + pending.len(), "relay stream draining");
                continue;
            }
        };
        let msg = match down {
            Ok(Some(v1::RelayDown { msg: Some(msg) })) => msg,
            Ok(Some(v1::RelayDown { msg: None })) => continue,
            Ok(None) if draining => {
                info!(%account, "relay stream drained");
                return Ok(());
            }
            Ok(None) => {
                return Err(Error::StreamClosed {
                    account,
                    stream: STREAM,
                });
            }
            Err(source) => {
                return Err(Error::StreamFailed {
                    account,
                    stream: STREAM,
                    source,
                });
            }
        };
        let ready = match msg {
            relay_down::Msg::Head(head) if head.end_stream => Some((head, Vec::new())),
            relay_down::Msg::Head(head) => {
                pending.insert(
                    head.id,
                    Pending {
                        head,
                        body: Vec::new(),
                    },
                );
                None
            }
            relay_down::Msg::Body(chunk) => {
                let Some(p) = pending.get_mut(&chunk.id) else {
                    debug!(%account, id = chunk.id, "body chunk for unknown request");
                    continue;
                };
                if p.body.len() + chunk.data.len() > MAX_REQUEST_BODY {
                    pending.remove(&chunk.id);
                    let now = execute::unix_micros();
                    let error = execute::error(chunk.id, 413, "request body too large", now);
                    if tx.send(error).await.is_err() {
                        return Err(Error::StreamClosed {
                            account,
                            stream: STREAM,
                        });
                    }
                    continue;
                }
                p.body.extend_from_slice(&chunk.data);
                if chunk.end_stream {
                    pending.remove(&chunk.id).map(|p| (p.head, p.body))
                } else {
                    None
                }
            }
            relay_down::Msg::Cancel(cancel) => {
                pending.remove(&cancel.id);
                if let Some(task) = running.remove(&cancel.id) {
                    debug!(%account, id = cancel.id, "request cancelled");
                    task.abort();
                }
                None
            }
            relay_down::Msg::Heartbeat(_) => None,
        };
        let Some((head, body)) = ready else {
            continue;
        };
        let started = execute::unix_micros();
        let id = head.id;
        let verb = match cluster.policy.check(&head.method, &head.path, &head.query) {
            Ok(target) => target.verb,
            Err((target, denied)) => {
                info!(%account, id, verb = %target.verb, path = %head.path, reason = %denied.message, "relayed request denied");
                metrics.relay(&account, &target.verb, "denied");
                if send_status(&tx, id, &denied, started).await.is_err() {
                    return Err(Error::StreamClosed {
                        account,
                        stream: STREAM,
                    });
                }
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            metrics.relay(&account, &verb, "busy");
            warn!(%account, id, "too many relayed requests in flight");
            let error =
                execute::error(id, 429, "too many requests in flight at the agent", started);
            if tx.send(error).await.is_err() {
                return Err(Error::StreamClosed {
                    account,
                    stream: STREAM,
                });
            }
            continue;
        };
        metrics.relay(&account, &verb, "relayed");
        let client = cluster.client.clone();
        let tx = tx.clone();
        let options = execute::Options {
            scrub_secrets: !cluster.policy.reads_secrets(),
            impersonate: cluster.impersonate.clone(),
        };
        let row = metrics
            .operations
            .register(crate::activity::operations::Operation {
                id: format!("{account}:{id}"),
                account: account.clone(),
                verb: verb.clone(),
                method: head.method.clone(),
                path: head.path.clone(),
                started_unix_millis: started / 1000,
            });
        let task = tasks.spawn(async move {
            let _permit = permit;
            // Listed in `/operations` until the request ends or is aborted.
            let _row = row;
            execute::execute(client, head, body, started, options, tx).await;
            id
        });
        if let Some(old) = running.insert(id, task) {
            // The sidecar reused a live id: the old request is abandoned.
            old.abort();
        }
    }
}

/// Answers request `id`, taken at `started`, with the policy's
/// `metav1.Status`.
async fn send_status(
    tx: &mpsc::Sender<RelayUp>,
    id: u64,
    denied: &crate::policy::Denied,
    started: i64,
) -> Result<(), mpsc::error::SendError<RelayUp>> {
    let head = RelayUp {
        msg: Some(relay_up::Msg::Head(v1::ResponseHead {
            id,
            status: u32::from(denied.code),
            headers: vec![v1::Header {
                name: "content-type".into(),
                value: b"application/json".to_vec(),
            }],
            timing: execute::timing(started),
        })),
    };
    tx.send(head).await?;
    let body = RelayUp {
        msg: Some(relay_up::Msg::Body(v1::BodyChunk {
            id,
            data: denied.status_body(),
            end_stream: true,
        })),
    };
    tx.send(body).await
}
