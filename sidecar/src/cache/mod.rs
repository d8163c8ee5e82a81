//! One account's cache: the objects of every kind the agent watches, keyed by
//! namespace/name, and the cluster's discovery documents. The tunnel's cache
//! stream writes it ([`Cache::sync_start`], [`Cache::apply`],
//! [`Cache::sync_end`], [`Cache::set_discovery`]); the facade reads it.
//!
//! Delivery is at-least-once, so every write is idempotent: an event whose
//! resourceVersion is not newer than the stored object's changes nothing.
//!
//! Objects are kept as compact JSON text with their labels beside it, not as
//! parsed `serde_json::Value` trees: a tree costs several times the object's
//! JSON size (every map entry is a hashed, separately allocated key and a
//! large enum), while the text costs its size, lists are answered by
//! concatenating it, and label selectors need nothing but the labels. The few
//! readers that need fields (tables, field selectors) parse what they select
//! ([`Entry::object`]).
//!
//! Changes are also kept in a bounded [`history`] so the facade can serve
//! watches: events from the agent's watch newer than the kind's watch
//! position are recorded as they come; a re-listing (`SyncStart` …
//! `SyncEnd` of a kind already synced) is compared with what was held and
//! its differences recorded at `SyncEnd` — added and modified objects in
//! resourceVersion order, then the vanished ones as deletions.

pub mod history;
pub mod snapshot;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use spinlink_proto::v1::{self, watch_event::Type as EventType};
use tokio::sync::watch;

use history::{Change, ChangeType, Expired, History};

/// Why an event could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The event named no kind.
    #[error("event without a kind")]
    MissingKind,
    /// The object was not a JSON object.
    #[error("object of {kind} is not valid JSON: {source}")]
    InvalidObject {
        /// `resource.group`.
        kind: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The object has no `metadata.name`.
    #[error("object of {0} has no metadata.name")]
    MissingName(String),
    /// The event type is not one we know.
    #[error("unknown event type {0}")]
    UnknownType(i32),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Identifies a cached kind: group, version and plural resource name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KindKey {
    /// API group, empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
}

impl KindKey {
    /// The key of a kind from the wire.
    pub fn of(kind: &v1::Kind) -> Self {
        Self {
            group: kind.group.clone(),
            version: kind.version.clone(),
            resource: kind.resource.clone(),
        }
    }

    /// `apiVersion` of objects of this kind (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Namespace (empty for cluster-scoped objects) and name.
pub type ObjectKey = (String, String);

/// One cached object.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The object as the agent sent it (kind and apiVersion filled in), as
    /// the API server writes it ([`object_text`]). Shared, so readers copy
    /// it out of the lock cheaply.
    json: Arc<str>,
    /// `metadata.labels` (the string-valued ones) in one allocation:
    /// `key NUL value NUL` per label. One allocation, not two per label,
    /// because a selector LIST reads the labels of every object of the kind
    /// and each separate allocation is a cache miss (bench/: p50 21 → 16 ms
    /// at 100,000 pods). Labels with a NUL in them, which an API server
    /// never stores, are left out.
    labels: Box<str>,
    /// Its resourceVersion.
    pub resource_version: String,
    /// The kind's generation when the object was last seen.
    generation: u64,
}

impl Entry {
    fn new(object: &Value, resource_version: String, generation: u64) -> Self {
        let mut labels = String::new();
        let map = object
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        for (k, v) in map.into_iter().flatten() {
            if let Some(v) = v.as_str()
                && !k.contains('\0')
                && !v.contains('\0')
            {
                labels.push_str(k);
                labels.push('\0');
                labels.push_str(v);
                labels.push('\0');
            }
        }
        Entry {
            // As the API server writes it ([`spinlink_kube_api::json`]):
            // what the facade answers and streams is this text.
            json: object_text(object).into(),
            labels: labels.into_boxed_str(),
            resource_version,
            generation,
        }
    }

    /// The object as compact JSON text.
    pub fn json(&self) -> &Arc<str> {
        &self.json
    }

    /// The object parsed: for readers that need its fields. Costs a parse.
    pub fn object(&self) -> Value {
        serde_json::from_str(&self.json).unwrap_or(Value::Null)
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        let mut parts = self.labels.split('\0');
        while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
            if k == key {
                return Some(v);
            }
        }
        None
    }
}

/// The cached objects of one kind.
#[derive(Debug, Clone)]
pub struct CachedKind {
    /// The kind as the agent described it.
    pub info: v1::Kind,
    /// Objects by namespace/name, so lists come out sorted.
    pub objects: BTreeMap<ObjectKey, Entry>,
    /// The highest resourceVersion seen for this kind (objects, bookmarks, lists).
    pub resource_version: String,
    /// A full listing has completed: the cache can answer for this kind.
    pub synced: bool,
    /// Incremented by every `SyncStart`; objects not seen in the current
    /// generation are dropped by `SyncEnd`.
    generation: u64,
    /// Where the kind's recorded changes stand.
    watch: WatchState,
}

/// A kind's place in the [`history`].
#[derive(Debug, Clone, Default)]
struct WatchState {
    /// Every change up to this resourceVersion is recorded: a watch from
    /// here misses nothing. Moves with recorded changes, the agent's
    /// bookmarks and `SyncEnd`; not during a re-listing, whose changes are
    /// recorded only at its end.
    position: u64,
    /// The position when the kind first synced: its history starts there.
    start: u64,
    /// A re-listing of a synced kind is under way.
    resync: Option<Resync>,
}

/// The differences a re-listing found so far.
#[derive(Debug, Clone)]
struct Resync {
    /// The position when it began.
    from: u64,
    /// Added and modified objects (numbered and positioned at `SyncEnd`).
    changes: Vec<Change>,
}

