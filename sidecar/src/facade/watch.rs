//! WATCH of a cached kind served from the cache, as the API server serves it:
//! newline-delimited JSON events (or one-row Tables for `kubectl get -w`),
//! from the current objects (`resourceVersion` empty or `0`: synthetic
//! ADDED first) or after a resourceVersion, with label and field selectors
//! (an object that stops matching is DELETED for the watcher), bookmarks,
//! `timeoutSeconds`, and `sendInitialEvents` with its `initial-events-end`
//! bookmark. A resourceVersion older than the account's history, or a
//! watcher that fell so far behind that changes it had not read were
//! dropped, gets a `410 Expired` ERROR event and the stream ends: the client
//! lists again.
//!
//! One task per watch pulls changes from the cache's history
//! ([`crate::cache::Cache::changes`]) and writes into a bounded channel the
//! response body drains; the cache never waits for it. Anything this module
//! does not answer ([`serve`] returns `None`: kind not synced, option
//! combinations the real server validates) is relayed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
#[cfg(test)]
use serde_json::Value;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::printer::{self, Printer};
use super::route::{Query, ResourcePath};
use crate::accounts::Account;
use crate::cache::history::{Change, ChangeType, Expired};
use crate::cache::{Entry, KindKey, ObjectKey, WatchStart};
use crate::http::body::{self, Body, BoxError};
use crate::metrics::Metrics;
use spinlink_kube_api::table::{self, IncludeObject};
use spinlink_kube_api::{Resource, Selectors, Status};

/// How often a watch that allows bookmarks gets one (the API server sends
/// them about once a minute).
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);
/// A watch without `timeoutSeconds` ends after this long times a random
/// factor in [1, 2), like the API server's `--min-request-timeout`, so
/// clients spread their re-watches.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Event lines buffered between a watch task and its response body.
const WATCH_BUFFER: usize = 64;
/// Changes taken from the history per read lock.
const PULL_BATCH: usize = 256;

/// What every cache-served watch shares.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Time between bookmarks.
    pub bookmark_interval: Duration,
    /// Ends every watch (the facade is shutting down).
    pub shutdown: CancellationToken,
    /// Counts open and expired watches.
    pub metrics: Metrics,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            shutdown: CancellationToken::new(),
            metrics: Metrics::default(),
        }
    }
}

/// Where the query asks the watch to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// With the current objects as ADDED; `initial_end` closes them with the
    /// `k8s.io/initial-events-end` bookmark (`sendInitialEvents=true`),
    /// whose state must be at least `not_older_than`.
    Current {
        initial_end: bool,
        not_older_than: u64,
    },
    /// After this resourceVersion.
    After(u64),
    /// From now on, without the current objects.
    Now,
}

fn rv_param(query: &Query) -> Option<Option<u64>> {
    match query.get("resourceVersion").unwrap_or("") {
        "" | "0" => Some(None),
        rv => rv.parse().ok().map(Some),
    }
}

/// The start a query asks for, or `None` for combinations left to the
/// server (it answers them, or refuses them with its validation message).
fn start_of(query: &Query) -> Option<Start> {
    let rv = rv_param(query)?;
    let send_initial = query.get("sendInitialEvents");
    let matching = query.get("resourceVersionMatch").filter(|m| !m.is_empty());
    match (send_initial, matching, rv) {
        (None, None, None) => Some(Start::Current {
            initial_end: false,
            not_older_than: 0,
        }),
        (None, None, Some(rv)) => Some(Start::After(rv)),
        (Some("true"), Some("NotOlderThan"), rv) if query.flag("allowWatchBookmarks") => {
            Some(Start::Current {
                initial_end: true,
                not_older_than: rv.unwrap_or(0),
            })
        }
        (Some("false"), Some("NotOlderThan"), None) => Some(Start::Now),
        (Some("false"), Some("NotOlderThan"), Some(rv)) => Some(Start::After(rv)),
        _ => None,
    }
}

/// What one watch selects.
#[derive(Debug, Clone)]
struct Filter {
    namespace: Option<String>,
    selectors: Selectors,
}

impl Filter {
    fn selects(&self, key: &ObjectKey, entry: &Entry) -> bool {
        if self.namespace.as_ref().is_some_and(|ns| *ns != key.0) {
            return false;
        }
        if self
            .selectors
            .fields
            .required_name()
            .is_some_and(|name| name != key.1)
        {
            return false;
        }
        self.selectors.labels.matches_with(|k| entry.label(k))
            && (self.selectors.fields.is_empty() || self.selectors.fields.matches(&entry.object()))
    }

    /// The event a change is for this watcher, if any.
    fn event(&self, change: &Change) -> Option<ChangeType> {
        let now = self.selects(&change.key, &change.object);
        let before = change
            .old
            .as_ref()
            .is_some_and(|o| self.selects(&change.key, o));
        match change.ty {
            ChangeType::Added | ChangeType::Modified if now && before => {
                Some(if change.ty == ChangeType::Added {
                    ChangeType::Added
                } else {
                    ChangeType::Modified
                })
            }
            ChangeType::Added | ChangeType::Modified if now => Some(ChangeType::Added),
            ChangeType::Added | ChangeType::Modified if before => Some(ChangeType::Deleted),
            ChangeType::Deleted if now || before => Some(ChangeType::Deleted),
            _ => None,
        }
    }
}

