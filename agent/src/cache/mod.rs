//! An account's `Cache` stream.
//!
//! The stream opens with `open`, numbered with the last acknowledged sequence
//! number, and replays the account's unacknowledged messages ([`outbox`])
//! before anything new. The agent then waits briefly for the sidecar's
//! `ResumeFrom`, and [`Watches`] runs discovery (again every
//! `cache.discoveryIntervalSeconds`) and one list/watch loop per discovered
//! kind ([`watch`]), resuming kinds the sidecar holds instead of listing
//! them. Down the stream come acks (which free the window), resync requests
//! (which make kinds list again) and heartbeats.

pub mod health;
pub mod outbox;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use spinlink_proto::v1::{self, CacheUp, cache_down, cache_up};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::{AbortHandle, JoinSet};
use tracing::{debug, info, trace, warn};

use crate::backoff::Backoff;
use crate::cluster::Cluster;
use crate::connection::session::Session;
use crate::connection::stream_request;
use crate::kinds::{self, KindFilter, WatchedKind};
use crate::metrics::{AccountLabels, Metrics};
use crate::{Error, Result};
use outbox::Outbox;
use watch::{KindWatch, Report, Start, WatchContext};

/// First retry delay cap of a failed discovery fetch.
pub const DISCOVERY_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Largest retry delay cap of a failed discovery fetch.
pub const DISCOVERY_RETRY_MAX: Duration = Duration::from_secs(30);
/// Resync requests queued for the watches.
pub const RESYNC_QUEUE: usize = 16;
/// Reports of finished first listings queued.
pub const REPORT_QUEUE: usize = 64;

const STREAM: &str = "cache";

/// Settings of one account's cache streams.
#[derive(Debug, Clone)]
pub struct CacheSettings {
    /// Interval of heartbeats.
    pub heartbeat: Duration,
    /// The account's window of unacknowledged messages; it outlives streams.
    pub outbox: Arc<Outbox>,
    /// Which kinds and namespaces are watched.
    pub filter: KindFilter,
    /// `limit` of list pages.
    pub page_size: u32,
    /// Interval of discovery refreshes.
    pub discovery_interval: Duration,
    /// How long to wait for `ResumeFrom` when a stream opens.
    pub resume_wait: Duration,
    /// Agent-wide list budget.
    pub total_budget: Arc<Semaphore>,
    /// The account's list budget.
    pub account_budget: Arc<Semaphore>,
    /// Counters.
    pub metrics: Metrics,
}

/// The `group/version/resource` key of a wire kind.
fn gvr(kind: &v1::Kind) -> String {
    format!("{}/{}/{}", kind.group, kind.version, kind.resource)
}

