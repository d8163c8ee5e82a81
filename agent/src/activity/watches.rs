//! The watches running right now, one row per account and kind, for the
//! admin port's `/watches`. Each [`KindWatch`](super::watch::KindWatch)
//! holds a [`WatchRow`] that updates its row as it lists and watches and
//! removes it when the loop ends (aborted: the kind vanished, the stream
//! ended). The table lives in [`crate::metrics::Metrics`], so every task that
//! counts can reach it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// One watch's state, as `/watches` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchStatus {
    /// The account.
    pub account: String,
    /// `resource` or `resource.group`.
    pub kind: String,
    /// `listing` (a listing is in progress) or `watching`.
    pub phase: &'static str,
    /// The resourceVersion the watch stands at (the list's, then each
    /// event's and bookmark's); empty before the first listing ends.
    pub resource_version: String,
    /// Watch events (added, modified, deleted; not list items nor
    /// bookmarks) sent since the loop started.
    pub events_sent: u64,
    /// Listings started (the first one included).
    pub relists: u64,
    /// 410 Gone answers that made the kind list again.
    pub gone: u64,
    /// When the last watch event arrived, Unix milliseconds.
    pub last_event_unix_millis: Option<i64>,
}

/// The table of running watches. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct WatchTable {
    rows: Arc<Mutex<BTreeMap<u64, WatchStatus>>>,
    next: Arc<AtomicU64>,
}

impl WatchTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, WatchStatus>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a row for `kind` of `account`; it goes when the handle drops.
    pub fn register(&self, account: &str, kind: &str) -> WatchRow {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            WatchStatus {
                account: account.to_owned(),
                kind: kind.to_owned(),
                phase: "listing",
                resource_version: String::new(),
                events_sent: 0,
                relists: 0,
                gone: 0,
                last_event_unix_millis: None,
            },
        );
        WatchRow {
            table: self.clone(),
            id,
        }
    }

    /// Every running watch, sorted by account and kind.
    pub fn snapshot(&self) -> Vec<WatchStatus> {
        let mut rows: Vec<WatchStatus> = self.lock().values().cloned().collect();
        rows.sort_by(|a, b| (&a.account, &a.kind).cmp(&(&b.account, &b.kind)));
        rows
    }
}

/// One watch's row; removed from the table on drop.
#[derive(Debug)]
pub struct WatchRow {
    table: WatchTable,
    id: u64,
}

impl WatchRow {
    fn update(&self, f: impl FnOnce(&mut WatchStatus)) {
        if let Some(row) = self.table.lock().get_mut(&self.id) {
            f(row);
        }
    }

    /// A listing started.
    pub fn listing(&self) {
        self.update(|r| {
            r.phase = "listing";
            r.relists += 1;
        });
    }

    /// The listing ended (or the watch resumed) at `rv`; watching.
    pub fn watching(&self, rv: &str) {
        self.update(|r| {
            r.phase = "watching";
            r.resource_version = rv.to_owned();
        });
    }

    /// A bookmark moved the watch to `rv`.
    pub fn bookmark(&self, rv: &str) {
        self.update(|r| r.resource_version = rv.to_owned());
    }

    /// A watch event at `rv` was sent, at `unix_millis`.
    pub fn event(&self, rv: &str, unix_millis: i64) {
        self.update(|r| {
            r.resource_version = rv.to_owned();
            r.events_sent += 1;
            r.last_event_unix_millis = Some(unix_millis);
        });
    }

    /// A 410 Gone ended the watch.
    pub fn gone(&self) {
        self.update(|r| r.gone += 1);
    }
}

impl Drop for WatchRow {
    fn drop(&mut self) {
        self.table.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_their_watch_and_go_with_it() {
        let table = WatchTable::default();
        let pods = table.register("dev", "pods");
        let deployments = table.register("dev", "deployments.apps");
        pods.listing();
        pods.watching("10");
        pods.event("12", 1_000);
        pods.bookmark("15");
        pods.gone();
        pods.listing();
        let rows = table.snapshot();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].kind, "deployments.apps");
        let p = &rows[1];
        assert_eq!(
            (
                p.phase,
                p.resource_version.as_str(),
                p.events_sent,
                p.relists,
                p.gone
            ),
            ("listing", "15", 1, 2, 1)
        );
        assert_eq!(p.last_event_unix_millis, Some(1_000));
        drop(deployments);
        assert_eq!(table.snapshot().len(), 1);
        drop(pods);
        assert!(table.snapshot().is_empty());
    }
}
