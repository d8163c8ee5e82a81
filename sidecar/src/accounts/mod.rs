//! The account registry: every account this sidecar has seen, its cache, its
//! relay stream, whether it is online, stale (its agent went away; reads are
//! served from the last cache during the grace period) or removed. The
//! tunnel writes it, the facade and the accounts API ([`crate::api`]) read
//! it, [`crate::lifecycle`] ends the grace period; relayed operations go to
//! the store's [`journal`]. Start with [`Accounts`].

pub mod authz;
pub mod journal;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
// tokio's clock, so tests can run grace periods under `tokio::time::pause`.
use tokio::time::Instant;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cache::Cache;
use crate::metrics::AccountGauges;
use crate::relay::{AgentTimes, RelayHandle};
use journal::Journal;

/// A clonable handle on the registry of accounts.
#[derive(Debug, Clone)]
pub struct Accounts {
    inner: Arc<RwLock<HashMap<String, Arc<Account>>>>,
    /// Bumped on every change of an account's presence; [`crate::lifecycle`] and
    /// the Clouddriver registration watch it (level-triggered: a watch, not a
    /// queue, so a slow reader never holds the tunnel up).
    changes: watch::Sender<u64>,
    /// Where relayed operations are recorded; none in unit tests.
    journal: Option<Journal>,
    instance: Arc<str>,
    /// Cancelled when the sidecar drains: no account relays new requests
    /// ([`Accounts::close_relays`]).
    relays_closing: CancellationToken,
}

impl Default for Accounts {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            changes: watch::Sender::new(0),
            journal: None,
            instance: Arc::from(crate::config::DEFAULT_INSTANCE_ID),
            relays_closing: CancellationToken::new(),
        }
    }
}

/// Where an account stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Presence {
    /// A cache stream from its agent is open.
    Online,
    /// No cache stream is open; reads are served from the last cache until
    /// the grace period ends.
    Stale,
    /// The grace period ended: deregistered, cache dropped.
    Removed,
}

/// One cached kind, as the accounts API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindStatus {
    /// API group, empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
    /// Kind name.
    pub kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// A full listing completed.
    pub synced: bool,
    /// Objects cached.
    pub objects: usize,
    /// The cache's resourceVersion for this kind.
    pub resource_version: String,
}

/// How far an account's registration with Clouddriver got.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// Empty without a `clouddriver` config; else `pending` (a call is due),
    /// `stored` (Clouddriver stored the definition but has not loaded it
    /// yet), `registered` (stored and loaded: Clouddriver serves it),
    /// `retrying` (the last call failed), `elsewhere` (another sidecar holds
    /// the account and owns its registration), `deregistered`.
    pub state: String,
    /// Clouddriver's account storage holds this sidecar's definition (as of
    /// the last call).
    pub stored: bool,
    /// Clouddriver has loaded it: `GET /credentials/{name}` answers with it.
    pub live: bool,
    /// Failed attempts since the last success.
    pub failures: u32,
    /// Why the last attempt failed (`unreachable`, `timeout`, `unavailable`,
    /// `server_error`, `storage_disabled`, `unreadable`, `forbidden`,
    /// `permissions`, `store_error`, `no_account_api`, `rejected`,
    /// `not_loaded`, `file`, `store`), if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The last failure in words, if the last attempt failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the state last changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated: Option<DateTime<Utc>>,
}

/// What one registration step found, for [`Account::set_registration`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationUpdate {
    /// The new state (see [`Registration::state`]).
    pub state: &'static str,
    /// Clouddriver stores the definition.
    pub stored: bool,
    /// Clouddriver serves the account.
    pub live: bool,
    /// A failure: its reason and its message.
    pub error: Option<(&'static str, String)>,
}

/// An account's state, as the accounts API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountStatus {
    /// Account name.
    pub name: String,
    /// `online`, `stale` or `removed`.
    pub state: Presence,
    /// The sidecar instance that owns (serves) the account.
    pub owner_instance: String,
    /// The agent identity that serves it (empty before any stream).
    pub agent_identity: String,
    /// A cache stream is open.
    pub online: bool,
    /// Cache streams open.
    pub cache_streams: usize,
    /// Seconds since the agent went away (stale and removed accounts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offline_seconds: Option<u64>,
    /// Kinds whose full listing completed.
    pub kinds_synced: usize,
    /// Kinds the agent has started to send.
    pub kinds_total: usize,
    /// The agent said every kind it watches has started and finished its
    /// first listing (always true for agents that do not say so, whose
    /// kinds count once started).
    pub agent_synced: bool,
    /// Objects cached.
    pub objects: usize,
    /// When this sidecar last applied a watch event (an object added,
    /// changed or deleted) from its agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_event: Option<DateTime<Utc>>,
    /// Discovery documents are held.
    pub discovery: bool,
    /// A relay stream is attached.
    pub relay: bool,
    /// Every cached kind.
    pub kinds: Vec<KindStatus>,
    /// Registration with Clouddriver.
    pub registration: Registration,
    /// Whether its agent reaches the cluster's API server: while it does
    /// not, answers from the cache carry a `Warning`.
    pub api_server: ApiServerStatus,
}

/// What an account's agent last said of the cluster's API server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerStatus {
    /// The API server answers the agent (or nothing says otherwise).
    pub reachable: bool,
    /// Since when it has not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable_since: Option<DateTime<Utc>>,
    /// The agent's last failed request, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl AccountStatus {
    /// Online, relay attached, discovery present and every known kind synced:
    /// kubectl gets complete answers.
    pub fn ready(&self) -> bool {
        self.online
            && self.relay
            && self.discovery
            && self.agent_synced
            && self.kinds_total > 0
            && self.kinds_synced == self.kinds_total
    }
}

