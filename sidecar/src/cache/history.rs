//! The account's recent changes, for watches served from the cache: a ring
//! of [`Change`]s bounded by count ([`DEFAULT_WATCH_HISTORY`]), numbered by a
//! per-account sequence, with a `tokio::sync::watch` that says when the ring
//! grew. Watchers pull from their cursor ([`super::Cache::changes`]); the
//! cache never waits for a watcher.
//!
//! Every change carries a *position*: the kind's watch resourceVersion once
//! the change is applied. Positions never go down within a kind, and a change
//! is numbered after every change at a lower position, so a watch resuming
//! from resourceVersion `r` starts at the first change of its kind above `r`.
//! When the ring drops a change, its kind's compaction mark moves up to that
//! change: older resourceVersions are `410 Expired`, as etcd compaction makes
//! them on the real server, and a watcher whose cursor was behind a dropped
//! change of its kind has missed it and is ended with 410 too.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::watch;

use super::{Entry, KindKey, ObjectKey};

/// Changes kept per account for watches to resume from. A watch asking for
/// an older resourceVersion, or one that falls this far behind, gets 410.
pub const DEFAULT_WATCH_HISTORY: usize = 10_000;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    /// It appeared.
    Added,
    /// It changed.
    Modified,
    /// It went away.
    Deleted,
}

impl ChangeType {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change of one object, as watchers see it.
#[derive(Debug, Clone)]
pub struct Change {
    /// Its number in the account's sequence.
    pub seq: u64,
    /// The kind changed.
    pub kind: KindKey,
    /// Added, modified or deleted.
    pub ty: ChangeType,
    /// Namespace and name.
    pub key: ObjectKey,
    /// The object after the change (its last state for a deletion).
    pub object: Entry,
    /// The object before the change as the cache held it, so a selector
    /// watch sees an object that stops matching as DELETED.
    pub old: Option<Entry>,
    /// The kind's watch resourceVersion once this change is applied.
    pub position: u64,
}

/// A resourceVersion (or a watcher's place) older than the history holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too old resource version: {requested} ({oldest})")]
pub struct Expired {
    /// What the watch asked for or had reached.
    pub requested: u64,
    /// The oldest resourceVersion the kind can still be watched from.
    pub oldest: u64,
}

/// How far a kind's changes have been dropped from the ring.
#[derive(Debug, Clone, Copy, Default)]
struct Compaction {
    /// Changes of the kind numbered below this are gone.
    seq: u64,
    /// Position of the last change of the kind dropped.
    position: u64,
}

/// The ring of recent changes.
#[derive(Debug)]
pub struct History {
    ring: VecDeque<Arc<Change>>,
    limit: usize,
    next_seq: u64,
    compacted: HashMap<KindKey, Compaction>,
    grew: watch::Sender<u64>,
}

impl Default for History {
    fn default() -> Self {
        Self::with_limit(DEFAULT_WATCH_HISTORY)
    }
}

impl History {
    /// A history keeping at most `limit` changes (at least one).
    pub fn with_limit(limit: usize) -> Self {
        Self {
            ring: VecDeque::new(),
            limit: limit.max(1),
            next_seq: 0,
            compacted: HashMap::new(),
            grew: watch::channel(0).0,
        }
    }

    /// The most changes it keeps.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The number the next change gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Changes held.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether no change is held.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Told the next sequence number whenever changes are appended; closed
    /// when the cache is dropped (the account was removed).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.grew.subscribe()
    }

    /// Appends changes (already in order) and wakes the watchers once.
    pub fn extend(&mut self, changes: impl IntoIterator<Item = Change>) {
        let before = self.next_seq;
        for mut change in changes {
            change.seq = self.next_seq;
            self.next_seq += 1;
            if self.ring.len() == self.limit
                && let Some(dropped) = self.ring.pop_front()
            {
                let c = self.compacted.entry(dropped.kind.clone()).or_default();
                c.seq = dropped.seq + 1;
                c.position = c.position.max(dropped.position);
            }
            self.ring.push_back(Arc::new(change));
        }
        if self.next_seq != before {
            self.grew.send_replace(self.next_seq);
        }
    }

    /// The oldest resourceVersion `kind` can be watched from, given that its
    /// history began at `start`.
    pub fn oldest(&self, kind: &KindKey, start: u64) -> u64 {
        self.compacted
            .get(kind)
            .map_or(start, |c| c.position.max(start))
    }

    /// Where a watch of `kind` resuming after resourceVersion `rv` starts:
    /// the first change of the kind above it.
    pub fn cursor_after(&self, kind: &KindKey, rv: u64) -> u64 {
        let mut cursor = self.next_seq;
        for change in self.ring.iter().rev() {
            if change.kind != *kind {
                continue;
            }
            if change.position <= rv {
                break;
            }
            cursor = change.seq;
        }
        cursor
    }

    /// Up to `max` changes of `kind` from `cursor` on, and the cursor after
    /// the last one looked at; `None` when a change of the kind the watcher
    /// had not read yet was dropped.
    pub fn since(
        &self,
        kind: &KindKey,
        cursor: u64,
        max: usize,
    ) -> Option<(Vec<Arc<Change>>, u64)> {
        if self.compacted.get(kind).is_some_and(|c| c.seq > cursor) {
            return None;
        }
        let first = self.ring.front().map_or(self.next_seq, |c| c.seq);
        let skip = usize::try_from(cursor.saturating_sub(first)).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut next = cursor.max(first);
        for change in self.ring.iter().skip(skip) {
            if out.len() == max {
                break;
            }
            next = change.seq + 1;
            if change.kind == *kind {
                out.push(change.clone());
            }
        }
        Some((out, next))
    }
}