/// The resource a watch is of, owned for its task.
#[derive(Debug, Clone)]
struct Res {
    group: String,
    version: String,
    plural: String,
    kind: String,
}

impl Res {
    fn api(&self) -> Resource<'_> {
        Resource {
            group: &self.group,
            version: &self.version,
            plural: &self.plural,
            kind: &self.kind,
        }
    }
}

/// Answers a WATCH of `path` from the cache, or `None` to relay it.
pub fn serve(
    account: &Arc<Account>,
    path: &ResourcePath,
    query: &Query,
    accept: &str,
    settings: &Settings,
) -> Option<Response<Body>> {
    let start = start_of(query)?;
    let key = KindKey {
        group: path.group.clone(),
        version: path.version.clone(),
        resource: path.resource.clone(),
    };
    let (begun, res, filter, table) = {
        let cache = account.read_cache();
        let kind = cache
            .kind(&path.group, &path.version, &path.resource)
            .filter(|k| k.watchable())?;
        if path.namespace.is_some() && !kind.info.namespaced {
            return None;
        }
        let res = Res {
            group: path.group.clone(),
            version: path.version.clone(),
            plural: path.resource.clone(),
            kind: kind.info.kind.clone(),
        };
        // A Table the facade cannot print as the server would is relayed.
        let table = if table::wants_table(accept) {
            let printer = printer::printer(&cache, res.api())?;
            Some((IncludeObject::parse(query.get("includeObject")), printer))
        } else {
            None
        };
        let selectors = match Selectors::parse(
            res.api(),
            query.get("labelSelector"),
            query.get("fieldSelector"),
        ) {
            Ok(s) => s,
            Err(e) => return Some(body::status(&Status::bad_request(e.to_string()))),
        };
        let filter = Filter {
            namespace: path.namespace.clone(),
            selectors,
        };
        let from = match start {
            Start::Current { not_older_than, .. } => {
                // The cache is behind what the client has seen: the server
                // would wait for it; the agent's connection does that.
                if not_older_than > kind.watch_position() {
                    return None;
                }
                None
            }
            Start::After(rv) => Some(rv),
            Start::Now => Some(kind.watch_position()),
        };
        let begun = cache.watch(&key, from, |k, e| filter.selects(k, e))?;
        (begun, res, filter, table)
    };
    let (tx, rx) = mpsc::channel::<Bytes>(WATCH_BUFFER);
    let watcher = Watcher {
        account: account.clone(),
        kind: key,
        res,
        filter,
        table,
        tx,
    };
    let skip_to = match start {
        Start::After(rv) => rv,
        _ => 0,
    };
    let run = Run {
        initial_end: matches!(
            start,
            Start::Current {
                initial_end: true,
                ..
            }
        ),
        bookmarks: query.flag("allowWatchBookmarks"),
        deadline: Instant::now() + timeout(query),
        skip_to,
    };
    let settings = settings.clone();
    tokio::spawn(async move {
        let _open = settings.metrics.cache_watch_opened(watcher.account.name());
        let result = match begun {
            Ok(begun) => watcher.run(begun, run, &settings).await,
            Err(expired) => Err(expired),
        };
        if let Err(expired) = result {
            settings.metrics.cache_watch_expired(watcher.account.name());
            watcher.error(&expired).await;
        }
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, BoxError>(Frame::data(b)));
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Some(resp)
}

fn timeout(query: &Query) -> Duration {
    match query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
    {
        Some(t) => Duration::from_secs(t),
        None => DEFAULT_WATCH_TIMEOUT.mul_f64(1.0 + rand::random::<f64>()),
    }
}

/// One line of a watch stream.
fn frame(ty: &str, object: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(ty.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// How a watch runs after its start.
#[derive(Debug, Clone, Copy)]
struct Run {
    initial_end: bool,
    bookmarks: bool,
    deadline: Instant,
    /// Changes at or below this resourceVersion were seen by the client.
    skip_to: u64,
}

struct Watcher {
    account: Arc<Account>,
    kind: KindKey,
    res: Res,
    filter: Filter,
    /// Set for a watch of Table rows: what rows carry, and their printer.
    table: Option<(IncludeObject, Printer)>,
    tx: mpsc::Sender<Bytes>,
}

impl Watcher {
    /// Sends one object event; `false` when the client is gone.
    async fn event(&self, ty: ChangeType, entry: &Entry) -> bool {
        let line = match &self.table {
            None => frame(ty.as_str(), entry.json().as_bytes()),
            Some((include, printer)) => {
                let object = entry.object();
                let t = printer::render(
                    printer,
                    self.res.api(),
                    [&object],
                    json!({"resourceVersion": entry.resource_version}),
                    *include,
                    chrono::Utc::now(),
                );
                frame(ty.as_str(), &spinlink_kube_api::json::compact(&t))
            }
        };
        self.tx.send(line).await.is_ok()
    }

    async fn bookmark(&self, position: u64, initial_end: bool) -> bool {
        let mut object = json!({
            "kind": self.res.kind,
            "apiVersion": self.res.api().api_version(),
            "metadata": {"resourceVersion": position.to_string()},
        });
        if initial_end {
            object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let bytes = spinlink_kube_api::json::compact(&object);
        self.tx.send(frame("BOOKMARK", &bytes)).await.is_ok()
    }

    async fn error(&self, expired: &Expired) {
        let status = Status::expired(expired.to_string()).to_value();
        let bytes = spinlink_kube_api::json::compact(&status);
        let _ = self.tx.send(frame("ERROR", &bytes)).await;
    }

    /// Streams until the client goes, the deadline, shutdown or the cache is
    /// dropped; `Err` when the history no longer holds what is needed.
    async fn run(&self, begun: WatchStart, run: Run, settings: &Settings) -> Result<(), Expired> {
        let WatchStart {
            mut grew,
            mut cursor,
            mut position,
            objects,
        } = begun;
        // Objects sent newer than the kind's position (a folded write, or a
        // listing under way): their older changes still to come are skipped.
        let mut ahead: HashMap<ObjectKey, u64> = HashMap::new();
        for (key, entry) in &objects {
            if let Some(rv) = crate::cache::rv_number(&entry.resource_version)
                && rv > position
            {
                ahead.insert(key.clone(), rv);
            }
            if !self.event(ChangeType::Added, entry).await {
                return Ok(());
            }
        }
        drop(objects);
        if run.initial_end && !self.bookmark(position, true).await {
            return Ok(());
        }
        let mut reached = position.max(run.skip_to);
        let period = settings.bookmark_interval.max(Duration::from_millis(10));
        let mut bookmarks = tokio::time::interval_at(Instant::now() + period, period);
        loop {
            // Mark what is seen before reading, so an append after the
            // read wakes the wait below.
            grew.borrow_and_update();
            loop {
                let batch = self
                    .account
                    .read_cache()
                    .changes(&self.kind, cursor, PULL_BATCH, reached)?;
                cursor = batch.cursor;
                for change in &batch.changes {
                    if change.position <= run.skip_to {
                        continue;
                    }
                    reached = reached.max(change.position);
                    if let Some(rv) = ahead.get(&change.key) {
                        if crate::cache::rv_number(&change.object.resource_version)
                            .is_some_and(|n| n <= *rv)
                        {
                            continue;
                        }
                        ahead.remove(&change.key);
                    }
                    if let Some(ty) = self.filter.event(change)
                        && !self.event(ty, &change.object).await
                    {
                        return Ok(());
                    }
                }
                if batch.caught_up {
                    position = batch.position.max(run.skip_to);
                    break;
                }
            }
            tokio::select! {
                () = settings.shutdown.cancelled() => return Ok(()),
                () = self.tx.closed() => return Ok(()),
                () = tokio::time::sleep_until(run.deadline) => return Ok(()),
                changed = grew.changed() => {
                    if changed.is_err() {
                        // The account was removed and its cache dropped.
                        return Ok(());
                    }
                }
                _ = bookmarks.tick(), if run.bookmarks => {
                    if !self.bookmark(position, false).await {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Query {
        Query::parse(Some(s))
    }

    #[test]
    fn starts_the_query_asks_for() {
        let current = Start::Current {
            initial_end: false,
            not_older_than: 0,
        };
        assert_eq!(start_of(&q("watch=1")), Some(current));
        assert_eq!(start_of(&q("watch=1&resourceVersion=0")), Some(current));
        assert_eq!(
            start_of(&q("watch=1&resourceVersion=42")),
            Some(Start::After(42))
        );
        assert_eq!(
            start_of(&q(
                "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=7"
            )),
            Some(Start::Current {
                initial_end: true,
                not_older_than: 7
            })
        );
        assert_eq!(
            start_of(&q(
                "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
            )),
            Some(Start::Now)
        );
        // Left to the server: it validates these (or knows what they mean).
        assert_eq!(start_of(&q("watch=1&resourceVersion=abc")), None);
        assert_eq!(
            start_of(&q("watch=1&resourceVersionMatch=NotOlderThan")),
            None
        );
        assert_eq!(
            start_of(&q(
                "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
            )),
            None,
            "sendInitialEvents needs allowWatchBookmarks"
        );
        assert_eq!(
            start_of(&q("watch=1&resourceVersion=5&resourceVersionMatch=Exact")),
            None
        );
    }

    #[test]
    fn frames_are_one_json_line() {
        let line = frame("ADDED", br#"{"a":1}"#);
        assert_eq!(&line[..], b"{\"type\":\"ADDED\",\"object\":{\"a\":1}}\n");
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["object"]["a"], 1);
    }
}