/// The outcome of a relayed operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// The agent answered (any HTTP status).
    Answered,
    /// The agent reported a failure instead of a response.
    Failed,
    /// No response head within the relay timeout.
    Timeout,
    /// No relay stream, or it closed.
    Unavailable,
    /// Refused by the sidecar (the account is stale).
    Refused,
}

impl Outcome {
    /// The name the API and the journal use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Failed => "failed",
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
            Self::Refused => "refused",
        }
    }

    /// The outcome named `s`; an unknown name (a newer sidecar's) reads as
    /// failed.
    pub fn parse(s: &str) -> Self {
        [
            Self::Answered,
            Self::Timeout,
            Self::Unavailable,
            Self::Refused,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
        .unwrap_or(Self::Failed)
    }
}

/// One relayed operation with the time of each hop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// Request id on the relay stream (unique per sidecar process and
    /// account, not across sidecars).
    pub id: u64,
    /// The sidecar instance that relayed it (set by the [`journal`]).
    pub instance: String,
    /// HTTP method.
    pub method: String,
    /// Kubernetes path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// The `Kubectl-Command` header, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubectl_command: Option<String>,
    /// The facade received the request.
    pub received: DateTime<Utc>,
    /// Its head was handed to the relay stream.
    pub sent_to_agent: Option<DateTime<Utc>>,
    /// The agent had the whole request and began on it, placed on this
    /// sidecar's clock ([`Operation::place_agent_part`]).
    pub agent_started: Option<DateTime<Utc>>,
    /// The agent had its answer (response head or failure) and sent it up;
    /// a streamed body goes on after it. On this sidecar's clock.
    pub agent_finished: Option<DateTime<Utc>>,
    /// The facade answered its client (the response head).
    pub answered: Option<DateTime<Utc>>,
    /// HTTP status answered.
    pub status: u16,
    /// How it ended.
    pub outcome: Outcome,
    /// Why it failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Operation {
    /// The JSON names of the times of its hops, in the order they happen.
    pub const HOPS: [&str; 5] = [
        "received",
        "sentToAgent",
        "agentStarted",
        "agentFinished",
        "answered",
    ];

    /// Records the agent's part, read on the agent's clock, for a request
    /// sent at `sent` whose answer arrived here at `arrived`.
    ///
    /// The agent cannot have started before the request was sent to it nor
    /// finished after its answer arrived, so on one clock its interval lies
    /// within `[sent, arrived]`. Times that already do are kept as they are:
    /// the clocks agree to within the round trip, which is all this can
    /// tell. Times that do not show the clocks differ by more than that; the
    /// interval is then shifted, its length kept, by the least amount that
    /// makes it fit, so each hop still reads as an upper bound of its real
    /// length (clipped to the window if longer, which only a clock stepped
    /// during the request produces). The agent's own estimate of its offset
    /// to the gateway is not used: it is coarser than this round trip and
    /// measured against a third clock.
    pub fn place_agent_part(
        &mut self,
        sent: DateTime<Utc>,
        arrived: DateTime<Utc>,
        agent: AgentTimes,
    ) {
        let arrived = arrived.max(sent);
        let shift = if agent.started < sent {
            sent - agent.started
        } else if agent.finished > arrived {
            arrived - agent.finished
        } else {
            chrono::TimeDelta::zero()
        };
        let started = (agent.started + shift).clamp(sent, arrived);
        let finished = (agent.finished + shift).clamp(started, arrived);
        self.sent_to_agent = Some(sent);
        self.agent_started = Some(started);
        self.agent_finished = Some(finished);
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
    /// When the last watch event was applied (Unix milliseconds, 0 before
    /// any): an atomic, not in `state`, as it is written on every event.
    last_event_millis: AtomicI64,
    changes: watch::Sender<u64>,
    journal: Option<Journal>,
    /// Whether its reads are allowed, as the API server last said
    /// ([`authz`]); apart from `state` so a review waits on neither.
    decisions: Mutex<authz::Decisions>,
    /// The registry's: cancelled when the sidecar drains.
    relays_closing: CancellationToken,
}

#[derive(Debug)]
struct State {
    agent_identity: String,
    cache_streams: usize,
    /// Cache streams opened here so far.
    cache_generation: u64,
    /// The CA fingerprint of the cluster whose streams filled the cache;
    /// empty when unknown.
    cluster: String,
    /// The relay streams open from `agent_identity`, oldest first; the
    /// newest serves. One per open stream, so bounded by the streams a
    /// gateway carries for an identity.
    relays: Vec<RelayHandle>,
    highest_seq: Option<u64>,
    /// Since when no cache stream is open (`None` while online).
    offline_since: Option<(Instant, DateTime<Utc>)>,
    removed: bool,
    /// A deleted dynamic account: removed as soon as it is offline, with no
    /// grace period.
    withdrawn: bool,
    /// Cancelled by a manual disconnect; every stream of the account ends.
    connection: CancellationToken,
    registration: Registration,
    /// The namespaces its agent watches, as its last cache stream said.
    scope: NamespaceScope,
    /// Whom its reads are authorized as, as its last cache stream said
    /// (`None`: the agent's own identity, which filled the cache).
    reads_as: Option<authz::ReadIdentity>,
    /// Since when its agent has not reached the cluster's API server, and
    /// why, as its last heartbeat said (`None` while it does).
    api_down: Option<(DateTime<Utc>, String)>,
    /// Its newest cache stream's agent reports when every kind it watches
    /// has synced (`CacheOpen.reports_synced`) and has not yet.
    awaiting_synced: bool,
}