/// `object` as the API server writes one in a GET or a watch event: compact
/// JSON, escaped as Go escapes ([`spinlink_kube_api::json`]), in the order
/// it came — but `kind` and `apiVersion` that end it (agents before this
/// one appended them to the items of a built-in kind's list, which lack
/// them) go first, where the server writes them. (A custom resource's
/// keys come sorted, so never with those two last.)
fn object_text(object: &Value) -> String {
    let mut out = Vec::with_capacity(256);
    match object.as_object() {
        Some(map) => {
            out.push(b'{');
            let n = map.len();
            let appended = n >= 2
                && map
                    .keys()
                    .skip(n - 2)
                    .eq(["apiVersion", "kind"].iter().copied());
            let first: &[&str] = if appended {
                &["kind", "apiVersion"]
            } else {
                &[]
            };
            let members = first
                .iter()
                .filter_map(|k| map.get_key_value(*k))
                .chain(map.iter().filter(|(k, _)| !first.contains(&k.as_str())));
            for (i, (key, value)) in members.enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Writing strings and `Value`s into memory cannot fail.
                let _ = serde_json::to_writer(&mut out, key);
                out.push(b':');
                let _ = serde_json::to_writer(&mut out, value);
            }
            out.push(b'}');
        }
        None => {
            let _ = serde_json::to_writer(&mut out, object);
        }
    }
    let out = spinlink_kube_api::json::escape_text(out);
    // serde_json wrote text, and escaping replaced ASCII bytes only.
    String::from_utf8(out).unwrap_or_default()
}

/// Fuzz body: any object an agent sends (JSON, as an event carries it).
/// Its text reads back as the same object; the members
/// [`type_members_len`] finds are its `kind` and `apiVersion`, and what is
/// left is the object without them; and the scan takes any text without
/// panicking.
pub fn fuzz_object_text(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = type_members_len(text);
    }
    let Ok(object) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let text = object_text(&object);
    let back: Value = serde_json::from_str(&text).expect("an object's text is JSON");
    assert_eq!(back, object);
    if let Some(skip) = type_members_len(&text) {
        let rest: Value = serde_json::from_str(&format!("{{{}", &text[1 + skip..]))
            .expect("the rest is an object");
        let mut without = object;
        let map = without.as_object_mut().expect("only objects have members");
        map.shift_remove("kind");
        map.shift_remove("apiVersion");
        assert_eq!(rest, without);
    }
}

/// How many bytes after the opening `{` of an object's text
/// ([`object_text`]) its leading `"kind":…,"apiVersion":…,` (in either
/// order) take: what the API server leaves out of the items of a built-in
/// kind's LIST. `None` when the text does not start with both.
pub fn type_members_len(text: &str) -> Option<usize> {
    const KIND: &[u8] = b"\"kind\":";
    const API_VERSION: &[u8] = b"\"apiVersion\":";
    let b = text.as_bytes();
    let mut at = 1;
    let order = if b.get(at..)?.starts_with(KIND) {
        [KIND, API_VERSION]
    } else {
        [API_VERSION, KIND]
    };
    for key in order {
        if !b.get(at..)?.starts_with(key) {
            return None;
        }
        at += key.len();
        // A JSON string: to its closing quote, over escapes.
        if b.get(at) != Some(&b'"') {
            return None;
        }
        at += 1;
        loop {
            match *b.get(at)? {
                b'\\' => at += 2,
                b'"' => break,
                _ => at += 1,
            }
        }
        at += 1;
        if b.get(at) != Some(&b',') {
            return None;
        }
        at += 1;
    }
    Some(at - 1)
}

/// A resourceVersion as a number, when it is one (the API server's always are).
pub fn rv_number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

impl CachedKind {
    fn new(info: &v1::Kind) -> Self {
        Self {
            info: info.clone(),
            objects: BTreeMap::new(),
            resource_version: String::new(),
            synced: false,
            generation: 0,
            watch: WatchState::default(),
        }
    }

    fn advance_rv(&mut self, rv: &str) {
        if !rv.is_empty() && is_newer(rv, &self.resource_version) {
            self.resource_version = rv.to_owned();
        }
    }

    /// Whether an agent can resume this kind instead of listing it: it is
    /// synced and has a resourceVersion to resume from.
    pub fn resumable(&self) -> bool {
        self.synced && !self.resource_version.is_empty()
    }

    /// Whether watches of this kind can be served from the cache: it is
    /// synced and its resourceVersions are numbers.
    pub fn watchable(&self) -> bool {
        self.synced && rv_number(&self.resource_version).is_some()
    }

    /// The resourceVersion a watch is at once it has every recorded change.
    pub fn watch_position(&self) -> u64 {
        self.watch.position
    }
}

/// A discovery document served as the agent sent it.
#[derive(Debug, Clone)]
pub struct Document {
    /// Its content type.
    pub content_type: String,
    /// Its body.
    pub body: Bytes,
    /// The API server's `ETag` of an aggregated document, worked out once
    /// ([`spinlink_kube_api::discovery::etag`]).
    pub etag: Option<http::HeaderValue>,
}

/// What [`Cache::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The object was stored.
    Upserted,
    /// The object was removed.
    Deleted,
    /// Nothing changed: the event was not newer, or deleted what was not there.
    Unchanged,
    /// Only the kind's resourceVersion moved.
    Bookmark,
}

/// One account's cache.
#[derive(Debug, Default)]
pub struct Cache {
    kinds: HashMap<KindKey, CachedKind>,
    discovery: HashMap<String, Document>,
    /// SHA-256 of the discovery snapshot (see [`Cache::discovery_digest`]).
    discovery_digest: [u8; 32],
    history: History,
}

/// A watch's start, taken under one lock so no change falls between the
/// objects it is sent and the changes it follows.
#[derive(Debug)]
pub struct WatchStart {
    /// Tells when changes were appended.
    pub grew: watch::Receiver<u64>,
    /// The first change to read.
    pub cursor: u64,
    /// The kind's watch position now.
    pub position: u64,
    /// The objects held now, when the watch starts from the current state.
    pub objects: Vec<(ObjectKey, Entry)>,
}