/// Opens the account's cache stream on the session's connection and feeds it
/// until the stream fails. `on_synced` runs once, when every discovered kind
/// has finished its first listing (or resumed, or was found not listable).
pub async fn run(
    session: &Session,
    cluster: &Cluster,
    settings: CacheSettings,
    on_synced: impl FnOnce() + Send + 'static,
) -> Result<Infallible> {
    let account = cluster.account.clone();
    let outbox = settings.outbox.clone();
    let baseline = outbox.acked();
    // `open` carries the last acknowledged number, so the sidecar sees the
    // replayed window continue without a gap.
    let open = CacheUp {
        seq: baseline,
        msg: Some(cache_up::Msg::Open(v1::CacheOpen {
            account: account.clone(),
            agent_id: session.agent_id().to_owned(),
            ca_fingerprint: cluster.ca_fingerprint.clone(),
            namespaces: cluster.filter.namespaces.clone(),
            omit_namespaces: cluster.filter.omit_namespaces.clone(),
            reports_synced: true,
            reads_as: cluster.impersonate.as_ref().map(|imp| v1::Identity {
                user: imp.0.clone(),
                groups: imp.1.clone(),
            }),
        })),
    };
    // The request body is polled by the connection, not by this future:
    // it must end when this future is dropped (the account moved to a new
    // connection or was removed), or it would keep the stream — and the
    // connection — open.
    let ended = tokio_util::sync::CancellationToken::new();
    let _end_on_drop = ended.clone().drop_guard();
    let outbound = futures::stream::iter([open])
        .chain(outbox.clone().stream_from(baseline))
        .take_until(ended.cancelled_owned());
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
    info!(%account, replay = outbox.unacked(), "cache stream open");
    let closed = |account: String| Error::StreamClosed {
        account,
        stream: STREAM,
    };
    let failed = |account: String, source| Error::StreamFailed {
        account,
        stream: STREAM,
        source,
    };

    // The sidecar sends its resume points first, if it holds anything.
    let mut resume = HashMap::new();
    let mut early = None;
    match tokio::time::timeout(settings.resume_wait, inbound.message()).await {
        Ok(Ok(Some(v1::CacheDown {
            msg: Some(cache_down::Msg::Resume(r)),
        }))) => {
            for kv in r.kinds {
                if let Some(kind) = &kv.kind {
                    resume.insert(gvr(kind), kv.resource_version);
                }
            }
            info!(%account, kinds = resume.len(), "resume points received");
        }
        Ok(Ok(Some(down))) => early = Some(down),
        Ok(Ok(None)) => return Err(closed(account)),
        Ok(Err(source)) => return Err(failed(account, source)),
        Err(_) => debug!(%account, "no resume points; listing every kind"),
    }

    let api = Arc::new(health::ApiHealth::default());
    let ctx = Arc::new(WatchContext {
        account: account.clone(),
        client: cluster.client.clone(),
        outbox: outbox.clone(),
        filter: settings.filter.clone(),
        page_size: settings.page_size,
        total_budget: settings.total_budget.clone(),
        account_budget: settings.account_budget.clone(),
        metrics: settings.metrics.clone(),
        api: api.clone(),
    });
    let (resync_tx, resync_rx) = mpsc::channel(RESYNC_QUEUE);
    let watches = Watches {
        ctx,
        cluster: cluster.clone(),
        resume,
        interval: settings.discovery_interval,
    };
    let mut tasks = JoinSet::new();
    tasks.spawn(watches.run(resync_rx, Box::new(on_synced)));
    let lag = settings
        .metrics
        .lag
        .get_or_create(&AccountLabels {
            account: account.clone(),
        })
        .clone();
    tasks.spawn(heartbeat(
        outbox.clone(),
        settings.heartbeat,
        lag.clone(),
        api,
    ));

    let gauge = settings
        .metrics
        .unacked
        .get_or_create(&AccountLabels {
            account: account.clone(),
        })
        .clone();
    let handle = |down: v1::CacheDown| match down.msg {
        Some(cache_down::Msg::Ack(ack)) => {
            trace!(%account, seq = ack.seq, "ack");
            outbox.ack(ack.seq);
            gauge.set(i64::try_from(outbox.unacked()).unwrap_or(i64::MAX));
            lag.set(outbox.lag().as_secs_f64());
        }
        Some(cache_down::Msg::Resync(r)) => {
            info!(%account, kinds = r.kinds.len(), "resync requested");
            let kinds = r.kinds.iter().map(gvr).collect();
            // A full queue already holds a resync that covers this one's
            // purpose soon enough; dropping it is safe only for "all".
            if resync_tx.try_send(kinds).is_err() {
                warn!(%account, "resync queue full, request dropped");
            }
        }
        Some(cache_down::Msg::Resume(r)) => {
            debug!(%account, kinds = r.kinds.len(), "late resume points ignored");
        }
        Some(cache_down::Msg::Heartbeat(_)) => trace!(%account, "heartbeat from sidecar"),
        None => {}
    };
    if let Some(down) = early {
        handle(down);
    }
    loop {
        tokio::select! {
            down = inbound.message() => match down {
                Ok(Some(down)) => handle(down),
                Ok(None) => return Err(closed(account)),
                Err(source) => return Err(failed(account, source)),
            },
            Some(done) = tasks.join_next() => {
                return Err(Error::Task(format!("cache task ended: {done:?}")));
            }
        }
    }
}

/// The watches of one cache stream: discovery, refreshed periodically, and
/// one [`KindWatch`] per kind. Dropping it (the stream ended) aborts them.
struct Watches {
    ctx: Arc<WatchContext>,
    cluster: Cluster,
    /// Resume points from the sidecar, used once per kind.
    resume: HashMap<String, String>,
    interval: Duration,
}

