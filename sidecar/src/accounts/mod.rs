//! The account registry: every account this sidecar has seen, its cache, its
//! relay stream and whether it is online. The tunnel writes it, the facade and
//! the accounts API ([`api`]) read it. Start with [`Accounts`].

pub mod api;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Serialize;

use crate::cache::Cache;
use crate::tunnel::relay::RelayHandle;

/// A clonable handle on the registry of accounts.
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    inner: Arc<RwLock<HashMap<String, Arc<Account>>>>,
}

/// An account's state, as the accounts API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountStatus {
    /// Account name.
    pub name: String,
    /// The agent identity that serves it (empty before any stream).
    pub agent_identity: String,
    /// A cache stream is open.
    pub online: bool,
    /// Kinds whose full listing completed.
    pub kinds_synced: usize,
    /// Kinds the agent has started to send.
    pub kinds_total: usize,
    /// Objects cached.
    pub objects: usize,
    /// Discovery documents are held.
    pub discovery: bool,
    /// A relay stream is attached.
    pub relay: bool,
}

impl AccountStatus {
    /// Online, relay attached, discovery present and every known kind synced:
    /// kubectl gets complete answers.
    pub fn ready(&self) -> bool {
        self.online
            && self.relay
            && self.discovery
            && self.kinds_total > 0
            && self.kinds_synced == self.kinds_total
    }
}

/// One account.
#[derive(Debug)]
pub struct Account {
    name: String,
    /// The account's cache.
    pub cache: RwLock<Cache>,
    state: Mutex<State>,
    next_request_id: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    agent_identity: String,
    cache_streams: usize,
    relay: Option<RelayHandle>,
    highest_seq: Option<u64>,
}

/// Locks ignoring poisoning: every critical section leaves the state
/// consistent, so a panic elsewhere must not take the account down.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Account {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            cache: RwLock::default(),
            state: Mutex::default(),
            next_request_id: AtomicU64::new(1),
        }
    }

    /// The account name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads the cache.
    pub fn read_cache(&self) -> std::sync::RwLockReadGuard<'_, Cache> {
        self.cache.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the cache.
    pub fn write_cache(&self) -> std::sync::RwLockWriteGuard<'_, Cache> {
        self.cache.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// A cache stream from `identity` opened.
    pub fn cache_opened(&self, identity: &str) {
        let mut s = lock(&self.state);
        s.cache_streams += 1;
        identity.clone_into(&mut s.agent_identity);
    }

    /// A cache stream closed; returns whether the account is now offline.
    pub fn cache_closed(&self) -> bool {
        let mut s = lock(&self.state);
        s.cache_streams = s.cache_streams.saturating_sub(1);
        s.cache_streams == 0
    }

    /// Attaches a relay stream, replacing any earlier one (its requests in
    /// flight finish on it).
    pub fn attach_relay(&self, identity: &str, handle: RelayHandle) {
        let mut s = lock(&self.state);
        if s.agent_identity.is_empty() {
            identity.clone_into(&mut s.agent_identity);
        }
        s.relay = Some(handle);
    }

    /// Detaches the relay stream `serial` if it is still the attached one.
    pub fn detach_relay(&self, serial: u64) {
        let mut s = lock(&self.state);
        if s.relay.as_ref().is_some_and(|r| r.serial() == serial) {
            s.relay = None;
        }
    }

    /// The attached relay stream.
    pub fn relay(&self) -> Option<RelayHandle> {
        lock(&self.state).relay.clone()
    }

    /// A new request id, unique within the account.
    pub fn next_request_id(&self) -> u64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Records a received cache message `seq` and returns the highest
    /// contiguous sequence number held, and whether a gap was seen (messages
    /// the agent believes delivered but that this sidecar never got).
    pub fn record_seq(&self, seq: u64) -> (u64, bool) {
        let mut s = lock(&self.state);
        match s.highest_seq {
            None => {
                s.highest_seq = Some(seq);
                (seq, false)
            }
            Some(h) if seq <= h => (h, false),
            Some(h) if seq == h + 1 => {
                s.highest_seq = Some(seq);
                (seq, false)
            }
            Some(_) => {
                s.highest_seq = Some(seq);
                (seq, true)
            }
        }
    }

    /// The account's status.
    pub fn status(&self) -> AccountStatus {
        let (identity, online, relay) = {
            let s = lock(&self.state);
            (
                s.agent_identity.clone(),
                s.cache_streams > 0,
                s.relay.is_some(),
            )
        };
        let cache = self.read_cache();
        let (kinds_synced, kinds_total, objects) = cache.counts();
        AccountStatus {
            name: self.name.clone(),
            agent_identity: identity,
            online,
            kinds_synced,
            kinds_total,
            objects,
            discovery: cache.has_discovery(),
            relay,
        }
    }
}

impl Accounts {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The status of account `name`, if known.
    pub fn status(&self, name: &str) -> Option<AccountStatus> {
        self.get(name).map(|a| a.status())
    }

    /// The status of every account, by name.
    pub fn list(&self) -> Vec<AccountStatus> {
        let accounts: Vec<Arc<Account>> = self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut out: Vec<AccountStatus> = accounts.iter().map(|a| a.status()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Account `name`, if known.
    pub fn get(&self, name: &str) -> Option<Arc<Account>> {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Account `name`, created if unknown.
    pub fn get_or_create(&self, name: &str) -> Arc<Account> {
        if let Some(a) = self.get(name) {
            return a;
        }
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Account::new(name)))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_tracking_acks_highest_contiguous() {
        let a = Account::new("a");
        assert_eq!(a.record_seq(5), (5, false));
        assert_eq!(a.record_seq(6), (6, false));
        assert_eq!(a.record_seq(4), (6, false));
        assert_eq!(a.record_seq(6), (6, false));
        assert_eq!(a.record_seq(9), (9, true));
    }

    #[test]
    fn online_follows_cache_streams_and_ready_needs_everything() {
        let accounts = Accounts::new();
        let a = accounts.get_or_create("a");
        assert!(Arc::ptr_eq(&a, &accounts.get_or_create("a")));
        a.cache_opened("id");
        a.cache_opened("id");
        assert!(!a.cache_closed());
        let st = accounts.status("a").unwrap();
        assert!(st.online && !st.ready());
        assert!(a.cache_closed());
        assert!(!accounts.status("a").unwrap().online);
        assert!(accounts.status("b").is_none());
        let ready = AccountStatus {
            name: "a".into(),
            agent_identity: "x".into(),
            online: true,
            kinds_synced: 2,
            kinds_total: 2,
            objects: 0,
            discovery: true,
            relay: true,
        };
        assert!(ready.ready());
        assert!(
            !AccountStatus {
                kinds_synced: 1,
                ..ready.clone()
            }
            .ready()
        );
        assert!(
            !AccountStatus {
                relay: false,
                ..ready.clone()
            }
            .ready()
        );
        let json = serde_json::to_value(&ready).unwrap();
        assert_eq!(json["agentIdentity"], "x");
        assert_eq!(json["kindsSynced"], 2);
    }
}