/// Changes a watcher has not read yet.
#[derive(Debug)]
pub struct WatchBatch {
    /// In order.
    pub changes: Vec<Arc<Change>>,
    /// The cursor after them.
    pub cursor: u64,
    /// Whether this is everything recorded so far.
    pub caught_up: bool,
    /// The kind's watch position (meaningful when caught up).
    pub position: u64,
}

/// SHA-256 of a discovery snapshot, independent of the documents' order.
fn snapshot_digest(documents: &[v1::Document]) -> [u8; 32] {
    let mut sorted: Vec<&v1::Document> = documents.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for d in sorted {
        // Length-prefixed, so no two different snapshots hash the same bytes.
        for field in [d.path.as_bytes(), d.content_type.as_bytes(), &d.body] {
            ctx.update(&(field.len() as u64).to_be_bytes());
            ctx.update(field);
        }
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// `a` is newer than `b`: compared as integers when both are, else assumed.
pub fn is_newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => true,
    }
}

impl Cache {
    /// An empty cache whose history keeps at most `limit` changes.
    pub fn with_history(limit: usize) -> Self {
        Self {
            history: History::with_limit(limit),
            ..Self::default()
        }
    }

    /// Begins a full listing of `kind`.
    pub fn sync_start(&mut self, kind: &v1::Kind) {
        let entry = self
            .kinds
            .entry(KindKey::of(kind))
            .or_insert_with(|| CachedKind::new(kind));
        entry.info = kind.clone();
        entry.generation += 1;
        // A listing that starts again before it ended keeps what it found.
        if entry.synced && entry.watch.resync.is_none() {
            entry.watch.resync = Some(Resync {
                from: entry.watch.position,
                changes: Vec::new(),
            });
        }
    }

    /// Ends a full listing of `kind`: drops the objects not seen since its
    /// `SyncStart` and marks the kind synced. Returns how many were dropped.
    /// A re-listing's differences go to the history (see the module docs).
    pub fn sync_end(&mut self, kind: &v1::Kind, resource_version: &str) -> usize {
        let key = KindKey::of(kind);
        let entry = self
            .kinds
            .entry(key.clone())
            .or_insert_with(|| CachedKind::new(kind));
        let generation = entry.generation;
        let before = entry.objects.len();
        let vanished: Vec<ObjectKey> = entry
            .objects
            .iter()
            .filter(|(_, e)| e.generation < generation)
            .map(|(k, _)| k.clone())
            .collect();
        let mut deleted = Vec::new();
        for k in vanished {
            if let Some(old) = entry.objects.remove(&k) {
                deleted.push((k, old));
            }
        }
        let first = !entry.synced;
        entry.synced = true;
        entry.advance_rv(resource_version);
        let end = rv_number(&entry.resource_version).unwrap_or(0);
        if first {
            entry.watch = WatchState {
                position: end,
                start: end,
                resync: None,
            };
        } else if let Some(resync) = entry.watch.resync.take() {
            // Added and modified in resourceVersion order, so every change
            // sits above the objects before it and a resume from any of them
            // misses nothing; then the deletions, which the listing proves
            // happened by its end. A deleted object keeps its last
            // resourceVersion: a watch resuming from it replays, never skips.
            let mut changes = resync.changes;
            changes.sort_by_key(|c| rv_number(&c.object.resource_version).unwrap_or(0));
            let mut position = resync.from;
            for c in &mut changes {
                position = position.max(rv_number(&c.object.resource_version).unwrap_or(0));
                c.position = position;
            }
            position = position.max(end);
            changes.extend(deleted.into_iter().map(|(k, old)| Change {
                seq: 0,
                kind: key.clone(),
                ty: ChangeType::Deleted,
                key: k,
                object: old.clone(),
                old: Some(old),
                position,
            }));
            entry.watch.position = position;
            self.history.extend(changes);
        }
        before - entry.objects.len()
    }

