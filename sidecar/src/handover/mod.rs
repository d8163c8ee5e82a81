//! Warm handover: when an account moves to another sidecar on a planned
//! move (a drain: rolling restart, scale-in), the new owner loads the old
//! owner's cache instead of having the agent list every kind again.
//!
//! - Every sidecar serves the caches of the accounts it no longer serves to
//!   its peers on the peer port ([`crate::peer`]: mutual TLS, sidecar
//!   identities only; its URL recorded in the store): `GET
//!   /internal/accounts/{name}/snapshot` answers a [`snapshot`] stream
//!   ([`Handover::respond`]). An account still online here is refused (409):
//!   its cache is still moving, and it has not moved.
//! - A sidecar that takes an account over from another instance (the lease
//!   it replaced named one) with nothing cached for it fetches that snapshot
//!   within `ownership.handoverTimeoutMillis`, loads it, continues the
//!   account's message numbering from it, and only then sends `ResumeFrom`
//!   ([`Handover::take_over`]); an account still online at the old owner
//!   (the agent came over before the old owner saw its streams end) is
//!   asked for again until then. Anything that fails leaves the cache as it
//!   was, so `ResumeFrom` is empty and the agent lists, as without a
//!   handover.
//! - A sidecar that still holds a cache of the account (it was stale here,
//!   in its grace period) resumes from it when no other instance held the
//!   account since; when one did, it compares the cache with the store's
//!   record of the account's resourceVersions
//!   ([`crate::ownership::versions`]): at the record or past it, the agent
//!   resumes from it; older (the other owner moved on) the other's snapshot
//!   replaces it if there is one, else the agent resumes from the older
//!   cache.
//! - The peer port outlives the facade's listener during a drain: after the leases
//!   are released the sidecar keeps serving until every account that was
//!   online was fetched, or `ownership.handoverDrainSeconds`
//!   ([`Handover::wait_fetched`]).
//!
//! Outcomes are counted in `spinlink_sidecar_handovers_total{outcome,reason}`:
//! `warm` (reason empty, or `fresher` when a snapshot replaced an older
//! cache), `resumed` (`current` or `behind`), `cold` with the reason — a
//! peer whose certificate is not a sidecar's is `unreachable`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use spinlink_kube_api::Status;
use tokio::sync::watch;

use crate::accounts::{Account, Accounts, Presence};
use crate::cache::KindKey;
use crate::cache::snapshot::{self, Loaded, Reader};
use crate::http::body::{self, Body, BoxError};
use crate::metrics::Metrics;
use crate::ownership::{PreviousOwner, versions};
use crate::store::{KindVersion, Store};

/// The path prefix of snapshots.
pub const PATH_PREFIX: &str = "/internal/accounts/";
/// The path suffix of snapshots.
pub const PATH_SUFFIX: &str = "/snapshot";
/// How long a new owner waits before asking again for the snapshot of an
/// account still online at the old owner.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(100);

/// Why a handover was cold (the agent lists every kind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cold {
    /// The old owner recorded no snapshot address (an older sidecar).
    NoAddress,
    /// It could not be reached, or the stream broke.
    Unreachable,
    /// It answered with something other than a snapshot (404: it holds
    /// nothing, 409: the account is still online there).
    Refused(StatusCode),
    /// The snapshot did not arrive in time.
    Timeout,
    /// The snapshot could not be read.
    Invalid,
    /// The snapshot held no kind this sidecar could use.
    Empty,
}

impl Cold {
    /// The metric's `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoAddress => "no_address",
            Self::Unreachable => "unreachable",
            Self::Refused(_) => "refused",
            Self::Timeout => "timeout",
            Self::Invalid => "invalid",
            Self::Empty => "empty",
        }
    }
}