/// The namespaces an agent watches for an account (`CacheOpen`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceScope {
    /// Only these (all when empty).
    pub namespaces: Vec<String>,
    /// All but these.
    pub omit_namespaces: Vec<String>,
}

impl NamespaceScope {
    /// Whether the agent watches every namespace.
    pub fn is_all(&self) -> bool {
        self.namespaces.is_empty() && self.omit_namespaces.is_empty()
    }

    /// Whether the agent watches `namespace`.
    pub fn covers(&self, namespace: &str) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && !self.omit_namespaces.iter().any(|n| n == namespace)
    }
}

/// Locks ignoring poisoning: every critical section leaves the state
/// consistent, so a panic elsewhere must not take the account down.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Account {
    fn new(
        name: &str,
        changes: watch::Sender<u64>,
        journal: Option<Journal>,
        relays_closing: CancellationToken,
    ) -> Self {
        Self {
            name: name.to_owned(),
            cache: RwLock::default(),
            state: Mutex::new(State {
                agent_identity: String::new(),
                cache_streams: 0,
                cache_generation: 0,
                cluster: String::new(),
                relays: Vec::new(),
                highest_seq: None,
                offline_since: Some((Instant::now(), Utc::now())),
                removed: false,
                withdrawn: false,
                connection: CancellationToken::new(),
                registration: Registration::default(),
                api_down: None,
                awaiting_synced: false,
                scope: NamespaceScope::default(),
                reads_as: None,
            }),
            next_request_id: AtomicU64::new(1),
            last_event_millis: AtomicI64::new(0),
            changes,
            journal,
            decisions: Mutex::default(),
            relays_closing,
        }
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
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

    /// A cache stream from `identity` opened: the account is online.
    /// Unchecked: the tunnel opens streams with [`Account::open_cache`].
    pub fn cache_opened(&self, identity: &str) {
        {
            let mut s = lock(&self.state);
            opened(&mut s, identity);
        }
        self.changed();
    }

    /// Whether a stream from `identity` may open: not while another
    /// identity has a stream of the account open here (a second stream of
    /// the same identity — an agent moving connections — may). Checked
    /// again, atomically, by [`Account::open_cache`] and
    /// [`Account::attach_relay`]; this is for refusing before anything
    /// else is done for the stream.
    pub fn admits(&self, identity: &str) -> Result<(), AccountHeld> {
        held_by_another(&self.name, &lock(&self.state), identity)
    }

    /// A cache stream from `identity` watching `scope`, whose reads are
    /// authorized as `reads_as`, opens, unless the account is held by
    /// another identity ([`Account::admits`]): the account is online. The
    /// scope is set first, under the same lock: opening wakes whoever
    /// registers the account, and the registration carries it. An agent
    /// that `reports_synced` says when all its kinds have synced
    /// ([`Account::agent_synced`]); until then the account is not ready.
    pub fn open_cache(
        &self,
        identity: &str,
        scope: NamespaceScope,
        reads_as: Option<authz::ReadIdentity>,
        reports_synced: bool,
    ) -> Result<(), AccountHeld> {
        {
            let mut s = lock(&self.state);
            held_by_another(&self.name, &s, identity)?;
            s.scope = scope;
            s.awaiting_synced = reports_synced;
            if s.reads_as != reads_as {
                lock(&self.decisions).clear();
                s.reads_as = reads_as;
            }
            opened(&mut s, identity);
        }
        self.changed();
        Ok(())
    }

    /// Its agent said every kind it watches has finished its first listing
    /// (`CacheSynced`).
    pub fn agent_synced(&self) {
        lock(&self.state).awaiting_synced = false;
        self.changed();
    }

    /// Whom its cached reads are authorized as (`None`: they need no
    /// review; see [`authz`]).
    pub fn reads_as(&self) -> Option<authz::ReadIdentity> {
        lock(&self.state).reads_as.clone()
    }

    /// The API server's kept decision on `read`, if any ([`authz`]).
    pub fn read_decision(&self, read: &authz::ReadAttributes) -> Option<bool> {
        lock(&self.decisions).get(read, Instant::now())
    }

    /// Keeps the API server's decision on `read`.
    pub fn keep_read_decision(&self, read: authz::ReadAttributes, allowed: bool) {
        lock(&self.decisions).keep(read, allowed, Instant::now());
    }

    /// The namespaces its agent watches, from the newest cache stream's
    /// `open` (set before [`Account::cache_opened`], which wakes whoever
    /// registers the account).
    pub fn set_scope(&self, scope: NamespaceScope) {
        lock(&self.state).scope = scope;
    }

    /// The namespaces its agent watches.
    pub fn scope(&self) -> NamespaceScope {
        lock(&self.state).scope.clone()
    }

    /// A cache stream closed; returns whether the account is now offline
    /// (stale: its grace period starts).
    pub fn cache_closed(&self) -> bool {
        let offline = {
            let mut s = lock(&self.state);
            s.cache_streams = s.cache_streams.saturating_sub(1);
            if s.cache_streams == 0 && s.offline_since.is_none() {
                s.offline_since = Some((Instant::now(), Utc::now()));
            }
            s.cache_streams == 0
        };
        self.changed();
        offline
    }

    /// How many cache streams have opened here: changes whenever one does.
    pub fn cache_generation(&self) -> u64 {
        lock(&self.state).cache_generation
    }

    /// Replaces every kind held (a cache older than the store's record)
    /// with `loaded`, a fresher snapshot, and continues the message
    /// numbering from `seq`, the snapshot's; returns the kinds loaded.
    /// Watches served from the old kinds end (410), as their changes stop.
    pub fn replace_kinds(&self, loaded: crate::cache::snapshot::Loaded, seq: u64) -> usize {
        let mut s = lock(&self.state);
        let mut cache = self.write_cache();
        cache.clear_kinds();
        let kinds = cache.load(loaded);
        s.highest_seq = (seq > 0).then_some(seq);
        kinds
    }

    /// Records that a stream of the cluster whose CA has `fingerprint`
    /// (empty: unknown) opens. A cache held from another cluster under this
    /// name — deleted and created again for another cluster while this
    /// sidecar kept the old one — is no place to resume from: its kinds and
    /// numbering are dropped (discovery stays; the agent sends its own).
    /// Returns whether they were.
    pub fn set_cluster(&self, fingerprint: &str) -> bool {
        if fingerprint.is_empty() {
            return false;
        }
        let mut s = lock(&self.state);
        let other = !s.cluster.is_empty() && s.cluster != fingerprint;
        if other {
            self.write_cache().clear_kinds();
            s.highest_seq = None;
        }
        fingerprint.clone_into(&mut s.cluster);
        other
    }

    /// Where the account stands.
    pub fn presence(&self) -> Presence {
        let s = lock(&self.state);
        presence_of(&s)
    }

    /// When the account went offline, if it is not online.
    pub fn offline_since(&self) -> Option<Instant> {
        let s = lock(&self.state);
        if s.cache_streams > 0 {
            None
        } else {
            s.offline_since.map(|(i, _)| i)
        }
    }

    /// Ends the grace period: if the account is still offline, drops its
    /// cache, forgets its sequence numbers and marks it removed. Returns
    /// whether it did.
    pub fn remove_if_offline(&self) -> bool {
        {
            let mut s = lock(&self.state);
            if s.cache_streams > 0 || s.removed {
                return false;
            }
            // Under the state lock: a stream opening now waits in
            // `cache_opened` until the cache is empty, then fills it anew.
            *self.write_cache() = Cache::default();
            s.highest_seq = None;
            s.removed = true;
        }
        self.changed();
        true
    }

    /// The account was deleted (a dynamic account): once offline it is
    /// removed at once, without a grace period.
    pub fn withdraw(&self) {
        lock(&self.state).withdrawn = true;
        self.changed();
    }

    /// The account was created again: the grace period applies again.
    pub fn restore(&self) {
        lock(&self.state).withdrawn = false;
        self.changed();
    }

    /// Whether the account was deleted (see [`withdraw`](Self::withdraw)).
    pub fn withdrawn(&self) -> bool {
        lock(&self.state).withdrawn
    }

    /// A token for one stream of this account: cancelled by `parent` or by
    /// a manual [`disconnect`](Self::disconnect).
    pub fn stream_token(&self, parent: &CancellationToken) -> CancellationToken {
        let child = parent.child_token();
        let connection = lock(&self.state).connection.clone();
        let out = child.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = connection.cancelled() => child.cancel(),
                () = child.cancelled() => {}
            }
        });
        out
    }

    /// Ends every stream of the account (the agent reconnects) and detaches
    /// its relay. Returns whether any stream was open.
    pub fn disconnect(&self) -> bool {
        let had = {
            let mut s = lock(&self.state);
            let old = std::mem::take(&mut s.connection);
            old.cancel();
            s.relays.clear();
            s.cache_streams > 0
        };
        self.changed();
        had
    }

    /// Attaches a relay stream from `identity`, unless the account is held
    /// by another identity ([`Account::admits`]). The newest stream serves
    /// new requests; the earlier ones stay attached behind it (their
    /// requests in flight finish on them) and serve again if it closes
    /// first.
    pub fn attach_relay(&self, identity: &str, handle: RelayHandle) -> Result<(), AccountHeld> {
        let mut s = lock(&self.state);
        held_by_another(&self.name, &s, identity)?;
        identity.clone_into(&mut s.agent_identity);
        // Checked under the lock [`Accounts::close_relays`] reads the
        // streams under: a stream is closed here or there, never neither.
        if self.relays_closing.is_cancelled() {
            handle.close();
        }
        s.relays.push(handle);
        drop(s);
        self.changed();
        Ok(())
    }

    /// Detaches the relay stream `serial`, which closed or drains: the
    /// newest one still attached serves.
    pub fn detach_relay(&self, serial: u64) {
        let detached = {
            let mut s = lock(&self.state);
            let before = s.relays.len();
            s.relays.retain(|r| r.serial() != serial);
            s.relays.len() != before
        };
        if detached {
            self.changed();
        }
    }

    /// A receiver that sees every change of the account's presence, its
    /// relay streams included (and those of the other accounts).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The relay stream that serves: the newest open one.
    pub fn relay(&self) -> Option<RelayHandle> {
        lock(&self.state).relays.last().cloned()
    }

    /// Cancelled when the sidecar drains: the account relays no new
    /// request here from then on (it is about to move).
    pub fn relays_closing(&self) -> &CancellationToken {
        &self.relays_closing
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

    /// The highest contiguous cache message held, if any arrived.
    pub fn highest_seq(&self) -> Option<u64> {
        lock(&self.state).highest_seq
    }

    /// Continues the numbering from `seq`, the highest message the previous
    /// owner had applied when its snapshot was taken, so the agent's replay
    /// of what the snapshot holds is skipped. Only an account without
    /// numbering of its own takes it; returns whether this one did.
    pub fn continue_seq(&self, seq: u64) -> bool {
        let mut s = lock(&self.state);
        if s.highest_seq.is_some() || seq == 0 {
            return false;
        }
        s.highest_seq = Some(seq);
        true
    }

    /// Records the registration state. A failure counts towards
    /// [`Registration::failures`]; anything else resets it.
    pub fn set_registration(&self, update: RegistrationUpdate) {
        let mut s = lock(&self.state);
        let r = &mut s.registration;
        if update.error.is_some() {
            r.failures = r.failures.saturating_add(1);
        } else {
            r.failures = 0;
        }
        update.state.clone_into(&mut r.state);
        r.stored = update.stored;
        r.live = update.live;
        let (reason, message) = update.error.unzip();
        r.reason = reason.map(str::to_owned);
        r.last_error = message;
        r.updated = Some(Utc::now());
    }

    /// Records a relayed operation in the journal (without one, as in unit
    /// tests, it is not kept).
    pub fn record_operation(&self, op: &Operation) {
        if let Some(journal) = &self.journal {
            journal.record(&self.name, op);
        }
    }

    /// The account's status (`ownerInstance` is filled in by [`Accounts`]).
    pub fn status(&self) -> AccountStatus {
        let (identity, presence, streams, relay, offline, registration, api_down, awaiting) = {
            let s = lock(&self.state);
            (
                s.agent_identity.clone(),
                presence_of(&s),
                s.cache_streams,
                !s.relays.is_empty(),
                s.offline_since
                    .filter(|_| s.cache_streams == 0)
                    .map(|(i, _)| i.elapsed().as_secs()),
                s.registration.clone(),
                s.api_down.clone(),
                s.awaiting_synced,
            )
        };
        let cache = self.read_cache();
        let (kinds_synced, kinds_total, objects) = cache.counts();
        let mut kinds: Vec<KindStatus> = cache
            .kinds()
            .map(|k| KindStatus {
                group: k.info.group.clone(),
                version: k.info.version.clone(),
                resource: k.info.resource.clone(),
                kind: k.info.kind.clone(),
                namespaced: k.info.namespaced,
                synced: k.synced,
                objects: k.objects.len(),
                resource_version: k.resource_version.clone(),
            })
            .collect();
        kinds.sort_by(|a, b| (&a.group, &a.resource).cmp(&(&b.group, &b.resource)));
        AccountStatus {
            name: self.name.clone(),
            state: presence,
            owner_instance: String::new(),
            agent_identity: identity,
            online: presence == Presence::Online,
            cache_streams: streams,
            offline_seconds: offline,
            kinds_synced,
            kinds_total,
            agent_synced: !awaiting,
            objects,
            last_event: self.last_event(),
            discovery: cache.has_discovery(),
            relay,
            kinds,
            registration,
            api_server: ApiServerStatus {
                reachable: api_down.is_none(),
                unreachable_since: api_down.as_ref().map(|(since, _)| *since),
                last_error: api_down.map(|(_, e)| e),
            },
        }
    }

    /// Notes that a watch event from its agent was applied now.
    pub fn event_applied(&self) {
        self.last_event_millis
            .store(Utc::now().timestamp_millis(), Ordering::Relaxed);
    }

    /// When a watch event from its agent was last applied, if any was.
    pub fn last_event(&self) -> Option<DateTime<Utc>> {
        match self.last_event_millis.load(Ordering::Relaxed) {
            0 => None,
            millis => DateTime::from_timestamp_millis(millis),
        }
    }

    /// Records what its agent's heartbeat says of the cluster's API server:
    /// unreachable since `since_unix_millis` (0: it answers), and why.
    pub fn set_api_health(&self, since_unix_millis: i64, error: &str) {
        let down = (since_unix_millis > 0).then(|| {
            let since = DateTime::from_timestamp_millis(since_unix_millis).unwrap_or_else(Utc::now);
            // Bounded: it is shown in warnings and the accounts API.
            (since, error.chars().take(256).collect())
        });
        lock(&self.state).api_down = down;
    }

    /// Since when its agent has not reached the cluster's API server, and
    /// why; `None` while it does.
    pub fn api_down(&self) -> Option<(DateTime<Utc>, String)> {
        lock(&self.state).api_down.clone()
    }
}

