//! An account's `Cache` stream: `open` at once, then the discovery snapshot,
//! then every watched kind ([`watch`]) and heartbeats. Every message carries
//! the account's next sequence number, which keeps counting across streams.
//! What the sidecar sends back (acks, resync, resume points) is read and, in
//! this version, only logged — but it is always drained.

pub mod watch;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use spinlink_proto::v1::{self, CacheUp, cache_down, cache_up};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, trace, warn};

use crate::backoff::Backoff;
use crate::cluster::Cluster;
use crate::connection::session::Session;
use crate::connection::stream_request;
use crate::kinds::FIXED_KINDS;
use crate::{Error, Result};

/// Messages queued for the cache stream before the watches wait.
pub const DEFAULT_CACHE_QUEUE: usize = 256;
/// First retry delay cap of a failed discovery fetch.
pub const DISCOVERY_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Largest retry delay cap of a failed discovery fetch.
pub const DISCOVERY_RETRY_MAX: Duration = Duration::from_secs(30);

const STREAM: &str = "cache";

/// Settings of one cache stream.
#[derive(Debug, Clone)]
pub struct CacheSettings {
    /// Interval of heartbeats.
    pub heartbeat: Duration,
    /// The account's sequence counter (last number used), shared across
    /// streams so numbers keep increasing after a reconnect.
    pub seq: Arc<AtomicU64>,
}

/// Opens the account's cache stream on the session's connection and feeds it
/// until the stream fails. `on_synced` runs once, when every kind has
/// finished its first listing.
pub async fn run(
    session: &Session,
    cluster: &Cluster,
    settings: CacheSettings,
    on_synced: impl FnOnce() + Send,
) -> Result<Infallible> {
    let account = cluster.account.clone();
    let (tx, rx) = mpsc::channel(DEFAULT_CACHE_QUEUE);
    // Queued before the call: the first message leaves with the stream.
    let open = cache_up::Msg::Open(v1::CacheOpen {
        account: account.clone(),
        agent_id: session.agent_id().to_owned(),
    });
    tx.send(open)
        .await
        .map_err(|_| Error::Task("cache queue closed".into()))?;
    let seq = settings.seq.clone();
    // Numbers are taken as tonic pulls messages, so they go out in order.
    let outbound = ReceiverStream::new(rx).map(move |msg| CacheUp {
        seq: seq.fetch_add(1, Ordering::SeqCst) + 1,
        msg: Some(msg),
    });
    let token = session.token(&account).await?;
    let request = stream_request(outbound, &account, &token)?;
    let mut inbound = session
        .client()
        .cache(request)
        .await
        .map_err(|source| Error::OpenStream {
            account: account.clone(),
            stream: STREAM,
            source,
        })?
        .into_inner();
    info!(%account, "cache stream open");

    let (synced_tx, mut synced_rx) = mpsc::channel(FIXED_KINDS.len());
    let mut tasks = JoinSet::new();
    tasks.spawn(produce(cluster.clone(), tx.clone(), synced_tx));
    tasks.spawn(heartbeat(tx, settings.heartbeat));

    let mut on_synced = Some(on_synced);
    let mut synced = BTreeSet::new();
    loop {
        tokio::select! {
            down = inbound.message() => match down {
                Ok(Some(down)) => log_down(&account, down),
                Ok(None) => return Err(Error::StreamClosed { account, stream: STREAM }),
                Err(source) => return Err(Error::StreamFailed { account, stream: STREAM, source }),
            },
            Some(kind) = synced_rx.recv() => {
                synced.insert(kind);
                if synced.len() == FIXED_KINDS.len()
                    && let Some(f) = on_synced.take()
                {
                    info!(%account, "all kinds synced");
                    f();
                }
            }
        }
    }
}

fn log_down(account: &str, down: v1::CacheDown) {
    match down.msg {
        Some(cache_down::Msg::Ack(ack)) => trace!(%account, seq = ack.seq, "ack"),
        Some(cache_down::Msg::Resync(r)) => {
            // Later work: list again. For now a reconnect does it.
            warn!(%account, kinds = r.kinds.len(), "resync requested, not supported yet");
        }
        Some(cache_down::Msg::Resume(r)) => {
            debug!(%account, kinds = r.kinds.len(), "resume points received, not used yet");
        }
        Some(cache_down::Msg::Heartbeat(_)) => trace!(%account, "heartbeat from sidecar"),
        None => {}
    }
}

/// Discovery first (retried until it works), then one watch per kind.
async fn produce(cluster: Cluster, tx: mpsc::Sender<cache_up::Msg>, synced: watch::SyncedTx) {
    let mut backoff = Backoff::new(DISCOVERY_RETRY_INITIAL, DISCOVERY_RETRY_MAX);
    loop {
        match cluster.discovery().await {
            Ok(snapshot) => {
                debug!(account = %cluster.account, documents = snapshot.documents.len(), "discovery snapshot");
                if tx.send(cache_up::Msg::Discovery(snapshot)).await.is_err() {
                    return;
                }
                break;
            }
            Err(e) => {
                warn!(account = %cluster.account, error = %e, "discovery failed, retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
    let mut watches = JoinSet::new();
    for kind in FIXED_KINDS {
        watches.spawn(watch::watch_kind(
            cluster.client.clone(),
            cluster.account.clone(),
            kind,
            tx.clone(),
            synced.clone(),
        ));
    }
    while watches.join_next().await.is_some() {}
}

async fn heartbeat(tx: mpsc::Sender<cache_up::Msg>, period: Duration) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate
    loop {
        ticks.tick().await;
        let beat = cache_up::Msg::Heartbeat(v1::Heartbeat {
            unix_millis: unix_millis(),
        });
        if tx.send(beat).await.is_err() {
            return;
        }
    }
}

pub(crate) fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