/// What a handover did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The snapshot was loaded: these many kinds and objects.
    Warm {
        /// Kinds loaded.
        kinds: usize,
        /// Objects loaded.
        objects: usize,
    },
    /// The cache held here was older than the store's record of the
    /// account, and the previous owner's snapshot replaced it.
    Fresher {
        /// Kinds loaded.
        kinds: usize,
        /// Objects loaded.
        objects: usize,
    },
    /// The cache held here (from an earlier stream, the grace period) is
    /// what the agent resumes from: `current` when no other instance held
    /// the account since, or the store's record of the one that did is no
    /// further; else it is behind and no fresher snapshot was to be had
    /// (the agent's watches replay what it missed, or a kind too old for
    /// the API server is listed).
    Resumed {
        /// The held cache matched the store's record.
        current: bool,
    },
    /// Nothing was loaded.
    Cold(Cold),
}

impl Outcome {
    /// The metric's `outcome` and `reason` labels.
    pub fn labels(&self) -> (&'static str, &'static str) {
        match self {
            Self::Warm { .. } => ("warm", ""),
            Self::Fresher { .. } => ("warm", "fresher"),
            Self::Resumed { current: true } => ("resumed", "current"),
            Self::Resumed { current: false } => ("resumed", "behind"),
            Self::Cold(cold) => ("cold", cold.reason()),
        }
    }
}

/// Whether every resumable kind of a held cache is where the store's
/// record says, or further; a kind missing from the record is not.
fn current(held: &BTreeMap<KindKey, String>, recorded: &[KindVersion]) -> bool {
    let record: HashMap<KindKey, &str> = recorded
        .iter()
        .map(|k| {
            (
                KindKey {
                    group: k.group.clone(),
                    version: k.version.clone(),
                    resource: k.resource.clone(),
                },
                k.resource_version.as_str(),
            )
        })
        .collect();
    held.iter().all(|(key, rv)| {
        record
            .get(key)
            .is_some_and(|r| *r == rv || crate::cache::is_newer(rv, r))
    })
}

/// Handover settings (`ownership.handover*`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a fetch and load may take.
    pub timeout: Duration,
    /// The largest snapshot accepted.
    pub max_bytes: u64,
    /// How snapshots are fetched: mutual TLS with `peer.tls`.
    pub client: crate::peer_client::Client,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(crate::config::DEFAULT_HANDOVER_TIMEOUT_MILLIS),
            max_bytes: crate::config::DEFAULT_HANDOVER_MAX_BYTES,
            client: crate::peer_client::Client::default(),
        }
    }
}

/// Both sides of the handover for one sidecar.
#[derive(Debug)]
pub struct Handover {
    accounts: Accounts,
    settings: Settings,
    metrics: Metrics,
    /// Accounts whose snapshot a peer read to the end.
    fetched: Mutex<HashSet<String>>,
    fetched_changed: watch::Sender<u64>,
}

