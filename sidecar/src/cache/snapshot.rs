//! A cache's synced kinds as a byte stream, and back: what a sidecar that
//! gives an account up hands to the account's new owner (see
//! [`crate::handover`]).
//!
//! The format is newline-delimited JSON, one record per line:
//!
//! ```text
//! {"version":1,"seq":4711,"kinds":2}
//! {"kind":{"group":"","version":"v1","resource":"pods","kind":"Pod","namespaced":true},"resourceVersion":"812","objects":2}
//! {"rv":"790","object":{...}}
//! {"rv":"811","object":{...}}
//! {"kind":{...},"resourceVersion":"812","objects":0}
//! {"end":true}
//! ```
//!
//! `seq` is the highest cache message the old owner had applied, so the new
//! owner skips the part of the agent's replay the snapshot already holds.
//! Objects are the compact JSON text the cache holds, written as they are;
//! the declared counts and the `end` line make a cut stream an error rather
//! than a silently smaller cache.
//!
//! A [`View`] is taken under the cache's read lock but copies only shared
//! pointers to the objects' text ([`Entry`] keeps it in an `Arc<str>`), so
//! the lock is held briefly and writing the stream ([`View::chunks`]) holds
//! one chunk at a time. Reading ([`Reader`]) bounds every line and the whole
//! stream: the bytes come from the network.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use spinlink_proto::v1;

use super::{Cache, CachedKind, Entry, KindKey, ObjectKey, WatchState, rv_number};

