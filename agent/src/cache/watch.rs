//! One kind's list/watch loop on raw API requests, turned into `Cache`
//! messages. The agent keeps no copy of the cluster: objects go straight from
//! the API server's response to the account's [`Outbox`].
//!
//! - A listing is paginated (`limit`, `continue`) inside `SyncStart` …
//!   `SyncEnd`, one page in memory at a time, and holds a permit of both the
//!   agent's and the account's list budget.
//! - The watch follows from the list's resourceVersion with bookmarks on, or,
//!   when the sidecar sent a resume point, from that without listing.
//! - 410 Gone (an `ERROR` event with code 410, or the request's status) and a
//!   sidecar `Resync` lead to a new listing, so objects deleted meanwhile
//!   disappear from the sidecar's cache.
//! - When the account names namespaces, a namespaced kind is listed and
//!   watched in each of them; the listing still covers all of them inside
//!   one `SyncStart` … `SyncEnd`.
//!
//! Secret objects are parsed with [`Scrubbed`], so their values are never
//! even allocated.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::Value;
use spinlink_proto::v1::{self, cache_up, watch_event};
use tokio::sync::{Notify, Semaphore, mpsc};
use tracing::{debug, info, warn};

use super::outbox::Outbox;
use crate::activity::watches::WatchRow;
use crate::backoff::Backoff;
use crate::kinds::{KindFilter, WatchedKind};
use crate::metrics::Metrics;
use crate::scrub::Scrubbed;

/// The server ends each watch request after this long (plus its own
/// jitter); the loop then watches again from where it stood.
pub const WATCH_TIMEOUT_SECONDS: u32 = 290;
/// First delay cap after a failed list or watch.
pub const RETRY_INITIAL: Duration = Duration::from_millis(500);
/// Largest delay cap after failures.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Longest watch line accepted.
pub const MAX_LINE: usize = crate::scrub::MAX_WATCH_LINE;

/// Why a list or watch request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request could not be made or its body not read.
    #[error("request failed: {0}")]
    Request(#[source] kube::Error),
    /// The resourceVersion (or continue token) is too old: list again.
    #[error("410 Gone: resourceVersion too old")]
    Gone,
    /// The server does not serve the kind to us (404, 403, 405).
    #[error("kind not available: HTTP {0}")]
    Unavailable(u16),
    /// Any other HTTP status.
    #[error("HTTP {0}")]
    Status(u16),
    /// The body did not parse.
    #[error("bad response: {0}")]
    Parse(String),
    /// A watch line grew past [`MAX_LINE`].
    #[error("watch line too long")]
    LineTooLong,
    /// The cache stream is gone; the loop ends.
    #[error("stopped")]
    Stopped,
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a kind's loop tells the cache stream about its first listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The first listing (or a resume) completed.
    Synced(WatchedKind),
    /// The server refused to list it; it is retried after the next
    /// discovery refresh.
    Unavailable(WatchedKind),
}

/// What every kind's loop of one account shares.
pub struct WatchContext {
    /// The account.
    pub account: String,
    /// The account's client.
    pub client: kube::Client,
    /// Where messages go.
    pub outbox: Arc<Outbox>,
    /// The account's kind and namespace filter.
    pub filter: KindFilter,
    /// `limit` of each list page.
    pub page_size: u32,
    /// The agent-wide list budget.
    pub total_budget: Arc<Semaphore>,
    /// The account's list budget.
    pub account_budget: Arc<Semaphore>,
    /// Counters.
    pub metrics: Metrics,
    /// Whether the API server answers; every request reports to it.
    pub api: Arc<super::health::ApiHealth>,
}

impl std::fmt::Debug for WatchContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchContext")
            .field("account", &self.account)
            .field("filter", &self.filter)
            .field("page_size", &self.page_size)
            .finish_non_exhaustive()
    }
}

/// One kind's loop. Build it, then [`KindWatch::run`] it in a task; abort
/// the task to stop it.
#[derive(Debug)]
pub struct KindWatch {
    ctx: Arc<WatchContext>,
    kind: WatchedKind,
    resync: Arc<Notify>,
    report: mpsc::Sender<Report>,
    /// Its row in `/watches`, removed when the loop ends.
    row: WatchRow,
}

/// How the loop starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// List first.
    List,
    /// Watch from this resourceVersion (the sidecar's resume point).
    Resume(String),
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ListMeta {
    resource_version: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct Page<T> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Deserialize)]