/// A stream was refused: the account's streams here are open from another
/// agent identity. The refused agent is not told which.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "account {account:?} is served by another agent identity on this sidecar; refused while its streams are open"
)]
pub struct AccountHeld {
    /// The account.
    pub account: String,
    /// The identity whose streams are open (for the log, not the agent).
    pub holder: String,
}

fn held_by_another(account: &str, s: &State, identity: &str) -> Result<(), AccountHeld> {
    let held = s.cache_streams > 0 || !s.relays.is_empty();
    if held && s.agent_identity != identity {
        return Err(AccountHeld {
            account: account.to_owned(),
            holder: s.agent_identity.clone(),
        });
    }
    Ok(())
}

fn opened(s: &mut State, identity: &str) {
    s.cache_streams += 1;
    s.cache_generation += 1;
    identity.clone_into(&mut s.agent_identity);
    s.offline_since = None;
    s.removed = false;
}

fn presence_of(s: &State) -> Presence {
    if s.cache_streams > 0 {
        Presence::Online
    } else if s.removed {
        Presence::Removed
    } else {
        Presence::Stale
    }
}

/// An agent and the streams it has open here, as the accounts API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// The agent identity the gateway verified.
    pub identity: String,
    /// Accounts it serves (or last served) here.
    pub accounts: Vec<AgentAccount>,
}