impl Handover {
    /// The handover of the accounts in `accounts`.
    pub fn new(accounts: Accounts, settings: Settings, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            accounts,
            settings,
            metrics,
            fetched: Mutex::default(),
            fetched_changed: watch::Sender::new(0),
        })
    }

    /// Decides what the first cache stream of `account` here starts from,
    /// having just claimed its lease; `from` is the other instance that
    /// held it last, if one did. Counts and returns the outcome; `None`
    /// when there is nothing to decide (a new account, or one a stream here
    /// numbered already).
    ///
    /// - Nothing cached here: load `from`'s snapshot (warm) or nothing
    ///   (cold: the agent lists).
    /// - A cache held here from an earlier stream (the grace period), and
    ///   no other instance held the account since: resumed from, the
    ///   latest any owner had (the store's record may lag it).
    /// - Held here, but `from` held it since: compared with the store's
    ///   record of the account ([`crate::ownership::versions`]). Where the
    ///   record is, or further, it is resumed from; older (or not in the
    ///   record: `from` moved on, or recorded nothing) it is replaced by
    ///   `from`'s snapshot when that loads, else resumed from — the agent's
    ///   watches replay what it missed, or list a kind whose
    ///   resourceVersion the API server no longer has.
    pub async fn take_over(
        &self,
        account: &Account,
        from: Option<&PreviousOwner>,
        store: &Store,
    ) -> Option<Outcome> {
        let started = tokio::time::Instant::now();
        let held = versions::held(account);
        let outcome = if held.is_empty() {
            if account.highest_seq().is_some() {
                return None;
            }
            match self.fetch_within(account, from?).await {
                Ok(loaded) => load(account, loaded, false),
                Err(cold) => Outcome::Cold(cold),
            }
        } else if let Some(from) = from {
            let current = match store.resource_versions(account.name()).await {
                Ok(recorded) => current(&held, &recorded),
                Err(e) => {
                    tracing::warn!(account = account.name(), error = %e,
                        "reading the recorded resourceVersions failed; taking the cache held here as behind");
                    false
                }
            };
            if current {
                Outcome::Resumed { current: true }
            } else {
                match self.fetch_within(account, from).await {
                    Ok(loaded) if loaded.kinds() > 0 => load(account, loaded, true),
                    Ok(_) => Outcome::Resumed { current: false },
                    Err(cold) => {
                        tracing::info!(account = account.name(), from = %from.instance, reason = cold.reason(),
                            "no fresher snapshot; resuming from the older cache held here");
                        Outcome::Resumed { current: false }
                    }
                }
            }
        } else {
            Outcome::Resumed { current: true }
        };
        let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let from = from.map_or("", |f| f.instance.as_str());
        match &outcome {
            Outcome::Warm { kinds, objects } | Outcome::Fresher { kinds, objects } => {
                tracing::info!(account = account.name(), %from, kinds, objects, millis,
                    "warm handover: cache loaded from the previous owner");
            }
            Outcome::Resumed { current } => {
                tracing::info!(account = account.name(), %from, current, millis,
                    "resuming from the cache held here");
            }
            Outcome::Cold(cold) => {
                tracing::info!(account = account.name(), %from, reason = cold.reason(), millis,
                    "cold handover: the agent lists again");
            }
        }
        let (outcome_label, reason) = outcome.labels();
        self.metrics.handover(outcome_label, reason);
        Some(outcome)
    }

    /// Fetches `from`'s snapshot of `account` within the timeout, asking
    /// again while it answers that the account is still online there.
    async fn fetch_within(&self, account: &Account, from: &PreviousOwner) -> Result<Loaded, Cold> {
        let deadline = tokio::time::Instant::now() + self.settings.timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.fetch(account, from)).await {
                Err(_) => return Err(Cold::Timeout),
                // The old owner has not seen its streams end yet (the
                // agent was quicker): ask again while there is time.
                Ok(Err(Cold::Refused(StatusCode::CONFLICT)))
                    if tokio::time::Instant::now() + CONFLICT_RETRY < deadline =>
                {
                    tokio::time::sleep(CONFLICT_RETRY).await;
                }
                Ok(result) => return result,
            }
        }
    }

    async fn fetch(&self, account: &Account, from: &PreviousOwner) -> Result<Loaded, Cold> {
        let base = from.url.as_deref().ok_or(Cold::NoAddress)?;
        let uri: Uri = format!(
            "{}{PATH_PREFIX}{}{PATH_SUFFIX}",
            base.trim_end_matches('/'),
            utf8_percent_encode(account.name(), NON_ALPHANUMERIC)
        )
        .parse()
        .map_err(|_| Cold::NoAddress)?;
        let req = Request::get(uri)
            .body(Empty::new().map_err(|e| match e {}).boxed_unsync())
            .map_err(|_| Cold::NoAddress)?;
        let resp = self.settings.client.request(req).await.map_err(|e| {
            tracing::debug!(account = account.name(), error = %e, "snapshot fetch failed");
            Cold::Unreachable
        })?;
        if resp.status() != StatusCode::OK {
            return Err(Cold::Refused(resp.status()));
        }
        let mut reader = Reader::new(self.settings.max_bytes);
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| Cold::Unreachable)?;
            if let Some(data) = frame.data_ref() {
                reader.push(data).map_err(|e| {
                    tracing::warn!(account = account.name(), error = %e, "snapshot refused");
                    Cold::Invalid
                })?;
            }
        }
        reader.finish().map_err(|e| {
            tracing::warn!(account = account.name(), error = %e, "snapshot refused");
            match e {
                snapshot::Error::Truncated(_) => Cold::Unreachable,
                _ => Cold::Invalid,
            }
        })
    }

    /// Answers one peer request.
    pub fn respond(self: &Arc<Self>, method: &Method, path: &str) -> Response<Body> {
        let Some(name) = path
            .strip_prefix(PATH_PREFIX)
            .and_then(|p| p.strip_suffix(PATH_SUFFIX))
            .filter(|p| !p.is_empty() && !p.contains('/'))
            .and_then(|p| percent_decode_str(p).decode_utf8().ok())
        else {
            return body::status(&Status::not_found_message(format!(
                "{path} is not a snapshot path; use {PATH_PREFIX}<name>{PATH_SUFFIX}"
            )));
        };
        if method != Method::GET {
            return body::status(&Status::method_not_allowed());
        }
        let name = name.into_owned();
        let Some(account) = self
            .accounts
            .get(&name)
            .filter(|a| a.presence() != Presence::Removed)
        else {
            return body::status(&Status::not_found_message(format!(
                "account \"{name}\" is not cached here"
            )));
        };
        let still_online = || {
            body::status(&Status::new(
                409,
                "Conflict",
                format!("account \"{name}\" is still online here; it has not moved"),
            ))
        };
        // The cache of an online account is still changing, and a snapshot
        // must hold every message its sequence number claims: only an
        // account whose streams ended here is handed over.
        if account.presence() == Presence::Online {
            return still_online();
        }
        let seq = account.highest_seq().unwrap_or(0);
        let view = account.read_cache().snapshot(seq);
        if account.presence() == Presence::Online || account.highest_seq().unwrap_or(0) != seq {
            return still_online();
        }
        if view.kinds() == 0 {
            return body::status(&Status::not_found_message(format!(
                "account \"{name}\" has no complete kind cached here"
            )));
        }
        tracing::info!(account = %name, kinds = view.kinds(), objects = view.objects(),
            "serving the account's cache snapshot to a peer");
        let done = self.clone();
        let chunks = view
            .chunks(snapshot::DEFAULT_CHUNK_BYTES)
            .map(|c| Ok::<_, BoxError>(Frame::data(c)))
            // Runs once the last chunk was taken: the peer has it all.
            .chain(std::iter::from_fn(move || {
                done.mark_fetched(&name);
                None
            }));
        let mut resp = Response::new(StreamBody::new(futures::stream::iter(chunks)).boxed());
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/x-ndjson"),
        );
        resp
    }

    fn mark_fetched(&self, name: &str) {
        self.fetched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned());
        self.fetched_changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether a peer has read `name`'s snapshot to the end.
    pub fn was_fetched(&self, name: &str) -> bool {
        self.fetched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(name)
    }

    /// Waits until every account in `names` was fetched by a peer, or
    /// `within`; returns whether they all were.
    pub async fn wait_fetched(&self, names: &[String], within: Duration) -> bool {
        let mut changed = self.fetched_changed.subscribe();
        let all = async {
            loop {
                if names.iter().all(|n| self.was_fetched(n)) {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(within, all).await.is_ok()
    }
}

/// Loads a fetched snapshot into `account`: into its empty cache, or in
/// place of an older one (`replace`); the numbering continues from the
/// snapshot's, so the agent's replay of what it holds is skipped.
fn load(account: &Account, loaded: Loaded, replace: bool) -> Outcome {
    let seq = loaded.seq;
    let objects = loaded.objects();
    let kinds = if replace {
        account.replace_kinds(loaded, seq)
    } else {
        let kinds = account.write_cache().load(loaded);
        if kinds > 0 {
            account.continue_seq(seq);
        }
        kinds
    };
    match (kinds, replace) {
        (0, _) => Outcome::Cold(Cold::Empty),
        (kinds, false) => Outcome::Warm { kinds, objects },
        (kinds, true) => Outcome::Fresher { kinds, objects },
    }
}

#[cfg(test)]
mod tests;