    /// Applies a watch event.
    pub fn apply(&mut self, event: &v1::WatchEvent) -> Result<Applied> {
        let kind = event.kind.as_ref().ok_or(Error::MissingKind)?;
        let ty = EventType::try_from(event.r#type).map_err(|_| Error::UnknownType(event.r#type))?;
        let kind_key = KindKey::of(kind);
        let cached = self
            .kinds
            .entry(kind_key.clone())
            .or_insert_with(|| CachedKind::new(kind));
        if ty == EventType::Bookmark {
            cached.advance_rv(&event.resource_version);
            if cached.synced
                && cached.watch.resync.is_none()
                && let Some(rv) = rv_number(&event.resource_version)
            {
                cached.watch.position = cached.watch.position.max(rv);
            }
            return Ok(Applied::Bookmark);
        }
        let change_type = match ty {
            EventType::Added => ChangeType::Added,
            EventType::Modified => ChangeType::Modified,
            EventType::Deleted => ChangeType::Deleted,
            EventType::Unspecified | EventType::Bookmark => {
                return Err(Error::UnknownType(event.r#type));
            }
        };
        let label = || format!("{}.{}", kind.resource, kind.group);
        let mut object: Value =
            serde_json::from_slice(&event.object).map_err(|source| Error::InvalidObject {
                kind: label(),
                source,
            })?;
        let meta = object.get("metadata");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| Error::MissingName(label()))?
            .to_owned();
        let namespace = meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let rv = if event.resource_version.is_empty() {
            meta.and_then(|m| m.get("resourceVersion"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        } else {
            event.resource_version.clone()
        };
        let key = (namespace, name);
        let generation = cached.generation;
        // An event of the watch the kind follows that is past its position:
        // watchers get it whatever the cache held (a folded write may have
        // put that very version there already).
        let fresh = cached.synced
            && cached.watch.resync.is_none()
            && rv_number(&rv).is_some_and(|n| n > cached.watch.position);
        if let Some(map) = object.as_object_mut() {
            let api_version = kind_key.api_version();
            map.entry("kind")
                .or_insert_with(|| Value::from(kind.kind.clone()));
            map.entry("apiVersion")
                .or_insert_with(|| Value::from(api_version));
        }
        let entry = Entry::new(&object, rv.clone(), generation);
        if fresh {
            let position = rv_number(&rv).unwrap_or_default();
            cached.watch.position = position;
            let change = Change {
                seq: 0,
                kind: kind_key.clone(),
                ty: change_type,
                key: key.clone(),
                object: entry.clone(),
                old: cached.objects.get(&key).cloned(),
                position,
            };
            self.history.extend([change]);
        }
        if let Some(existing) = cached.objects.get_mut(&key)
            && !is_newer(&rv, &existing.resource_version)
        {
            // A replay of what we hold: it still counts as seen in a listing.
            existing.generation = generation;
            return Ok(Applied::Unchanged);
        }
        cached.advance_rv(&rv);
        if ty == EventType::Deleted {
            let Some(old) = cached.objects.remove(&key) else {
                return Ok(Applied::Unchanged);
            };
            if let Some(resync) = &mut cached.watch.resync {
                resync.changes.push(Change {
                    seq: 0,
                    kind: kind_key,
                    ty: ChangeType::Deleted,
                    key,
                    object: entry,
                    old: Some(old),
                    position: 0,
                });
            }
            return Ok(Applied::Deleted);
        }
        let old = cached.objects.insert(key.clone(), entry);
        if let Some(resync) = &mut cached.watch.resync
            && let Some(new) = cached.objects.get(&key)
        {
            resync.changes.push(Change {
                seq: 0,
                kind: kind_key,
                ty: if old.is_some() {
                    ChangeType::Modified
                } else {
                    ChangeType::Added
                },
                key,
                object: new.clone(),
                old,
                position: 0,
            });
        }
        Ok(Applied::Upserted)
    }

    /// Starts a watch of `kind`: from the current state (`from` is `None`:
    /// its objects, then what changes after them) or after resourceVersion
    /// `from`. `None` when the kind cannot be watched here (see
    /// [`CachedKind::watchable`]). Only the objects `select` takes are sent.
    pub fn watch(
        &self,
        kind: &KindKey,
        from: Option<u64>,
        select: impl Fn(&ObjectKey, &Entry) -> bool,
    ) -> Option<Result<WatchStart, Expired>> {
        let cached = self.kinds.get(kind).filter(|k| k.watchable())?;
        let position = cached.watch.position;
        let (cursor, objects) = match from {
            None => (
                self.history.next_seq(),
                cached
                    .objects
                    .iter()
                    .filter(|(k, e)| select(k, e))
                    .map(|(k, e)| (k.clone(), e.clone()))
                    .collect(),
            ),
            Some(rv) => {
                let oldest = self.history.oldest(kind, cached.watch.start);
                if rv < oldest {
                    return Some(Err(Expired {
                        requested: rv,
                        oldest,
                    }));
                }
                (self.history.cursor_after(kind, rv), Vec::new())
            }
        };
        Some(Ok(WatchStart {
            grew: self.history.subscribe(),
            cursor,
            position,
            objects,
        }))
    }

    /// Up to `max` changes of `kind` from `cursor` on; `Expired` when the
    /// watcher fell so far behind that some it had not read were dropped
    /// (`reached` is the resourceVersion it had got to, for the message).
    pub fn changes(
        &self,
        kind: &KindKey,
        cursor: u64,
        max: usize,
        reached: u64,
    ) -> Result<WatchBatch, Expired> {
        let expired = || Expired {
            requested: reached,
            oldest: self.history.oldest(kind, reached),
        };
        let position = self.kinds.get(kind).map_or(reached, |k| k.watch.position);
        let (changes, cursor) = self.history.since(kind, cursor, max).ok_or_else(expired)?;
        Ok(WatchBatch {
            changes,
            caught_up: cursor == self.history.next_seq(),
            cursor,
            position,
        })
    }

    /// The change history (for tests and metrics).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Folds the object a relayed write answered with into the cache, so the
    /// writer's next read sees its write (read-your-writes). Only kinds that
    /// are cached are touched, only if the object is newer than what is held,
    /// and the kind's resourceVersion does not move: a list served now must
    /// not claim events it has not seen. `gone` removes it (a DELETE that
    /// finished). Returns what it did.
    pub fn fold_write(&mut self, key: &KindKey, object: &Value, gone: bool) -> Applied {
        let Some(cached) = self.kinds.get_mut(key) else {
            return Applied::Unchanged;
        };
        let meta = object.get("metadata");
        let field = |f: &str| {
            meta.and_then(|m| m.get(f))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (name, namespace, rv) = (field("name"), field("namespace"), field("resourceVersion"));
        if name.is_empty() || rv.is_empty() {
            return Applied::Unchanged;
        }
        let key = (namespace, name);
        match cached.objects.get(&key) {
            Some(existing) if !is_newer(&rv, &existing.resource_version) => {
                return Applied::Unchanged;
            }
            // Absent, and the watch has already gone past this version: the
            // object was deleted after the write (its DELETED event came
            // first). Inserting it would bring back a phantom.
            None if !gone && !is_newer(&rv, &cached.resource_version) => {
                return Applied::Unchanged;
            }
            _ => {}
        }
        if gone {
            return match cached.objects.remove(&key) {
                Some(_) => Applied::Deleted,
                None => Applied::Unchanged,
            };
        }
        let generation = cached.generation;
        cached
            .objects
            .insert(key, Entry::new(object, rv, generation));
        Applied::Upserted
    }

    /// Replaces the discovery documents.
    pub fn set_discovery(&mut self, documents: Vec<v1::Document>) {
        self.discovery_digest = snapshot_digest(&documents);
        self.discovery = documents
            .into_iter()
            .map(|d| {
                let etag = d
                    .path
                    .ends_with(spinlink_proto::aggregated::PATH_SUFFIX)
                    .then(|| spinlink_kube_api::discovery::etag(&d.body))
                    .flatten();
                (
                    d.path,
                    Document {
                        content_type: d.content_type,
                        body: Bytes::from(d.body),
                        etag,
                    },
                )
            })
            .collect();
    }

    /// The discovery document at exactly `path`.
    pub fn discovery(&self, path: &str) -> Option<&Document> {
        self.discovery.get(path)
    }

    /// Whether any discovery document is held.
    pub fn has_discovery(&self) -> bool {
        !self.discovery.is_empty()
    }

    /// A digest of the discovery snapshot's content (paths, content types
    /// and bodies, in path order): it changes exactly when the cluster's API
    /// surface does (a CRD added or removed), not when the same snapshot is
    /// sent again after a reconnect. The facade's OpenAPI cache keys on it.
    pub fn discovery_digest(&self) -> [u8; 32] {
        self.discovery_digest
    }

    /// The kind at group/version/resource, synced or not.
    pub fn kind(&self, group: &str, version: &str, resource: &str) -> Option<&CachedKind> {
        self.kinds.get(&KindKey {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
        })
    }

    /// Every kind with the resourceVersion held, for `ResumeFrom`.
    pub fn kinds(&self) -> impl Iterator<Item = &CachedKind> {
        self.kinds.values()
    }

    /// Forgets every kind and the history of their changes (the history's
    /// watchers end: its notifier goes with it). Discovery stays.
    pub fn clear_kinds(&mut self) {
        self.kinds.clear();
        self.history = History::with_limit(self.history.limit());
    }

    /// Kinds synced, kinds known, objects held.
    pub fn counts(&self) -> (usize, usize, usize) {
        let synced = self.kinds.values().filter(|k| k.synced).count();
        let objects = self.kinds.values().map(|k| k.objects.len()).sum();
        (synced, self.kinds.len(), objects)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fuzz_object_texts() {
        spinlink_fuzzing::Fuzz::new("sidecar cached object text")
            .seeds([
                br#"{"metadata":{"name":"a"},"apiVersion":"v1","kind":"ConfigMap"}"#.to_vec(),
                br#"{"kind":"K\"","apiVersion":"v\\","data":{"x":"<&>"}}"#.to_vec(),
                br#"{"apiVersion":"x.io/v1","kind":"G","spec":{}}"#.to_vec(),
                br#"{"kind":"K","apiVersion":1,"a":[]}"#.to_vec(),
                // A number read back one ulp off without serde_json's
                // `float_roundtrip` (found by cargo-fuzz).
                b"1155555555557555555555555\n\n".to_vec(),
                br#"{"n":1155555555557555555555555,"f":0.1}"#.to_vec(),
            ])
            .run(fuzz_object_text);
    }

    /// An object's text starts with `kind` and `apiVersion` whatever order
    /// it came in (an agent appends them to list items), escapes what Go
    /// escapes, and says how long those two members are.
    #[test]
    fn object_texts_are_written_as_the_server_writes_objects() {
        let item = json!({"metadata": {"name": "a"}, "data": {"x": "<&>"},
                          "apiVersion": "v1", "kind": "ConfigMap"});
        // Sorted keys (a custom resource's) stay as they are.
        let sorted = json!({"apiVersion": "x.io/v1", "kind": "G", "metadata": {}, "spec": {}});
        assert_eq!(
            object_text(&sorted),
            serde_json::to_string(&sorted).unwrap()
        );
        let text = object_text(&item);
        assert_eq!(
            text,
            r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a"},"data":{"x":"\u003c\u0026\u003e"}}"#
        );
        let skip = type_members_len(&text).unwrap();
        assert_eq!(
            format!("{{{}", &text[1 + skip..]),
            r#"{"metadata":{"name":"a"},"data":{"x":"\u003c\u0026\u003e"}}"#
        );
        // Strings with escapes in them are stepped over whole.
        let odd = object_text(&json!({"a": 1, "apiVersion": "g/v", "kind": "K\"\\"}));
        let skip = type_members_len(&odd).unwrap();
        assert_eq!(&odd[1 + skip..], r#""a":1}"#);
        // Without both there is nothing to leave out.
        let skip = type_members_len(&object_text(&sorted)).unwrap();
        assert_eq!(
            &object_text(&sorted)[1 + skip..],
            r#""metadata":{},"spec":{}}"#
        );
        for v in [
            json!({"kind": "K", "a": 1}),
            json!({"apiVersion": "v1"}),
            json!({"apiVersion": "v1", "a": 1, "kind": "K"}),
            json!({}),
        ] {
            assert_eq!(type_members_len(&object_text(&v)), None, "{v}");
        }
        assert_eq!(type_members_len(r#"{"kind":"K","apiVersion":"v"}"#), None);
        assert_eq!(type_members_len(r#"{"kind":"K"#), None);
    }

    pub(crate) fn pods() -> v1::Kind {
        v1::Kind {
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
            kind: "Pod".into(),
            namespaced: true,
        }
    }

    pub(crate) fn event(
        ty: EventType,
        ns: &str,
        name: &str,
        rv: &str,
        extra: Value,
    ) -> v1::WatchEvent {
        let object = json!({"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}, "spec": extra});
        v1::WatchEvent {
            r#type: ty as i32,
            kind: Some(pods()),
            resource_version: rv.into(),
            object: serde_json::to_vec(&object).unwrap(),
        }
    }

    fn spec_of(c: &Cache, ns: &str, name: &str) -> Option<Value> {
        c.kind("", "v1", "pods")?
            .objects
            .get(&(ns.into(), name.into()))
            .map(|e| e.object()["spec"].clone())
    }

    #[test]
    fn older_or_equal_rv_is_a_no_op() {
        let mut c = Cache::default();
        assert_eq!(
            c.apply(&event(EventType::Added, "a", "p", "10", json!(1)))
                .unwrap(),
            Applied::Upserted
        );
        assert_eq!(
            c.apply(&event(EventType::Modified, "a", "p", "10", json!(2)))
                .unwrap(),
            Applied::Unchanged
        );
        assert_eq!(
            c.apply(&event(EventType::Modified, "a", "p", "9", json!(3)))
                .unwrap(),
            Applied::Unchanged
        );
        assert_eq!(spec_of(&c, "a", "p"), Some(json!(1)));
        c.apply(&event(EventType::Modified, "a", "p", "11", json!(4)))
            .unwrap();
        assert_eq!(spec_of(&c, "a", "p"), Some(json!(4)));
        // Not integers: applied.
        c.apply(&event(EventType::Modified, "a", "p", "x", json!(5)))
            .unwrap();
        assert_eq!(spec_of(&c, "a", "p"), Some(json!(5)));
    }

    #[test]
    fn folded_writes_are_seen_without_moving_the_kind_rv() {
        let mut c = Cache::default();
        let key = KindKey::of(&pods());
        let obj = |rv: &str, spec: i32| {
            json!({"kind": "Pod", "apiVersion": "v1",
                   "metadata": {"name": "p", "namespace": "a", "resourceVersion": rv}, "spec": spec})
        };
        // A kind that is not cached is left alone.
        assert_eq!(c.fold_write(&key, &obj("5", 1), false), Applied::Unchanged);
        c.sync_start(&pods());
        c.sync_end(&pods(), "4");
        assert_eq!(c.fold_write(&key, &obj("5", 1), false), Applied::Upserted);
        assert_eq!(spec_of(&c, "a", "p"), Some(json!(1)));
        assert_eq!(c.kind("", "v1", "pods").unwrap().resource_version, "4");
        // The watch event of the same write changes nothing; an older one neither.
        assert_eq!(
            c.apply(&event(EventType::Modified, "a", "p", "5", json!(9)))
                .unwrap(),
            Applied::Unchanged
        );
        assert_eq!(c.fold_write(&key, &obj("3", 2), false), Applied::Unchanged);
        assert_eq!(c.fold_write(&key, &obj("6", 3), true), Applied::Deleted);
        assert_eq!(spec_of(&c, "a", "p"), None);
        // A write answered before a delete whose event arrived first: the
        // watch is past the write, so the answer must not resurrect it.
        c.apply(&event(EventType::Added, "a", "q", "20", json!(1)))
            .unwrap();
        c.apply(&event(EventType::Deleted, "a", "q", "22", json!(1)))
            .unwrap();
        let q = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "q", "namespace": "a", "resourceVersion": "21"}});
        assert_eq!(c.fold_write(&key, &q, false), Applied::Unchanged);
        assert_eq!(spec_of(&c, "a", "q"), None);
    }

    #[test]
    fn kind_and_api_version_are_filled_in() {
        let mut c = Cache::default();
        c.apply(&event(EventType::Added, "a", "p", "1", json!(1)))
            .unwrap();
        let k = c.kind("", "v1", "pods").unwrap();
        let o = k.objects[&("a".to_owned(), "p".to_owned())].object();
        assert_eq!(o["kind"], "Pod");
        assert_eq!(o["apiVersion"], "v1");
    }

    #[test]
    fn entries_keep_compact_json_and_string_labels() {
        let mut c = Cache::default();
        let object = json!({"metadata": {"name": "p", "namespace": "a", "resourceVersion": "3",
            "labels": {"tier": "web", "app": "x", "odd": 1, "empty": "", "nul\0": "x"}}, "spec": {"n": [1, 2]}});
        let mut e = event(EventType::Added, "a", "p", "3", json!(0));
        e.object = serde_json::to_vec_pretty(&object).unwrap();
        c.apply(&e).unwrap();
        let entry = &c.kind("", "v1", "pods").unwrap().objects[&("a".to_owned(), "p".to_owned())];
        assert_eq!(entry.label("app"), Some("x"));
        assert_eq!(entry.label("tier"), Some("web"));
        // Not a string: no label value a selector could match.
        assert_eq!(entry.label("odd"), None);
        assert_eq!(entry.label("missing"), None);
        assert_eq!(entry.label("empty"), Some(""));
        assert_eq!(entry.label("nul\0"), None);
        assert_eq!(entry.label(""), None);
        assert!(
            !entry.json().contains('\n'),
            "stored compact: {}",
            entry.json()
        );
        let mut want = object.clone();
        want["kind"] = json!("Pod");
        want["apiVersion"] = json!("v1");
        assert_eq!(entry.object(), want);
    }

    #[test]
    fn deletes_remove_and_stale_deletes_do_not() {
        let mut c = Cache::default();
        c.apply(&event(EventType::Added, "a", "p", "5", json!(1)))
            .unwrap();
        assert_eq!(
            c.apply(&event(EventType::Deleted, "a", "p", "4", json!(1)))
                .unwrap(),
            Applied::Unchanged
        );
        assert!(spec_of(&c, "a", "p").is_some());
        assert_eq!(
            c.apply(&event(EventType::Deleted, "a", "p", "6", json!(1)))
                .unwrap(),
            Applied::Deleted
        );
        assert!(spec_of(&c, "a", "p").is_none());
        assert_eq!(
            c.apply(&event(EventType::Deleted, "a", "p", "7", json!(1)))
                .unwrap(),
            Applied::Unchanged
        );
    }

    #[test]
    fn sync_drops_vanished_objects_and_keeps_replayed_ones() {
        let mut c = Cache::default();
        c.sync_start(&pods());
        for (n, rv) in [("p1", "1"), ("p2", "2"), ("p3", "3")] {
            c.apply(&event(EventType::Added, "a", n, rv, json!(0)))
                .unwrap();
        }
        assert!(!c.kind("", "v1", "pods").unwrap().synced);
        assert_eq!(c.sync_end(&pods(), "3"), 0);
        assert!(c.kind("", "v1", "pods").unwrap().synced);
        assert_eq!(c.counts(), (1, 1, 3));

        // Relist: p1 unchanged (same rv), p3 newer, p2 gone.
        c.sync_start(&pods());
        c.apply(&event(EventType::Added, "a", "p1", "1", json!(0)))
            .unwrap();
        c.apply(&event(EventType::Added, "a", "p3", "9", json!(9)))
            .unwrap();
        assert_eq!(c.sync_end(&pods(), "10"), 1);
        assert!(spec_of(&c, "a", "p1").is_some());
        assert!(spec_of(&c, "a", "p2").is_none());
        assert_eq!(spec_of(&c, "a", "p3"), Some(json!(9)));
        assert_eq!(c.kind("", "v1", "pods").unwrap().resource_version, "10");
    }

    #[test]
    fn bookmark_only_moves_the_kind_rv() {
        let mut c = Cache::default();
        c.apply(&event(EventType::Added, "a", "p", "5", json!(1)))
            .unwrap();
        let bookmark = v1::WatchEvent {
            r#type: EventType::Bookmark as i32,
            kind: Some(pods()),
            resource_version: "42".into(),
            object: Vec::new(),
        };
        assert_eq!(c.apply(&bookmark).unwrap(), Applied::Bookmark);
        let k = c.kind("", "v1", "pods").unwrap();
        assert_eq!(k.resource_version, "42");
        assert_eq!(k.objects.len(), 1);
    }

    #[test]
    fn bad_objects_are_errors_not_panics() {
        let mut c = Cache::default();
        let mut e = event(EventType::Added, "a", "p", "1", json!(1));
        e.object = b"{not json".to_vec();
        assert!(matches!(c.apply(&e), Err(Error::InvalidObject { .. })));
        e.object = br#"{"metadata":{}}"#.to_vec();
        assert!(matches!(c.apply(&e), Err(Error::MissingName(_))));
        e.kind = None;
        assert!(matches!(c.apply(&e), Err(Error::MissingKind)));
        e.kind = Some(pods());
        e.r#type = 99;
        assert!(matches!(c.apply(&e), Err(Error::UnknownType(99))));
    }

    fn kinds_of(c: &Cache, from: u64) -> Vec<(ChangeType, String, u64)> {
        let start = c
            .watch(&KindKey::of(&pods()), Some(from), |_, _| true)
            .unwrap()
            .unwrap();
        let batch = c
            .changes(&KindKey::of(&pods()), start.cursor, usize::MAX, from)
            .unwrap();
        assert!(batch.caught_up);
        batch
            .changes
            .iter()
            .map(|ch| (ch.ty, ch.key.1.clone(), ch.position))
            .collect()
    }

    fn synced(c: &mut Cache, objects: &[(&str, &str)], rv: &str) {
        c.sync_start(&pods());
        for (n, r) in objects {
            c.apply(&event(EventType::Added, "a", n, r, json!(0)))
                .unwrap();
        }
        c.sync_end(&pods(), rv);
    }

    #[test]
    fn watch_events_are_recorded_in_order_and_replays_are_not() {
        let mut c = Cache::default();
        synced(&mut c, &[("p", "5")], "10");
        assert!(c.history().is_empty(), "a first listing is no change");
        c.apply(&event(EventType::Modified, "a", "p", "11", json!(1)))
            .unwrap();
        c.apply(&event(EventType::Added, "a", "q", "12", json!(1)))
            .unwrap();
        // The agent replays after a reconnect: nothing new for watchers.
        c.apply(&event(EventType::Modified, "a", "p", "11", json!(1)))
            .unwrap();
        c.apply(&event(EventType::Deleted, "a", "p", "13", json!(1)))
            .unwrap();
        use ChangeType::*;
        assert_eq!(
            kinds_of(&c, 10),
            [
                (Modified, "p".into(), 11),
                (Added, "q".into(), 12),
                (Deleted, "p".into(), 13)
            ]
        );
        // Resuming from an event's resourceVersion starts after it.
        assert_eq!(kinds_of(&c, 12), [(Deleted, "p".into(), 13)]);
        assert!(kinds_of(&c, 13).is_empty());
        let bookmark = v1::WatchEvent {
            r#type: EventType::Bookmark as i32,
            kind: Some(pods()),
            resource_version: "20".into(),
            object: Vec::new(),
        };
        c.apply(&bookmark).unwrap();
        assert_eq!(c.kind("", "v1", "pods").unwrap().watch_position(), 20);
        // The modification carries what the cache held before it.
        let start = c
            .watch(&KindKey::of(&pods()), Some(10), |_, _| true)
            .unwrap()
            .unwrap();
        let batch = c
            .changes(&KindKey::of(&pods()), start.cursor, 1, 10)
            .unwrap();
        assert!(!batch.caught_up, "one at a time");
        assert_eq!(batch.changes[0].old.as_ref().unwrap().resource_version, "5");
    }

    #[test]
    fn a_folded_write_still_reaches_watchers_through_its_event() {
        let mut c = Cache::default();
        synced(&mut c, &[("p", "3")], "4");
        let obj = json!({"kind": "Pod", "apiVersion": "v1",
               "metadata": {"name": "p", "namespace": "a", "resourceVersion": "5"}, "spec": 1});
        c.fold_write(&KindKey::of(&pods()), &obj, false);
        assert!(c.history().is_empty());
        assert_eq!(
            c.apply(&event(EventType::Modified, "a", "p", "5", json!(1)))
                .unwrap(),
            Applied::Unchanged
        );
        assert_eq!(kinds_of(&c, 4), [(ChangeType::Modified, "p".into(), 5)]);
    }

    #[test]
    fn a_relisting_records_its_differences_at_its_end() {
        let mut c = Cache::default();
        synced(&mut c, &[("p1", "1"), ("p2", "2"), ("p3", "3")], "3");
        // Relist: p1 unchanged, p3 newer, p4 new (listed before p3 by
        // name, newer by version), p2 gone.
        c.sync_start(&pods());
        c.apply(&event(EventType::Added, "a", "p1", "1", json!(0)))
            .unwrap();
        c.apply(&event(EventType::Added, "a", "p3", "9", json!(0)))
            .unwrap();
        c.apply(&event(EventType::Added, "a", "p4", "7", json!(0)))
            .unwrap();
        assert!(c.history().is_empty(), "recorded only at the end");
        assert_eq!(
            c.kind("", "v1", "pods").unwrap().watch_position(),
            3,
            "a bookmark mid-listing must not claim what is not recorded"
        );
        c.sync_end(&pods(), "10");
        use ChangeType::*;
        assert_eq!(
            kinds_of(&c, 3),
            [
                (Added, "p4".into(), 7),
                (Modified, "p3".into(), 9),
                (Deleted, "p2".into(), 10)
            ]
        );
        assert_eq!(
            kinds_of(&c, 8),
            [(Modified, "p3".into(), 9), (Deleted, "p2".into(), 10)]
        );
        assert_eq!(c.kind("", "v1", "pods").unwrap().watch_position(), 10);
    }

    #[test]
    fn too_old_resource_versions_and_laggards_expire() {
        let mut c = Cache::with_history(3);
        synced(&mut c, &[], "10");
        let pods_key = KindKey::of(&pods());
        let expired = c
            .watch(&pods_key, Some(5), |_, _| true)
            .unwrap()
            .unwrap_err();
        assert_eq!(
            expired,
            Expired {
                requested: 5,
                oldest: 10
            }
        );
        assert_eq!(expired.to_string(), "too old resource version: 5 (10)");
        let laggard = c.watch(&pods_key, Some(10), |_, _| true).unwrap().unwrap();
        for rv in 11..=15 {
            c.apply(&event(
                EventType::Added,
                "a",
                &format!("p{rv}"),
                &rv.to_string(),
                json!(0),
            ))
            .unwrap();
        }
        assert_eq!(c.history().len(), 3);
        // Changes 11 and 12 were dropped: from 11 on is no longer whole.
        assert_eq!(
            c.watch(&pods_key, Some(11), |_, _| true)
                .unwrap()
                .unwrap_err(),
            Expired {
                requested: 11,
                oldest: 12
            }
        );
        assert_eq!(kinds_of(&c, 12).len(), 3);
        // A watcher that had not read them falls out.
        assert_eq!(
            c.changes(&pods_key, laggard.cursor, 100, 10).unwrap_err(),
            Expired {
                requested: 10,
                oldest: 12
            }
        );
    }

    #[test]
    fn a_busy_kind_does_not_expire_a_quiet_one_that_had_nothing_to_lose() {
        let mut c = Cache::with_history(2);
        synced(&mut c, &[], "10");
        let deployments = v1::Kind {
            group: "apps".into(),
            version: "v1".into(),
            resource: "deployments".into(),
            kind: "Deployment".into(),
            namespaced: true,
        };
        c.sync_start(&deployments);
        c.sync_end(&deployments, "10");
        let quiet = c
            .watch(&KindKey::of(&pods()), Some(10), |_, _| true)
            .unwrap()
            .unwrap();
        for rv in 11..15 {
            let mut e = event(
                EventType::Added,
                "a",
                &format!("d{rv}"),
                &rv.to_string(),
                json!(0),
            );
            e.kind = Some(deployments.clone());
            c.apply(&e).unwrap();
        }
        let batch = c
            .changes(&KindKey::of(&pods()), quiet.cursor, 100, 10)
            .unwrap();
        assert!(batch.changes.is_empty() && batch.caught_up);
        assert!(
            c.watch(&KindKey::of(&pods()), Some(10), |_, _| true)
                .unwrap()
                .is_ok()
        );
    }

    #[test]
    fn watches_start_from_the_current_objects_selected() {
        let mut c = Cache::default();
        synced(&mut c, &[("p1", "1"), ("p2", "2")], "2");
        let start = c
            .watch(&KindKey::of(&pods()), None, |k, _| k.1 == "p2")
            .unwrap()
            .unwrap();
        assert_eq!(start.objects.len(), 1);
        assert_eq!(start.objects[0].0.1, "p2");
        assert_eq!(start.position, 2);
        assert_eq!(start.cursor, c.history().next_seq());
        // A kind not synced is not watched here.
        let mut fresh = Cache::default();
        fresh.sync_start(&pods());
        assert!(
            fresh
                .watch(&KindKey::of(&pods()), None, |_, _| true)
                .is_none()
        );
    }

    #[test]
    fn discovery_is_replaced() {
        let mut c = Cache::default();
        let doc = |p: &str| v1::Document {
            path: p.into(),
            content_type: "application/json".into(),
            body: b"{}".to_vec(),
        };
        c.set_discovery(vec![doc("/api"), doc("/apis")]);
        assert!(c.discovery("/api").is_some());
        c.set_discovery(vec![doc("/version")]);
        assert!(c.discovery("/api").is_none());
        assert!(c.discovery("/version").is_some());
    }

    #[test]
    fn discovery_digest_follows_content_not_order() {
        let doc = |p: &str, body: &[u8]| v1::Document {
            path: p.into(),
            content_type: "application/json".into(),
            body: body.to_vec(),
        };
        let mut c = Cache::default();
        let empty = c.discovery_digest();
        c.set_discovery(vec![doc("/api", b"{}"), doc("/apis", b"{}")]);
        let first = c.discovery_digest();
        assert_ne!(first, empty);
        // The same snapshot again, in another order: unchanged.
        c.set_discovery(vec![doc("/apis", b"{}"), doc("/api", b"{}")]);
        assert_eq!(c.discovery_digest(), first);
        // A group version added (a CRD): changed.
        c.set_discovery(vec![doc("/api", b"{}"), doc("/apis", b"{\"g\":1}")]);
        assert_ne!(c.discovery_digest(), first);
        // Field boundaries count: moving bytes between path and body differs.
        c.set_discovery(vec![doc("/a", b"pi{}"), doc("/apis", b"{}")]);
        assert_ne!(c.discovery_digest(), first);
    }
}