/// One account of an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentAccount {
    /// Account name.
    pub name: String,
    /// `online`, `stale` or `removed`.
    pub state: Presence,
    /// Cache streams open.
    pub cache_streams: usize,
    /// A relay stream is attached.
    pub relay: bool,
}

impl Accounts {
    /// An empty registry that keeps no operations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the accounts' relayed operations in `journal`.
    #[must_use]
    pub fn with_journal(mut self, journal: Journal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// The recent relayed operations of account `name`, oldest first, as
    /// the store holds them (relayed by any sidecar); `None` when neither
    /// this sidecar nor the store knows the account.
    pub async fn operations(&self, name: &str) -> crate::store::Result<Option<Vec<Operation>>> {
        let Some(journal) = &self.journal else {
            return Ok(self.get(name).map(|_| Vec::new()));
        };
        let ops = journal.operations(name).await?;
        let known = !ops.is_empty() || self.get(name).is_some() || journal.known(name).await?;
        Ok(known.then_some(ops))
    }

    /// Names this sidecar instance as the owner of its accounts.
    #[must_use]
    pub fn with_instance(mut self, instance: &str) -> Self {
        self.instance = Arc::from(instance);
        self
    }

    fn owned(&self, mut status: AccountStatus) -> AccountStatus {
        self.instance
            .as_ref()
            .clone_into(&mut status.owner_instance);
        status
    }

    /// A receiver that sees every change of an account's presence.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The status of account `name`, if known.
    pub fn status(&self, name: &str) -> Option<AccountStatus> {
        self.get(name).map(|a| self.owned(a.status()))
    }

    /// Every account, by name.
    pub fn all(&self) -> Vec<Arc<Account>> {
        let mut accounts: Vec<Arc<Account>> = self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        accounts.sort_by(|a, b| a.name.cmp(&b.name));
        accounts
    }

    /// Every account's gauges for a scrape of the metrics, by name. An
    /// account deleted (a dynamic account withdrawn) and gone has none: it
    /// is not an account any more, rather than one whose agent is missing.
    pub fn gauges(&self) -> Vec<AccountGauges> {
        self.all()
            .iter()
            .filter(|a| !(a.withdrawn() && a.presence() == Presence::Removed))
            .map(|account| {
                let (objects, cache_bytes) = {
                    let cache = account.read_cache();
                    let mut bytes = 0usize;
                    let mut objects = 0usize;
                    for kind in cache.kinds() {
                        for entry in kind.objects.values() {
                            objects += 1;
                            bytes += entry.json().len();
                        }
                    }
                    (objects, bytes)
                };
                AccountGauges {
                    name: account.name().to_owned(),
                    objects,
                    cache_bytes,
                    api_server_reachable: account.api_down().is_none(),
                    state: match account.presence() {
                        Presence::Online => "online",
                        Presence::Stale => "stale",
                        Presence::Removed => "removed",
                    },
                }
            })
            .collect()
    }

    /// The status of every account, by name.
    pub fn list(&self) -> Vec<AccountStatus> {
        self.all().iter().map(|a| self.owned(a.status())).collect()
    }

    /// Every agent identity with its accounts, by identity.
    pub fn agents(&self) -> Vec<AgentStatus> {
        let mut by_identity: BTreeMap<String, Vec<AgentAccount>> = BTreeMap::new();
        for a in self.all() {
            let s = lock(&a.state);
            if s.agent_identity.is_empty() {
                continue;
            }
            by_identity
                .entry(s.agent_identity.clone())
                .or_default()
                .push(AgentAccount {
                    name: a.name.clone(),
                    state: presence_of(&s),
                    cache_streams: s.cache_streams,
                    relay: !s.relays.is_empty(),
                });
        }
        by_identity
            .into_iter()
            .map(|(identity, accounts)| AgentStatus { identity, accounts })
            .collect()
    }

    /// Disconnects every account served by agent `identity`; returns the
    /// accounts disconnected, `None` if the identity serves none.
    pub fn disconnect_agent(&self, identity: &str) -> Option<Vec<String>> {
        let accounts: Vec<Arc<Account>> = self
            .all()
            .into_iter()
            .filter(|a| lock(&a.state).agent_identity == identity)
            .collect();
        if accounts.is_empty() {
            return None;
        }
        Some(
            accounts
                .iter()
                .map(|a| {
                    a.disconnect();
                    a.name.clone()
                })
                .collect(),
        )
    }

    /// Account `name`, if known.
    pub fn get(&self, name: &str) -> Option<Arc<Account>> {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The sidecar drains: from now on no account relays a new request
    /// (each is refused as retryable: the account is about to move), and
    /// this resolves once every request the relay streams carry is
    /// answered, or at `grace`. Until then the streams stay open: peers
    /// forward requests here through the peer port, which outlives the
    /// facade's listener, so the facade's own drain does not cover them.
    /// Returns how many requests were still in flight at `grace`.
    pub async fn close_relays(&self, grace: std::time::Duration) -> usize {
        self.relays_closing.cancel();
        let handles: Vec<RelayHandle> = self
            .all()
            .iter()
            .flat_map(|a| lock(&a.state).relays.clone())
            .collect();
        let settled =
            futures::future::join_all(handles.iter().map(|h| h.close().cancelled_owned()));
        match tokio::time::timeout(grace, settled).await {
            Ok(_) => 0,
            Err(_) => handles.iter().map(RelayHandle::in_flight).sum(),
        }
    }

    /// Account `name`, created if unknown.
    pub fn get_or_create(&self, name: &str) -> Arc<Account> {
        if let Some(a) = self.get(name) {
            return a;
        }
        let account = self
            .inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(Account::new(
                    name,
                    self.changes.clone(),
                    self.journal.clone(),
                    self.relays_closing.clone(),
                ))
            })
            .clone();
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
        account
    }
}