struct RawEvent<T> {
    #[serde(rename = "type")]
    ty: String,
    object: T,
}

/// Parses a list page, Secret values skipped for Secrets.
fn parse_page(body: &[u8], secret: bool) -> Result<(ListMeta, Vec<Value>)> {
    let err = |e: serde_json::Error| Error::Parse(e.to_string());
    if secret {
        let page: Page<Scrubbed> = serde_json::from_slice(body).map_err(err)?;
        Ok((page.metadata, page.items.into_iter().map(|s| s.0).collect()))
    } else {
        let page: Page<Value> = serde_json::from_slice(body).map_err(err)?;
        Ok((page.metadata, page.items))
    }
}

/// Parses one watch line, Secret values skipped for Secrets.
fn parse_event(line: &[u8], secret: bool) -> Result<(String, Value)> {
    let err = |e: serde_json::Error| Error::Parse(e.to_string());
    if secret {
        let e: RawEvent<Scrubbed> = serde_json::from_slice(line).map_err(err)?;
        Ok((e.ty, e.object.0))
    } else {
        let e: RawEvent<Value> = serde_json::from_slice(line).map_err(err)?;
        Ok((e.ty, e.object))
    }
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj["metadata"][key].as_str().unwrap_or_default()
}

/// The lowest of several resourceVersions (numerically when they are
/// numbers): a watch of every scope can resume from it.
fn lowest(rvs: &[String]) -> String {
    let numeric: Option<Vec<u64>> = rvs.iter().map(|r| r.parse().ok()).collect();
    match numeric.and_then(|n| n.into_iter().min()) {
        Some(n) => n.to_string(),
        None => rvs.first().cloned().unwrap_or_default(),
    }
}

/// The object as JSON with `kind`/`apiVersion` set: the items of a built-in
/// kind's list lack them, and get them first, where the API server writes
/// them in a GET or a watch event.
pub fn encode_object(kind: &WatchedKind, mut obj: Value) -> Vec<u8> {
    if let Some(map) = obj.as_object_mut() {
        let missing = |v: Option<&Value>| v.and_then(Value::as_str).is_none_or(str::is_empty);
        if missing(map.get("apiVersion")) {
            map.shift_insert(0, "apiVersion".into(), Value::from(kind.api_version()));
        }
        if missing(map.get("kind")) {
            map.shift_insert(0, "kind".into(), Value::from(kind.kind.clone()));
        }
    }
    // Serialising a Value cannot fail; an empty object is sent if it did.
    serde_json::to_vec(&obj).unwrap_or_else(|_| b"{}".to_vec())
}

impl KindWatch {
    /// A loop for `kind`; `resync` asks it to list again, `report` hears
    /// about its first listing.
    pub fn new(
        ctx: Arc<WatchContext>,
        kind: WatchedKind,
        resync: Arc<Notify>,
        report: mpsc::Sender<Report>,
    ) -> Self {
        let row = ctx.metrics.active.register(&ctx.account, &kind.qualified());
        Self {
            ctx,
            kind,
            resync,
            report,
            row,
        }
    }

    fn labels(&self) -> crate::metrics::KindLabels {
        Metrics::kind(&self.ctx.account, &self.kind)
    }

    /// The namespaces listed and watched one by one (`None`: all at once).
    fn scopes(&self) -> Vec<Option<String>> {
        match (self.kind.namespaced, self.ctx.filter.scopes()) {
            (true, Some(namespaces)) => namespaces.iter().cloned().map(Some).collect(),
            _ => vec![None],
        }
    }

