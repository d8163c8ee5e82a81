//! OpenAPI documents (`/openapi/v2` as JSON or protobuf, `/openapi/v3` and
//! its per-group-version documents) answered from memory: the first GET of a
//! document for an account is relayed, a `200` answer is kept ([`keep`]) and
//! later GETs are served from the cache ([`serve`]). Start with
//! [`OpenApiCache`].
//!
//! Why fetched through rather than pushed with the discovery snapshot: the
//! documents are megabytes per cluster (v2 JSON alone is about 2 MB), most
//! accounts never ask for them, and clusters of one version hold identical
//! ones. So bodies are content-addressed (SHA-256): a hundred clusters of one
//! version and CRD set hold one copy, however many accounts and `Accept`
//! variants point at it. The total is bounded by a byte cap; the least
//! recently used entries go first.
//!
//! An entry is keyed by account, path, raw query and `Accept` (JSON and
//! protobuf are different documents). Entries are per account even when the
//! bytes are shared: an agent answers only for its own cluster, so one
//! account's answer is never served to another.
//!
//! Invalidation: a document whose query names a `hash` (`/openapi/v3/<gv>?hash=H`)
//! is immutable for that hash and kept until evicted. Every other entry (the
//! v2 documents, the v3 index, v3 documents without `hash`) is valid only for
//! the discovery snapshot it was fetched under
//! ([`crate::cache::Cache::discovery_digest`]): when the agent sends a
//! snapshot whose content differs (a CRD added or removed), the account's
//! next OpenAPI GET finds its entries stale, drops them and is relayed again.
//! A relay that started under an older snapshot than the one held when it
//! finished is not kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;

use super::route::Query;
use crate::accounts::Account;
use crate::http::body::{Body, BoxError, full};

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// Longest `Accept` header an entry is kept for; longer ones are relayed
/// every time (the key is built from client input).
pub const MAX_ACCEPT_LEN: usize = 512;
/// Longest path plus query an entry is kept for.
pub const MAX_TARGET_LEN: usize = 2048;
/// Largest document read whole to be kept (or the cap, if smaller); a
/// larger one streams through as relayed, so a request holds at most this
/// much. Clusters with hundreds of CRDs reach tens of MB in v2.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024 * 1024;
/// What an entry costs beyond its key, headers and (shared) body: the maps'
/// slots and the LRU position, roughly.
const ENTRY_OVERHEAD: usize = 128;

/// Response headers kept with a document and served with it.
const KEPT_HEADERS: [HeaderName; 7] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::ETAG,
    header::LAST_MODIFIED,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::VARY,
];

/// Whether `path` (a Kubernetes path) is an OpenAPI document.
pub fn is_openapi(path: &str) -> bool {
    path == "/openapi/v2" || path == "/openapi/v3" || path.starts_with("/openapi/v3/")
}

/// What a kept document answers: one account's GET of one path, query and
/// `Accept`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    path: String,
    query: String,
    accept: String,
}

impl Key {
    /// The key of a GET of `path` with `query` and `accept`; `None` when it
    /// is no OpenAPI document or too long to keep.
    pub fn new(path: &str, query: Option<&str>, accept: &str) -> Option<Self> {
        let query = query.unwrap_or_default();
        if !is_openapi(path)
            || accept.len() > MAX_ACCEPT_LEN
            || path.len() + query.len() > MAX_TARGET_LEN
        {
            return None;
        }
        Some(Self {
            path: path.to_owned(),
            query: query.to_owned(),
            accept: accept.to_owned(),
        })
    }

    /// A `?hash=` document: its content is fixed by the hash.
    pub fn immutable(&self) -> bool {
        Query::parse(Some(&self.query))
            .get("hash")
            .is_some_and(|h| !h.is_empty())
    }

    fn size(&self) -> usize {
        self.path.len() + self.query.len() + self.accept.len()
    }
}

/// A document served from the cache.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The kept response headers ([`KEPT_HEADERS`]).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body, shared with every entry of the same content.
    pub body: Bytes,
}

impl Hit {
    /// The response: `200` with the document, or `304 Not Modified` when
    /// `if_none_match` names its ETag (the client holds it already).
    pub fn response(self, if_none_match: Option<&HeaderValue>) -> Response<Body> {
        let etag = self
            .headers
            .iter()
            .find(|(n, _)| n == header::ETAG)
            .map(|(_, v)| v.clone());
        let not_modified =
            matches!((etag, if_none_match), (Some(e), Some(inm)) if etag_matches(&e, inm));
        let mut resp = if not_modified {
            let mut r = Response::new(full(Bytes::new()));
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            r
        } else {
            Response::new(full(self.body))
        };
        for (name, value) in self.headers {
            if not_modified && (name == header::CONTENT_TYPE || name == header::CONTENT_ENCODING) {
                continue;
            }
            resp.headers_mut().append(name, value);
        }
        resp
    }
}