/// How long an account has been offline, rounded to seconds, for messages.
pub fn age_seconds(since: Option<Instant>) -> u64 {
    since.map_or(0, |s| s.elapsed().as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn gauges_leave_out_deleted_accounts_only() {
        let accounts = Accounts::new();
        accounts.get_or_create("prod").cache_opened("id");
        // An account deleted while offline has no gauges; one merely gone
        // past its grace period is shown removed.
        for name in ["gone", "deleted"] {
            let a = accounts.get_or_create(name);
            a.cache_opened("id");
            a.cache_closed();
            assert!(a.remove_if_offline());
        }
        accounts.get_or_create("deleted").withdraw();
        let gauges = accounts.gauges();
        let states: Vec<(&str, &str)> = gauges.iter().map(|g| (g.name.as_str(), g.state)).collect();
        assert_eq!(states, [("gone", "removed"), ("prod", "online")]);
        assert!(gauges.iter().all(|g| g.objects == 0 && g.cache_bytes == 0));
        assert!(gauges.iter().all(|g| g.api_server_reachable));
    }

    #[test]
    fn the_last_applied_event_is_shown_once_there_is_one() {
        let accounts = Accounts::new();
        let a = accounts.get_or_create("a");
        assert_eq!(accounts.status("a").unwrap().last_event, None);
        let before = Utc::now() - chrono::TimeDelta::milliseconds(1);
        a.event_applied();
        let shown = accounts.status("a").unwrap().last_event.unwrap();
        assert!(shown >= before && shown <= Utc::now(), "{shown}");
    }

    fn at(micros: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(1_700_000_000_000_000 + micros).unwrap()
    }

    /// A `GET /api` the facade received at `received`.
    fn operation(id: u64, received: DateTime<Utc>) -> Operation {
        Operation {
            id,
            instance: String::new(),
            method: "GET".into(),
            path: "/api".into(),
            query: String::new(),
            kubectl_command: None,
            received,
            sent_to_agent: None,
            agent_started: None,
            agent_finished: None,
            answered: None,
            status: 200,
            outcome: Outcome::Answered,
            message: None,
        }
    }

    fn placed(sent: i64, arrived: i64, started: i64, finished: i64) -> (i64, i64) {
        let mut op = operation(1, at(sent));
        let agent = AgentTimes {
            started: at(started),
            finished: at(finished),
        };
        op.place_agent_part(at(sent), at(arrived), agent);
        assert_eq!(op.sent_to_agent, Some(at(sent)));
        let micros = |t: Option<DateTime<Utc>>| (t.unwrap() - at(0)).num_microseconds().unwrap();
        (micros(op.agent_started), micros(op.agent_finished))
    }

    #[test]
    fn agent_times_are_kept_when_the_clocks_agree_and_shifted_when_not() {
        // Within the round trip: as reported.
        assert_eq!(placed(0, 1000, 200, 700), (200, 700));
        assert_eq!(placed(0, 1000, 0, 1000), (0, 1000));
        // An agent clock 5 s behind: moved up to the send, length kept.
        assert_eq!(placed(0, 1000, -5_000_000, -4_999_600), (0, 400));
        // 5 s ahead: moved back to the arrival.
        assert_eq!(placed(0, 1000, 5_000_000, 5_000_300), (700, 1000));
        // Longer than the window (a clock stepped meanwhile): clipped.
        assert_eq!(placed(0, 1000, -100, 2000), (0, 1000));
    }

    proptest! {
        #[test]
        fn placed_agent_times_always_fall_between_send_and_arrival(
            sent in -1_000_000i64..1_000_000,
            trip in 0i64..1_000_000,
            started in -10_000_000i64..10_000_000,
            length in 0i64..2_000_000,
        ) {
            let arrived = sent + trip;
            let (s, f) = placed(sent, arrived, started, started + length);
            prop_assert!(sent <= s && s <= f && f <= arrived, "{sent} {s} {f} {arrived}");
            if sent <= started && started + length <= arrived {
                prop_assert_eq!((s, f), (started, started + length));
            } else if length <= trip {
                prop_assert_eq!(f - s, length, "the agent's own duration is kept");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn closing_relays_waits_for_what_they_carry_and_closes_later_streams_too() {
        let accounts = Accounts::new();
        let prod = accounts.get_or_create("prod");
        let (tx, _rx) = tokio::sync::mpsc::channel(4);
        let busy = RelayHandle::new(tx);
        prod.attach_relay("agent", busy.clone()).unwrap();
        let in_flight = busy.register(1).unwrap();
        // Unanswered: the drain gives up at its grace and says how many.
        let grace = Duration::from_secs(5);
        assert_eq!(accounts.close_relays(grace).await, 1);
        assert!(prod.relays_closing().is_cancelled());
        assert!(
            busy.register(2).is_none(),
            "a closed stream takes no request"
        );
        // A stream the agent opens after the drain began is closed too.
        let (tx, _rx) = tokio::sync::mpsc::channel(4);
        let late = RelayHandle::new(tx);
        prod.attach_relay("agent", late.clone()).unwrap();
        assert!(late.register(3).is_none(), "a later stream took a request");
        // Answered: the drain ends at once.
        drop(in_flight);
        busy.cancel(1);
        let start = tokio::time::Instant::now();
        assert_eq!(accounts.close_relays(grace).await, 0);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn seq_tracking_acks_highest_contiguous() {
        let a = Account::new("a", watch::Sender::new(0), None, CancellationToken::new());
        assert_eq!(a.record_seq(5), (5, false));
        assert_eq!(a.record_seq(6), (6, false));
        assert_eq!(a.record_seq(4), (6, false));
        assert_eq!(a.record_seq(6), (6, false));
        assert_eq!(a.record_seq(9), (9, true));
    }

    #[test]
    fn an_agent_that_reports_synced_is_synced_once_it_says_so() {
        let a = Account::new("a", watch::Sender::new(0), None, CancellationToken::new());
        let scope = NamespaceScope::default();
        a.open_cache("id", scope.clone(), None, true).unwrap();
        // Whatever kinds have started and synced, more may start.
        assert!(!a.status().agent_synced);
        a.agent_synced();
        assert!(a.status().agent_synced);
        // Each stream says it again.
        a.open_cache("id", scope.clone(), None, true).unwrap();
        assert!(!a.status().agent_synced);
        // An agent that does not report it: its started kinds decide.
        a.open_cache("id", scope, None, false).unwrap();
        assert!(a.status().agent_synced);
    }

    #[tokio::test]
    async fn presence_goes_online_stale_removed_and_back() {
        let accounts = Accounts::new().with_instance("me");
        let mut changes = accounts.subscribe();
        let a = accounts.get_or_create("a");
        assert_eq!(a.presence(), Presence::Stale);
        a.cache_opened("id");
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert_eq!(a.presence(), Presence::Online);
        assert!(a.offline_since().is_none());
        assert!(!a.remove_if_offline(), "online accounts are never removed");
        a.write_cache().sync_start(&spinlink_proto::v1::Kind {
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
            kind: "Pod".into(),
            namespaced: true,
        });
        assert!(a.cache_closed());
        assert!(changes.has_changed().unwrap());
        assert_eq!(a.presence(), Presence::Stale);
        assert!(a.offline_since().is_some());
        assert_eq!(a.status().kinds.len(), 1, "stale accounts keep their cache");
        assert!(a.remove_if_offline());
        assert!(!a.remove_if_offline());
        let st = accounts.status("a").unwrap();
        assert_eq!((st.state, st.kinds_total), (Presence::Removed, 0));
        assert_eq!(st.owner_instance, "me");
        assert_eq!(serde_json::to_value(&st).unwrap()["state"], "removed");
        a.cache_opened("id2");
        assert_eq!(a.presence(), Presence::Online);
    }

    #[test]
    fn a_cache_of_another_cluster_under_the_same_name_is_dropped() {
        let a = Account::new("a", watch::Sender::new(0), None, CancellationToken::new());
        let pods = spinlink_proto::v1::Kind {
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
            kind: "Pod".into(),
            namespaced: true,
        };
        let fill = |a: &Account| {
            a.record_seq(7);
            let mut c = a.write_cache();
            c.sync_start(&pods);
            c.sync_end(&pods, "10");
        };
        // Unknown, then known: nothing to compare with.
        assert!(!a.set_cluster(""));
        fill(&a);
        assert!(!a.set_cluster("aa11"));
        assert!(!a.set_cluster("aa11"), "the same cluster again");
        assert!(!a.set_cluster(""), "an agent that does not say");
        assert_eq!(a.read_cache().counts().0, 1);
        // Another cluster: the kinds and the numbering go.
        assert!(a.set_cluster("bb22"));
        assert_eq!(a.read_cache().counts(), (0, 0, 0));
        assert_eq!(a.highest_seq(), None);
        fill(&a);
        assert!(!a.set_cluster("bb22"));
    }

    #[tokio::test]
    async fn disconnect_ends_streams() {
        let accounts = Accounts::new();
        let a = accounts.get_or_create("a");
        let parent = CancellationToken::new();
        let stream = a.stream_token(&parent);
        a.cache_opened("spiffe://x/agent/1");
        assert_eq!(accounts.agents()[0].identity, "spiffe://x/agent/1");
        assert!(accounts.disconnect_agent("nobody").is_none());
        assert_eq!(
            accounts.disconnect_agent("spiffe://x/agent/1").unwrap(),
            ["a"]
        );
        tokio::time::timeout(Duration::from_secs(10), stream.cancelled())
            .await
            .unwrap();
        assert!(!parent.is_cancelled());
        let later = a.stream_token(&parent);
        assert!(
            !later.is_cancelled(),
            "streams opened after a disconnect live on"
        );
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
            state: Presence::Online,
            owner_instance: "s".into(),
            agent_identity: "x".into(),
            online: true,
            cache_streams: 1,
            offline_seconds: None,
            kinds_synced: 2,
            kinds_total: 2,
            agent_synced: true,
            objects: 0,
            last_event: None,
            discovery: true,
            relay: true,
            kinds: Vec::new(),
            registration: Registration::default(),
            api_server: ApiServerStatus::default(),
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
        // Every kind started has synced, but the agent has not said that
        // was all of them.
        assert!(
            !AccountStatus {
                agent_synced: false,
                ..ready.clone()
            }
            .ready()
        );
        let json = serde_json::to_value(&ready).unwrap();
        assert_eq!(json["agentIdentity"], "x");
        assert_eq!(json["kindsSynced"], 2);
    }
}