    /// Lists and watches until the task is aborted or the outbox refuses.
    pub async fn run(self, start: Start) {
        let gauge = self
            .ctx
            .metrics
            .watches
            .get_or_create(&self.labels())
            .clone();
        gauge.inc();
        let _dec = scopeguard(move || {
            gauge.dec();
        });
        let mut start = start;
        let mut reported = false;
        let mut backoff = Backoff::new(RETRY_INITIAL, RETRY_MAX);
        loop {
            let from = match std::mem::replace(&mut start, Start::List) {
                Start::Resume(rv) => {
                    debug!(account = %self.ctx.account, kind = %self.kind.qualified(), %rv, "resuming watch");
                    self.scopes().into_iter().map(|s| (s, rv.clone())).collect()
                }
                Start::List => match self.list().await {
                    Ok(rvs) => rvs,
                    Err(Error::Unavailable(status)) if !reported => {
                        info!(account = %self.ctx.account, kind = %self.kind.qualified(), status, "kind not listable, skipped until the next discovery");
                        let _ = self
                            .report
                            .send(Report::Unavailable(self.kind.clone()))
                            .await;
                        return;
                    }
                    Err(e) => {
                        warn!(account = %self.ctx.account, kind = %self.kind.qualified(), error = %e, "list failed, retrying");
                        tokio::time::sleep(backoff.next_delay()).await;
                        continue;
                    }
                },
            };
            backoff.reset();
            self.row.watching(&lowest(
                &from.iter().map(|(_, rv)| rv.clone()).collect::<Vec<_>>(),
            ));
            if !reported {
                reported = true;
                if self
                    .report
                    .send(Report::Synced(self.kind.clone()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            // Each scope watches (and re-watches) on its own; the first 410,
            // or a resync request, ends them all and leads to a listing.
            let watches = from
                .into_iter()
                .map(|(scope, rv)| self.watch_scope(scope, rv).boxed());
            tokio::select! {
                (gone, _, _) = futures::future::select_all(watches) => {
                    if gone.is_err() {
                        return; // stopped
                    }
                    self.ctx.metrics.gone.get_or_create(&self.labels()).inc();
                    self.row.gone();
                    info!(account = %self.ctx.account, kind = %self.kind.qualified(), "410 Gone: listing again");
                }
                () = self.resync.notified() => {
                    info!(account = %self.ctx.account, kind = %self.kind.qualified(), "resync requested: listing again");
                }
            }
        }
    }

    async fn push(&self, msg: cache_up::Msg) {
        self.ctx.outbox.push(msg).await;
        self.ctx
            .metrics
            .unacked
            .get_or_create(&crate::metrics::AccountLabels {
                account: self.ctx.account.clone(),
            })
            .set(i64::try_from(self.ctx.outbox.unacked()).unwrap_or(i64::MAX));
    }

    async fn push_object(&self, ty: watch_event::Type, obj: Value) {
        if !self.ctx.filter.wants_object(
            &self.kind,
            meta_str(&obj, "namespace"),
            meta_str(&obj, "name"),
        ) {
            return;
        }
        let resource_version = meta_str(&obj, "resourceVersion").to_owned();
        let object = encode_object(&self.kind, obj);
        let labels = self.labels();
        self.ctx.metrics.events.get_or_create(&labels).inc();
        self.ctx
            .metrics
            .bytes
            .get_or_create(&labels)
            .inc_by(object.len() as u64);
        self.push(cache_up::Msg::Event(v1::WatchEvent {
            r#type: ty.into(),
            kind: Some(self.kind.proto()),
            resource_version,
            object,
        }))
        .await;
    }

    async fn get(&self, uri: &str) -> Result<kube::client::Body> {
        let request = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(kube::client::Body::empty())
            .map_err(|e| Error::Parse(e.to_string()))?;
        let response = match self.ctx.client.send(request).await {
            Ok(response) => response,
            Err(e) => {
                self.ctx.api.failed(&e.to_string());
                return Err(Error::Request(e));
            }
        };
        // A 5xx is the API server (or what fronts it) failing; anything
        // else is an answer.
        match response.status().as_u16() {
            s @ 500..=599 => self.ctx.api.failed(&format!("HTTP {s}")),
            _ => self.ctx.api.answered(),
        }
        match response.status().as_u16() {
            200..=299 => Ok(response.into_body()),
            410 => Err(Error::Gone),
            s @ 403..=405 => Err(Error::Unavailable(s)),
            s => Err(Error::Status(s)),
        }
    }

    /// One full listing of every scope inside `SyncStart` … `SyncEnd`;
    /// returns each scope's list resourceVersion.
    async fn list(&self) -> Result<Vec<(Option<String>, String)>> {
        // Account first: never hold an agent-wide permit while waiting for
        // the account's.
        let _account = self
            .ctx
            .account_budget
            .acquire()
            .await
            .map_err(|_| Error::Stopped)?;
        let _total = self
            .ctx
            .total_budget
            .acquire()
            .await
            .map_err(|_| Error::Stopped)?;
        'listing: loop {
            self.ctx.metrics.relists.get_or_create(&self.labels()).inc();
            self.row.listing();
            let mut started = false;
            let mut rvs = Vec::new();
            for scope in self.scopes() {
                let path = self.kind.path(scope.as_deref());
                let mut continue_token: Option<String> = None;
                let mut list_rv = None;
                loop {
                    let mut uri = format!("{path}?limit={}", self.ctx.page_size);
                    if let Some(token) = &continue_token {
                        uri.push_str("&continue=");
                        uri.push_str(&percent_encode(token));
                    }
                    let body = match self.get(&uri).await {
                        Err(Error::Gone) if continue_token.is_some() => {
                            // The continue token expired: start over.
                            continue 'listing;
                        }
                        other => other?,
                    };
                    let bytes = body.collect().await.map_err(Error::Request)?.to_bytes();
                    let (meta, items) = parse_page(&bytes, self.kind.is_secret())?;
                    drop(bytes);
                    if !started {
                        started = true;
                        self.push(cache_up::Msg::SyncStart(v1::SyncStart {
                            kind: Some(self.kind.proto()),
                        }))
                        .await;
                    }
                    if list_rv.is_none() {
                        list_rv = meta.resource_version.filter(|rv| !rv.is_empty());
                    }
                    for item in items {
                        self.push_object(watch_event::Type::Added, item).await;
                    }
                    match meta.continue_token.filter(|c| !c.is_empty()) {
                        Some(token) => continue_token = Some(token),
                        None => break,
                    }
                }
                rvs.push((scope, list_rv.unwrap_or_default()));
            }
            let versions: Vec<String> = rvs.iter().map(|(_, rv)| rv.clone()).collect();
            self.push(cache_up::Msg::SyncEnd(v1::SyncEnd {
                kind: Some(self.kind.proto()),
                resource_version: lowest(&versions),
            }))
            .await;
            return Ok(rvs);
        }
    }

    /// Watches one scope from `rv`, watching again after the server ends a
    /// request or a request fails. Returns `Ok` on 410 Gone.
    async fn watch_scope(&self, scope: Option<String>, mut rv: String) -> Result<(), ()> {
        let path = self.kind.path(scope.as_deref());
        let mut backoff = Backoff::new(RETRY_INITIAL, RETRY_MAX);
        loop {
            let uri = format!(
                "{path}?watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECONDS}&resourceVersion={}",
                percent_encode(&rv)
            );
            let outcome = match self.get(&uri).await {
                Ok(body) => self.follow(body, &mut rv, &mut backoff).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => continue, // the server ended the watch: watch on
                Err(Error::Gone) => return Ok(()),
                Err(Error::Stopped) => return Err(()),
                Err(e) => {
                    warn!(account = %self.ctx.account, kind = %self.kind.qualified(), error = %e, "watch failed, retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// Reads watch events until the body ends; `rv` follows them.
    async fn follow(
        &self,
        mut body: kube::client::Body,
        rv: &mut String,
        backoff: &mut Backoff,
    ) -> Result<()> {
        let mut lines = LineBuffer::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(Error::Request)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for line in lines.push(&data)? {
                self.event(&line, rv).await?;
                backoff.reset();
            }
        }
        if let Some(line) = lines.finish() {
            self.event(&line, rv).await?;
        }
        Ok(())
    }

    async fn event(&self, line: &[u8], rv: &mut String) -> Result<()> {
        let (ty, object) = parse_event(line, self.kind.is_secret())?;
        let ty = match ty.as_str() {
            "ADDED" => watch_event::Type::Added,
            "MODIFIED" => watch_event::Type::Modified,
            "DELETED" => watch_event::Type::Deleted,
            "BOOKMARK" => watch_event::Type::Bookmark,
            "ERROR" => {
                let code = object["code"].as_u64().unwrap_or_default();
                return Err(if code == 410 {
                    Error::Gone
                } else {
                    Error::Parse(format!(
                        "watch error {code}: {}",
                        object["message"].as_str().unwrap_or_default()
                    ))
                });
            }
            other => return Err(Error::Parse(format!("unknown event type {other:?}"))),
        };
        let object_rv = meta_str(&object, "resourceVersion");
        if !object_rv.is_empty() {
            *rv = object_rv.to_owned();
        }
        if ty == watch_event::Type::Bookmark {
            self.push(cache_up::Msg::Event(v1::WatchEvent {
                r#type: ty.into(),
                kind: Some(self.kind.proto()),
                resource_version: rv.clone(),
                object: Vec::new(),
            }))
            .await;
            self.row.bookmark(rv);
            return Ok(());
        }
        self.push_object(ty, object).await;
        self.row.event(rv, crate::clock::unix_millis());
        Ok(())
    }
}

/// Runs `f` when dropped (the watch gauge goes down however the task ends).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Splits a streamed body into lines.
#[derive(Debug, Default)]
struct LineBuffer {
    pending: Vec<u8>,
}

impl LineBuffer {
    fn push(&mut self, chunk: &Bytes) -> Result<Vec<Vec<u8>>> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let rest = self.pending.split_off(end + 1);
            let mut line = std::mem::replace(&mut self.pending, rest);
            line.pop();
            if !line.iter().all(u8::is_ascii_whitespace) {
                out.push(line);
            }
        }
        if self.pending.len() > MAX_LINE {
            return Err(Error::LineTooLong);
        }
        Ok(out)
    }

    fn finish(&mut self) -> Option<Vec<u8>> {
        let rest = std::mem::take(&mut self.pending);
        (!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn list_items_get_api_version_and_kind() {
        let kind = WatchedKind::new("apps", "v1", "deployments", "Deployment", true);
        let bytes = encode_object(
            &kind,
            json!({"metadata": {"name": "d", "resourceVersion": "7"}, "spec": {}}),
        );
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["apiVersion"], "apps/v1");
        assert_eq!(v["kind"], "Deployment");
        assert_eq!(v["metadata"]["name"], "d");
        // First, where the server writes them in a GET or a watch event
        // (kube-sim/fixtures/watch/configmaps.watch.jsonl).
        assert!(
            bytes.starts_with(br#"{"kind":"Deployment","apiVersion":"apps/v1","metadata""#),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        // An object that has them keeps its own order (a custom resource's
        // keys come sorted).
        let sorted = json!({"apiVersion": "x.io/v1", "kind": "Gadget", "metadata": {"name": "g"}});
        let bytes = encode_object(&kind, sorted.clone());
        assert_eq!(bytes, serde_json::to_vec(&sorted).unwrap());
    }

    #[test]
    fn secret_pages_and_events_never_hold_values() {
        let secret = json!({"metadata": {"name": "s", "resourceVersion": "3", "annotations": {
                crate::scrub::LAST_APPLIED_ANNOTATION: "{\"data\":{\"k\":\"U0VOVElORUw=\"}}"}},
            "data": {"k": "U0VOVElORUw="}, "stringData": {"x": "SENTINEL"}, "type": "Opaque"});
        let page = serde_json::to_vec(
            &json!({"metadata": {"resourceVersion": "9", "continue": "c"},
            "items": [secret.clone()]}),
        )
        .unwrap();
        let (meta, items) = parse_page(&page, true).unwrap();
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
        assert_eq!(meta.continue_token.as_deref(), Some("c"));
        let text = serde_json::to_string(&items).unwrap();
        assert!(
            !text.contains("U0VOVElORUw=") && !text.contains("SENTINEL"),
            "{text}"
        );
        assert!(text.contains("Opaque"));
        let line = serde_json::to_vec(&json!({"type": "ADDED", "object": secret})).unwrap();
        let (ty, obj) = parse_event(&line, true).unwrap();
        assert_eq!(ty, "ADDED");
        assert!(!obj.to_string().contains("SENTINEL"));
        // ConfigMaps keep their data.
        let (_, items) = parse_page(br#"{"items":[{"data":{"k":"v"}}]}"#, false).unwrap();
        assert_eq!(items[0]["data"]["k"], "v");
    }

    #[test]
    fn lines_split_across_chunks() {
        let mut b = LineBuffer::default();
        assert!(b.push(&Bytes::from_static(b"{\"a\"")).unwrap().is_empty());
        let lines = b
            .push(&Bytes::from_static(b":1}\n\n{\"b\":2}\n{\"c\""))
            .unwrap();
        assert_eq!(lines, vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]);
        assert_eq!(b.finish(), Some(b"{\"c\"".to_vec()));
    }

    #[test]
    fn lowest_version_and_encoding() {
        assert_eq!(lowest(&["12".into(), "9".into(), "100".into()]), "9");
        assert_eq!(lowest(&["x".into(), "9".into()]), "x");
        assert_eq!(lowest(&[]), "");
        assert_eq!(percent_encode("a b/+="), "a%20b%2F%2B%3D");
    }
}