/// Whether an `If-None-Match` list names `etag` (weak comparison, as for GET).
fn etag_matches(etag: &HeaderValue, if_none_match: &HeaderValue) -> bool {
    let (Ok(etag), Ok(list)) = (etag.to_str(), if_none_match.to_str()) else {
        return false;
    };
    let opaque = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    let etag = opaque(etag);
    list.split(',')
        .map(str::trim)
        .any(|t| t == "*" || opaque(t) == etag)
}

/// One account's entry.
#[derive(Debug)]
struct Entry {
    digest: Digest,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The discovery snapshot it is valid for; `None` for `?hash=` documents.
    discovery: Option<Digest>,
    /// Its position in the LRU order.
    tick: u64,
    /// What it costs beyond the body.
    overhead: usize,
}

/// A distinct body and how many entries point at it.
#[derive(Debug)]
struct Blob {
    body: Bytes,
    refs: usize,
}

/// Where an entry lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Slot {
    account: String,
    key: Key,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Slot, Entry>,
    blobs: HashMap<Digest, Blob>,
    /// Least recently used first.
    lru: BTreeMap<u64, Slot>,
    tick: u64,
    /// Distinct bodies plus every entry's overhead.
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, slot: &Slot) {
        let Some(entry) = self.entries.remove(slot) else {
            return;
        };
        self.lru.remove(&entry.tick);
        self.bytes -= entry.overhead;
        if let Some(blob) = self.blobs.get_mut(&entry.digest) {
            blob.refs -= 1;
            if blob.refs == 0 {
                self.bytes -= blob.body.len();
                self.blobs.remove(&entry.digest);
            }
        }
    }

    /// Drops `account`'s entries fetched under another discovery snapshot.
    fn drop_stale(&mut self, account: &str, discovery: &Digest) {
        let stale: Vec<Slot> = self
            .entries
            .iter()
            .filter(|(s, e)| s.account == account && e.discovery.is_some_and(|d| d != *discovery))
            .map(|(s, _)| s.clone())
            .collect();
        for slot in &stale {
            self.remove(slot);
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

/// The OpenAPI documents of every account, bounded to a byte cap; shared by
/// the facade's requests (see the module docs).
#[derive(Debug)]
pub struct OpenApiCache {
    cap: usize,
    inner: Mutex<Inner>,
    /// Documents being fetched now (see [`OpenApiCache::flight`]).
    flights: Mutex<HashMap<Slot, Weak<tokio::sync::Mutex<()>>>>,
}

/// Held while one request fetches a document; see [`OpenApiCache::flight`].
pub type Flight = tokio::sync::OwnedMutexGuard<()>;

impl OpenApiCache {
    /// A cache holding at most `cap` bytes (0: nothing is kept).
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            inner: Mutex::default(),
            flights: Mutex::default(),
        }
    }

    /// Waits until no other request is fetching `key` for `account`, then
    /// holds it until the returned guard drops. Many kubectl processes
    /// started at once (Clouddriver's deploys after a restart) ask for the
    /// same multi-megabyte documents: the first relays, the others wait and
    /// are answered from memory.
    pub async fn flight(&self, account: &str, key: &Key) -> Flight {
        let lock = {
            let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
            flights.retain(|_, w| w.strong_count() > 0);
            let slot = Slot {
                account: account.to_owned(),
                key: key.clone(),
            };
            match flights.get(&slot).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    flights.insert(slot, Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every critical section leaves the maps consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The document `account` holds for `key`, if still valid under its
    /// current discovery snapshot `discovery`.
    pub fn get(&self, account: &str, key: &Key, discovery: &Digest) -> Option<Hit> {
        let mut inner = self.lock();
        let slot = Slot {
            account: account.to_owned(),
            key: key.clone(),
        };
        let entry = inner.entries.get(&slot)?;
        if entry.discovery.is_some_and(|d| d != *discovery) {
            inner.drop_stale(account, discovery);
            return None;
        }
        let (old, digest, headers) = (entry.tick, entry.digest, entry.headers.clone());
        let body = inner.blobs.get(&digest)?.body.clone();
        let tick = inner.next_tick();
        inner.lru.remove(&old);
        inner.lru.insert(tick, slot.clone());
        if let Some(e) = inner.entries.get_mut(&slot) {
            e.tick = tick;
        }
        Some(Hit { headers, body })
    }

    /// Keeps `body` as `account`'s answer for `key`, fetched under the
    /// discovery snapshot `discovery`, evicting the least recently used
    /// entries to stay within the cap. Returns whether it was kept (a
    /// document larger than the cap is not).
    pub fn insert(
        &self,
        account: &str,
        key: Key,
        discovery: &Digest,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> bool {
        let digest = sha256(&body);
        let overhead = ENTRY_OVERHEAD
            + account.len()
            + key.size()
            + headers
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len())
                .sum::<usize>();
        if body.len().saturating_add(overhead) > self.cap {
            return false;
        }
        let immutable = key.immutable();
        let slot = Slot {
            account: account.to_owned(),
            key,
        };
        let mut inner = self.lock();
        inner.drop_stale(account, discovery);
        inner.remove(&slot);
        loop {
            let needed = overhead
                + if inner.blobs.contains_key(&digest) {
                    0
                } else {
                    body.len()
                };
            if inner.bytes + needed <= self.cap {
                break;
            }
            let Some((_, oldest)) = inner.lru.pop_first() else {
                break;
            };
            inner.remove(&oldest);
        }
        let tick = inner.next_tick();
        let blob = inner.blobs.entry(digest).or_insert_with(|| Blob {
            // An exact-size copy: a body read in chunks sits in a buffer
            // that grew by doubling, up to twice what is counted.
            body: Bytes::copy_from_slice(&body),
            refs: 0,
        });
        blob.refs += 1;
        let added = if blob.refs == 1 { body.len() } else { 0 };
        inner.bytes += overhead + added;
        inner.lru.insert(tick, slot.clone());
        inner.entries.insert(
            slot,
            Entry {
                digest,
                headers,
                discovery: (!immutable).then_some(*discovery),
                tick,
                overhead,
            },
        );
        true
    }

    /// Drops every entry no longer valid: those of accounts `current` does
    /// not know (`None`: removed), and those fetched under another discovery
    /// snapshot than the account's current one. [`OpenApiCache::get`] finds
    /// stale entries by itself; this frees their memory for accounts that
    /// are not asked again.
    pub fn sweep(&self, current: impl Fn(&str) -> Option<Digest>) {
        let mut inner = self.lock();
        let gone: Vec<Slot> = inner
            .entries
            .iter()
            .filter(|(s, e)| match current(&s.account) {
                None => true,
                Some(now) => e.discovery.is_some_and(|d| d != now),
            })
            .map(|(s, _)| s.clone())
            .collect();
        for slot in &gone {
            inner.remove(slot);
        }
    }

    /// Bytes held: the distinct bodies plus every entry's key and headers.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Distinct bodies held.
    pub fn documents(&self) -> usize {
        self.lock().blobs.len()
    }

    /// Entries held, over every account.
    pub fn entries(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether anything can be kept.
    pub fn enabled(&self) -> bool {
        self.cap > 0
    }
}

fn sha256(body: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, body).as_ref());
    out
}

/// The kept document for a GET of `key` by `account`, as a response.
pub fn serve(
    cache: &OpenApiCache,
    account: &Account,
    key: &Key,
    headers: &HeaderMap,
) -> Option<Response<Body>> {
    let discovery = account.read_cache().discovery_digest();
    let hit = cache.get(account.name(), key, &discovery)?;
    Some(hit.response(headers.get(header::IF_NONE_MATCH)))
}

/// Keeps a relayed answer to a GET of `key`: a `200` whose body fits the
/// cap is read whole, kept, and answered from memory; anything else passes
/// through as it came. `discovery` is the account's discovery digest when
/// the request was relayed.
pub async fn keep(
    cache: &OpenApiCache,
    account: &Account,
    key: Key,
    discovery: Digest,
    resp: Response<Body>,
) -> Response<Body> {
    if resp.status() != StatusCode::OK || !cache.enabled() {
        return resp;
    }
    let limit = cache.cap.min(MAX_DOCUMENT_BYTES);
    let (parts, mut body) = resp.into_parts();
    let mut buf = BytesMut::new();
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buf.extend_from_slice(&data);
                if buf.len() > limit {
                    // Too large to keep: what was read, then the rest.
                    return Response::from_parts(parts, then(buf.freeze(), Ok(body)));
                }
            }
            Some(Err(e)) => return Response::from_parts(parts, then(buf.freeze(), Err(e))),
        }
    }
    let bytes = buf.freeze();
    // A snapshot that changed while the document was fetched may have
    // changed the document too: serve it once, keep nothing.
    if account.read_cache().discovery_digest() == discovery {
        let headers = KEPT_HEADERS
            .iter()
            .flat_map(|n| {
                parts
                    .headers
                    .get_all(n)
                    .iter()
                    .map(move |v| (n.clone(), v.clone()))
            })
            .collect();
        cache.insert(account.name(), key, &discovery, headers, bytes.clone());
    }
    Response::from_parts(parts, full(bytes))
}

/// A body of `prefix` followed by `rest`'s frames, or by its error.
fn then(prefix: Bytes, rest: Result<Body, BoxError>) -> Body {
    use futures::StreamExt as _;
    use http_body::Frame;
    let head = futures::stream::once(async move { Ok::<_, BoxError>(Frame::data(prefix)) });
    match rest {
        Ok(rest) => BodyExt::boxed(http_body_util::StreamBody::new(
            head.chain(http_body_util::BodyStream::new(rest)),
        )),
        Err(e) => BodyExt::boxed(http_body_util::StreamBody::new(head.chain(
            futures::stream::once(async move { Err::<Frame<Bytes>, BoxError>(e) }),
        ))),
    }
}

#[cfg(test)]
mod tests;