impl Watches {
    async fn run(
        mut self,
        mut resync: mpsc::Receiver<Vec<String>>,
        on_synced: Box<dyn FnOnce() + Send>,
    ) {
        let mut on_synced = Some(on_synced);
        let (report_tx, mut reports) = mpsc::channel(REPORT_QUEUE);
        let mut tasks = JoinSet::new();
        let mut running: BTreeMap<WatchedKind, (AbortHandle, Arc<Notify>)> = BTreeMap::new();
        let mut done: BTreeSet<WatchedKind> = BTreeSet::new();
        let mut documents: Option<Vec<v1::Document>> = None;
        let mut backoff = Backoff::new(DISCOVERY_RETRY_INITIAL, DISCOVERY_RETRY_MAX);
        let mut next = tokio::time::Instant::now();
        let account = self.ctx.account.clone();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    while tasks.try_join_next().is_some() {}
                    let snapshot = match self.cluster.discovery().await {
                        Ok(snapshot) => snapshot,
                        Err(e) => {
                            warn!(%account, error = %e, "discovery failed, retrying");
                            next = tokio::time::Instant::now() + backoff.next_delay();
                            continue;
                        }
                    };
                    backoff.reset();
                    next = tokio::time::Instant::now() + self.interval;
                    let kinds: BTreeSet<WatchedKind> =
                        kinds::from_discovery(&snapshot.documents, &self.ctx.filter)
                            .into_iter()
                            .collect();
                    if documents.as_ref() != Some(&snapshot.documents) {
                        debug!(%account, documents = snapshot.documents.len(), kinds = kinds.len(), "discovery snapshot");
                        documents = Some(snapshot.documents.clone());
                        self.ctx.outbox.push(cache_up::Msg::Discovery(snapshot)).await;
                    }
                    running.retain(|kind, (task, _)| {
                        let keep = kinds.contains(kind);
                        if !keep {
                            info!(%account, kind = %kind.qualified(), "kind gone from discovery, watch stopped");
                            task.abort();
                        }
                        keep
                    });
                    done.retain(|k| kinds.contains(k));
                    for kind in &kinds {
                        if running.get(kind).is_some_and(|(task, _)| !task.is_finished()) {
                            continue;
                        }
                        let start = self.start_of(kind);
                        let notify = Arc::new(Notify::new());
                        let watch = KindWatch::new(self.ctx.clone(), kind.clone(), notify.clone(), report_tx.clone());
                        let task = tasks.spawn(watch.run(start));
                        running.insert(kind.clone(), (task, notify));
                    }
                    self.check_synced(&kinds, &done, &mut on_synced).await;
                }
                Some(report) = reports.recv() => {
                    let kind = match report {
                        Report::Synced(k) | Report::Unavailable(k) => k,
                    };
                    done.insert(kind);
                    let kinds: BTreeSet<WatchedKind> = running.keys().cloned().collect();
                    self.check_synced(&kinds, &done, &mut on_synced).await;
                }
                Some(wanted) = resync.recv() => {
                    for (kind, (_, notify)) in &running {
                        if wanted.is_empty() || wanted.contains(&kind.gvr()) {
                            notify.notify_one();
                        }
                    }
                }
            }
        }
    }

    /// Resume from the sidecar's point only once, only when the kind is
    /// watched in one scope, and only when its last listing ended.
    fn start_of(&mut self, kind: &WatchedKind) -> Start {
        let rv = self.resume.remove(&kind.gvr());
        let single_scope =
            !kind.namespaced || self.ctx.filter.scopes().is_none_or(|s| s.len() == 1);
        match rv {
            Some(rv) if !rv.is_empty() && single_scope && !self.ctx.outbox.listing(kind) => {
                Start::Resume(rv)
            }
            _ => Start::List,
        }
    }

    /// Once every kind of `kinds` is done: runs `on_synced` and tells the
    /// sidecar ([`v1::CacheSynced`], after every kind's `SyncEnd`).
    async fn check_synced(
        &self,
        kinds: &BTreeSet<WatchedKind>,
        done: &BTreeSet<WatchedKind>,
        on_synced: &mut Option<Box<dyn FnOnce() + Send>>,
    ) {
        if !kinds.is_empty()
            && kinds.iter().all(|k| done.contains(k))
            && let Some(f) = on_synced.take()
        {
            info!(account = %self.ctx.account, kinds = kinds.len(), "all kinds synced");
            self.ctx
                .outbox
                .push(cache_up::Msg::Synced(v1::CacheSynced {}))
                .await;
            f();
        }
    }
}

async fn heartbeat(
    outbox: Arc<Outbox>,
    period: Duration,
    lag: prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
    api: Arc<health::ApiHealth>,
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate
    loop {
        // On the period, and at once when the API server stops or starts
        // answering.
        tokio::select! {
            _ = ticks.tick() => {}
            () = api.changed() => {}
        }
        // Acks refresh the lag; when they stop coming, so does that, so the
        // heartbeat refreshes it too (before its own message joins the window).
        lag.set(outbox.lag().as_secs_f64());
        let (since, error) = api.down().unwrap_or_default();
        let beat = cache_up::Msg::Heartbeat(v1::Heartbeat {
            unix_millis: crate::clock::unix_millis(),
            api_unreachable_since_unix_millis: since,
            api_error: error,
        });
        outbox.push(beat).await;
    }
}
