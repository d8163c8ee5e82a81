//! The owner's record of where each account's cache stands: per account and
//! kind, the resourceVersion of every kind whose listing completed (the
//! ones a `ResumeFrom` names), written to the store
//! ([`Store::record_resource_versions`]). A cache stream may carry
//! thousands of events a second, so nothing is written per event: the
//! ownership loop ([`super::Ownership::run`]) calls [`Recorder::record`]
//! when it renews an account's lease (every third of
//! `ownership.leaseSeconds`), which writes only the kinds whose
//! resourceVersion moved since it last wrote, in one transaction per
//! account; and once more when the account goes offline here, *before*
//! its lease is released, so the last position is in the store before any
//! other instance can claim the account. Writes are fenced by the lease:
//! once another instance has claimed the account, this one's are refused.
//!
//! What reads it: a sidecar that still holds a cache of an account coming
//! back to it compares that cache with the record to know whether it is the
//! latest any owner held ([`crate::handover::Handover::take_over`]); see
//! `docs/architecture.md`, "Resuming from the store's resourceVersions".

use std::collections::{BTreeMap, HashMap};

use prometheus_client::metrics::counter::Counter;

use crate::accounts::Account;
use crate::cache::KindKey;
use crate::store::{KindVersion, Store};

/// The resumable kinds of a cache: every synced kind with its
/// resourceVersion.
pub fn held(account: &Account) -> BTreeMap<KindKey, String> {
    account
        .read_cache()
        .kinds()
        .filter(|k| k.resumable())
        .map(|k| (KindKey::of(&k.info), k.resource_version.clone()))
        .collect()
}

fn kind_version(key: &KindKey, rv: &str) -> KindVersion {
    KindVersion {
        group: key.group.clone(),
        version: key.version.clone(),
        resource: key.resource.clone(),
        resource_version: rv.to_owned(),
    }
}

/// What was last written for one account.
#[derive(Debug, Default)]
struct Written {
    /// The account's cache generation it was written for: a new stream
    /// (the account came back, maybe after another owner recorded its own)
    /// writes every kind again.
    generation: u64,
    kinds: BTreeMap<KindKey, String>,
    /// The record was cleared (the account was removed here).
    cleared: bool,
}

/// Records the resourceVersions of the accounts this instance serves.
#[derive(Debug)]
pub struct Recorder {
    store: Store,
    instance: String,
    writes: Counter,
    written: HashMap<String, Written>,
}

impl Recorder {
    /// A recorder for sidecar `instance`; `writes` counts kinds written.
    pub fn new(store: Store, instance: &str, writes: Counter) -> Self {
        Self {
            store,
            instance: instance.to_owned(),
            writes,
            written: HashMap::new(),
        }
    }

    /// Writes the kinds of `account` whose resourceVersion moved since the
    /// last write, and forgets those it no longer holds; returns whether
    /// the store holds the cache's position now (written, nothing to
    /// write, or another instance owns the account).
    pub async fn record(&mut self, account: &Account) -> bool {
        let w = self.written.entry(account.name().to_owned()).or_default();
        let generation = account.cache_generation();
        if w.generation != generation {
            *w = Written {
                generation,
                ..Written::default()
            };
        }
        let now = held(account);
        let set: Vec<KindVersion> = now
            .iter()
            .filter(|(k, rv)| w.kinds.get(*k) != Some(*rv))
            .map(|(k, rv)| kind_version(k, rv))
            .collect();
        let gone: Vec<KindVersion> = w
            .kinds
            .keys()
            .filter(|k| !now.contains_key(*k))
            .map(|k| kind_version(k, ""))
            .collect();
        if set.is_empty() && gone.is_empty() {
            return true;
        }
        match self
            .store
            .record_resource_versions(account.name(), &self.instance, &set, &gone)
            .await
        {
            Ok(true) => {
                self.writes
                    .inc_by(u64::try_from(set.len() + gone.len()).unwrap_or(u64::MAX));
                w.kinds = now;
                true
            }
            // Another instance owns it now: what it records counts.
            Ok(false) => {
                tracing::debug!(
                    account = account.name(),
                    "not the lease holder; resourceVersions not recorded"
                );
                true
            }
            Err(e) => {
                tracing::warn!(account = account.name(), error = %e,
                    "recording resourceVersions failed");
                false
            }
        }
    }

    /// `account`'s cache was dropped (removed at the end of its grace
    /// period): so is its record, unless another instance owns it now.
    /// Once per removal.
    pub async fn forget(&mut self, account: &Account) {
        let w = self.written.entry(account.name().to_owned()).or_default();
        if w.cleared && w.generation == account.cache_generation() {
            return;
        }
        match self
            .store
            .clear_resource_versions(account.name(), &self.instance)
            .await
        {
            Ok(()) => {
                *w = Written {
                    generation: account.cache_generation(),
                    kinds: BTreeMap::new(),
                    cleared: true,
                };
            }
            Err(e) => tracing::warn!(account = account.name(), error = %e,
                "clearing the recorded resourceVersions failed"),
        }
    }
}

#[cfg(test)]
mod tests;
