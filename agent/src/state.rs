//! What the agent is doing right now, published through a
//! `tokio::sync::watch` channel ([`crate::Agent::state`]).

use std::collections::BTreeMap;

/// The agent's observable state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentState {
    /// True while a connection to the gateway is up and `Hello` was answered.
    pub connected: bool,
    /// Per account, what the gateway answered and how far its streams are.
    /// Empty while disconnected.
    pub accounts: BTreeMap<String, AccountState>,
}

/// The state of one account on the current connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountState {
    /// The gateway refused the account, for this reason.
    Refused(String),
    /// Cache and relay streams are open; the initial listing is in progress.
    Streaming,
    /// Every watched kind has completed its initial listing.
    Synced,
    /// Leader election: another replica holds the account's Lease and
    /// caches; this one relays only.
    Standby,
}

/// The writing side of the state channel, shared by the tasks that change it.
#[derive(Debug, Clone)]
pub(crate) struct Publisher {
    tx: std::sync::Arc<tokio::sync::watch::Sender<AgentState>>,
}

impl Publisher {
    /// A publisher and nothing subscribed yet.
    pub(crate) fn new() -> Self {
        Self {
            tx: std::sync::Arc::new(tokio::sync::watch::Sender::new(AgentState::default())),
        }
    }

    /// A new receiver of the state.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<AgentState> {
        self.tx.subscribe()
    }

    /// Marks the gateway connection up (Hello answered).
    pub(crate) fn connected(&self) {
        self.tx
            .send_if_modified(|s| !std::mem::replace(&mut s.connected, true));
    }

    /// Marks the connection down; no account has streams any more.
    pub(crate) fn disconnected(&self) {
        self.tx.send_if_modified(|s| {
            let changed = s.connected || !s.accounts.is_empty();
            s.connected = false;
            s.accounts.clear();
            changed
        });
    }

    /// Sets one account's state.
    pub(crate) fn account(&self, name: &str, state: AccountState) {
        self.tx.send_if_modified(|s| {
            s.accounts.insert(name.to_owned(), state.clone()).as_ref() != Some(&state)
        });
    }

    /// Forgets an account (removed from the configuration).
    pub(crate) fn remove(&self, name: &str) {
        self.tx
            .send_if_modified(|s| s.accounts.remove(name).is_some());
    }
}
