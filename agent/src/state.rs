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
    /// Every account the agent runs, connected or not: the configuration
    /// file's and the assigned (dynamic) ones.
    pub configured: BTreeMap<String, Configured>,
}

/// What the agent knows of one account it runs, whatever the connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Configured {
    /// Assigned over `Assignments` (a dynamic account), not in the file.
    pub dynamic: bool,
    /// The namespaces it is limited to (all when empty).
    pub namespaces: Vec<String>,
    /// The cluster's version (`gitVersion`) as last read for `Hello`;
    /// empty until read, or when the API server did not answer.
    pub kubernetes_version: String,
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

    /// The accounts the agent runs now, `dynamic` saying which were
    /// assigned; versions already read are kept.
    pub(crate) fn configured<'a>(
        &self,
        accounts: impl IntoIterator<Item = (&'a crate::AccountConfig, bool)>,
    ) {
        self.tx.send_if_modified(|s| {
            let next: BTreeMap<String, Configured> = accounts
                .into_iter()
                .map(|(a, dynamic)| {
                    let kubernetes_version = s
                        .configured
                        .get(&a.name)
                        .map(|c| c.kubernetes_version.clone())
                        .unwrap_or_default();
                    let configured = Configured {
                        dynamic,
                        namespaces: a.namespaces.clone(),
                        kubernetes_version,
                    };
                    (a.name.clone(), configured)
                })
                .collect();
            let changed = s.configured != next;
            s.configured = next;
            changed
        });
    }

    /// Records the cluster version of `name` read for `Hello` (an empty
    /// one, when the API server did not answer, keeps the last known).
    pub(crate) fn kubernetes_version(&self, name: &str, version: &str) {
        self.tx
            .send_if_modified(|s| match s.configured.get_mut(name) {
                Some(c) if !version.is_empty() && c.kubernetes_version != version => {
                    version.clone_into(&mut c.kubernetes_version);
                    true
                }
                _ => false,
            });
    }
}