/// The format's version.
pub const VERSION: u32 = 1;
/// Bytes per chunk of a written snapshot.
pub const DEFAULT_CHUNK_BYTES: usize = 64 * 1024;
/// The longest line a reader accepts: an object is at most 1.5 MiB in etcd,
/// so anything far longer is not one.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A line is not the record expected there.
    #[error("snapshot line {line}: {message}")]
    Malformed {
        /// 1-based line number.
        line: u64,
        /// What was wrong.
        message: String,
    },
    /// A line is longer than [`MAX_LINE_BYTES`].
    #[error("snapshot line {0} is longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong(u64),
    /// The stream is larger than allowed.
    #[error("snapshot larger than {0} bytes")]
    TooLarge(u64),
    /// The stream ended before its `end` line.
    #[error("snapshot ended early (after line {0})")]
    Truncated(u64),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: u32,
    seq: u64,
    kinds: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireKind {
    group: String,
    version: String,
    resource: String,
    kind: String,
    namespaced: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KindHeader {
    kind: WireKind,
    resource_version: String,
    objects: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjectLine {
    rv: String,
    object: Value,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    end: bool,
}

/// A consistent view of a cache's completed kinds, ready to be written.
#[derive(Debug)]
pub struct View {
    seq: u64,
    kinds: Vec<ViewKind>,
}

#[derive(Debug)]
struct ViewKind {
    info: v1::Kind,
    resource_version: String,
    objects: Vec<(String, Arc<str>)>,
}

impl View {
    /// How many kinds it holds.
    pub fn kinds(&self) -> usize {
        self.kinds.len()
    }

    /// How many objects it holds.
    pub fn objects(&self) -> usize {
        self.kinds.iter().map(|k| k.objects.len()).sum()
    }

    /// The snapshot as chunks of about `chunk_bytes`, produced as they are
    /// pulled.
    pub fn chunks(self, chunk_bytes: usize) -> impl Iterator<Item = Bytes> + Send + Sync + 'static {
        let chunk_bytes = chunk_bytes.max(1);
        let header = Header {
            version: VERSION,
            seq: self.seq,
            kinds: self.kinds.len() as u64,
        };
        let lines = std::iter::once(line(&header))
            .chain(self.kinds.into_iter().flat_map(|k| {
                let head = KindHeader {
                    kind: WireKind {
                        group: k.info.group,
                        version: k.info.version,
                        resource: k.info.resource,
                        kind: k.info.kind,
                        namespaced: k.info.namespaced,
                    },
                    resource_version: k.resource_version,
                    objects: k.objects.len() as u64,
                };
                std::iter::once(line(&head)).chain(k.objects.into_iter().map(|(rv, json)| {
                    // The cached text is compact JSON: no raw newline in it.
                    let rv = serde_json::to_string(&rv).unwrap_or_default();
                    let mut out = BytesMut::with_capacity(json.len() + rv.len() + 20);
                    out.extend_from_slice(b"{\"rv\":");
                    out.extend_from_slice(rv.as_bytes());
                    out.extend_from_slice(b",\"object\":");
                    out.extend_from_slice(json.as_bytes());
                    out.extend_from_slice(b"}\n");
                    out.freeze()
                }))
            }))
            .chain(std::iter::once(line(&End { end: true })));
        let mut lines = lines.peekable();
        std::iter::from_fn(move || {
            let mut chunk = BytesMut::new();
            while let Some(l) =
                lines.next_if(|l| chunk.is_empty() || chunk.len() + l.len() <= chunk_bytes)
            {
                chunk.extend_from_slice(&l);
            }
            (!chunk.is_empty()).then(|| chunk.freeze())
        })
    }
}

fn line<T: Serialize>(record: &T) -> Bytes {
    // Serialising these plain structs cannot fail.
    let mut v = serde_json::to_vec(record).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// One kind read from a snapshot.
#[derive(Debug)]
pub struct LoadedKind {
    info: v1::Kind,
    resource_version: String,
    objects: BTreeMap<ObjectKey, Entry>,
}

/// A snapshot read completely.
#[derive(Debug)]
pub struct Loaded {
    /// The highest cache message the old owner had applied (0: unknown).
    pub seq: u64,
    kinds: Vec<LoadedKind>,
}

impl Loaded {
    /// How many kinds it holds.
    pub fn kinds(&self) -> usize {
        self.kinds.len()
    }

    /// How many objects it holds.
    pub fn objects(&self) -> usize {
        self.kinds.iter().map(|k| k.objects.len()).sum()
    }
}

#[derive(Debug)]
enum Expect {
    Header,
    Kind,
    Objects(u64),
    End,
    Done,
}

/// Reads a snapshot from chunks as they arrive ([`Reader::push`]), then
/// [`Reader::finish`].
#[derive(Debug)]
pub struct Reader {
    max_bytes: u64,
    read: u64,
    line: u64,
    partial: Vec<u8>,
    expect: Expect,
    kinds_left: u64,
    seq: u64,
    kinds: Vec<LoadedKind>,
}

impl Reader {
    /// A reader accepting at most `max_bytes`.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            read: 0,
            line: 0,
            partial: Vec::new(),
            expect: Expect::Header,
            kinds_left: 0,
            seq: 0,
            kinds: Vec::new(),
        }
    }

    /// Takes the next bytes of the stream.
    pub fn push(&mut self, mut chunk: &[u8]) -> Result<()> {
        self.read = self.read.saturating_add(chunk.len() as u64);
        if self.read > self.max_bytes {
            return Err(Error::TooLarge(self.max_bytes));
        }
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            if self.partial.len() + i > MAX_LINE_BYTES {
                return Err(Error::LineTooLong(self.line + 1));
            }
            let text = if self.partial.is_empty() {
                self.record(&chunk[..i])
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(&chunk[..i]);
                self.record(&whole)
            };
            text?;
            chunk = &chunk[i + 1..];
        }
        if self.partial.len() + chunk.len() > MAX_LINE_BYTES {
            return Err(Error::LineTooLong(self.line + 1));
        }
        self.partial.extend_from_slice(chunk);
        Ok(())
    }

    fn malformed(&self, message: impl Into<String>) -> Error {
        Error::Malformed {
            line: self.line,
            message: message.into(),
        }
    }

    fn parse<T: for<'de> Deserialize<'de>>(&self, bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| self.malformed(e.to_string()))
    }

    fn record(&mut self, bytes: &[u8]) -> Result<()> {
        self.line += 1;
        match self.expect {
            Expect::Header => {
                let h: Header = self.parse(bytes)?;
                if h.version != VERSION {
                    return Err(self.malformed(format!("unknown version {}", h.version)));
                }
                self.seq = h.seq;
                self.kinds_left = h.kinds;
                self.expect = if h.kinds == 0 {
                    Expect::End
                } else {
                    Expect::Kind
                };
            }
            Expect::Kind => {
                let k: KindHeader = self.parse(bytes)?;
                if k.kind.version.is_empty() || k.kind.resource.is_empty() {
                    return Err(self.malformed("kind without version or resource"));
                }
                if rv_number(&k.resource_version).is_none() {
                    return Err(self.malformed("resourceVersion is not a number"));
                }
                self.kinds.push(LoadedKind {
                    info: v1::Kind {
                        group: k.kind.group,
                        version: k.kind.version,
                        resource: k.kind.resource,
                        kind: k.kind.kind,
                        namespaced: k.kind.namespaced,
                    },
                    resource_version: k.resource_version,
                    objects: BTreeMap::new(),
                });
                self.kinds_left -= 1;
                self.expect = self.after_objects(k.objects);
            }
            Expect::Objects(left) => {
                let o: ObjectLine = self.parse(bytes)?;
                let meta = o.object.get("metadata");
                let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
                let Some(name) = field("name").filter(|n| !n.is_empty()) else {
                    return Err(self.malformed("object without metadata.name"));
                };
                let key = (
                    field("namespace").unwrap_or_default().to_owned(),
                    name.to_owned(),
                );
                let entry = Entry::new(&o.object, o.rv, 0);
                if let Some(kind) = self.kinds.last_mut()
                    && kind.objects.insert(key, entry).is_some()
                {
                    return Err(self.malformed("object listed twice"));
                }
                self.expect = self.after_objects(left - 1);
            }
            Expect::End => {
                let e: End = self.parse(bytes)?;
                if !e.end {
                    return Err(self.malformed("expected the end"));
                }
                self.expect = Expect::Done;
            }
            Expect::Done => return Err(self.malformed("data after the end")),
        }
        Ok(())
    }

    fn after_objects(&self, left: u64) -> Expect {
        match (left, self.kinds_left) {
            (0, 0) => Expect::End,
            (0, _) => Expect::Kind,
            (n, _) => Expect::Objects(n),
        }
    }

    /// The snapshot, if the stream ended where it should.
    pub fn finish(self) -> Result<Loaded> {
        match self.expect {
            Expect::Done if self.partial.iter().all(u8::is_ascii_whitespace) => Ok(Loaded {
                seq: self.seq,
                kinds: self.kinds,
            }),
            Expect::Done => Err(Error::Malformed {
                line: self.line + 1,
                message: "data after the end".into(),
            }),
            _ => Err(Error::Truncated(self.line)),
        }
    }
}

impl Cache {
    /// A consistent view of every kind whose listing completed and is not
    /// being listed again (a re-listing's objects are half old, half new),
    /// with `seq`, the highest cache message applied, taken under the same
    /// lock by the caller.
    pub fn snapshot(&self, seq: u64) -> View {
        let mut kinds: Vec<ViewKind> = self
            .kinds
            .values()
            .filter(|k| k.watchable() && k.watch.resync.is_none())
            .map(|k| ViewKind {
                info: k.info.clone(),
                resource_version: k.resource_version.clone(),
                objects: k
                    .objects
                    .values()
                    .map(|e| (e.resource_version.clone(), e.json.clone()))
                    .collect(),
            })
            .collect();
        kinds.sort_by(|a, b| {
            (&a.info.group, &a.info.version, &a.info.resource).cmp(&(
                &b.info.group,
                &b.info.version,
                &b.info.resource,
            ))
        });
        View { seq, kinds }
    }

    /// Takes the kinds of a snapshot this cache has not synced itself, as
    /// synced at the snapshot's resourceVersions (their watch history starts
    /// there). Returns how many kinds it took.
    pub fn load(&mut self, loaded: Loaded) -> usize {
        let mut taken = 0;
        for k in loaded.kinds {
            let key = KindKey::of(&k.info);
            if self.kinds.get(&key).is_some_and(|held| held.synced) {
                continue;
            }
            let at = rv_number(&k.resource_version).unwrap_or(0);
            let mut kind = CachedKind::new(&k.info);
            kind.objects = k.objects;
            kind.resource_version = k.resource_version;
            kind.synced = true;
            kind.watch = WatchState {
                position: at,
                start: at,
                resync: None,
            };
            self.kinds.insert(key, kind);
            taken += 1;
        }
        taken
    }
}

#[cfg(test)]
mod tests;
