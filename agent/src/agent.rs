//! The agent's main loop: connect, `Hello`, run every granted account's
//! streams, and when anything breaks tear it all down and start again after
//! a jittered backoff.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use spinlink_proto::v1::{ControlEvent, ControlRequest, HelloResponse, Reconnect, control_event};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::cache::outbox::{Outbox, initial_seq};
use crate::cache::{self, CacheSettings};
use crate::cluster::Cluster;
use crate::config::{AccountConfig, Config};
use crate::connection::{connect, session::Session};
use crate::kinds::KindFilter;
use crate::metrics::Metrics;
use crate::relay;
use crate::reload::{ConfigWatcher, RELOAD_QUEUE};
use crate::state::{AccountState, AgentState, Publisher};
use crate::{Error, Result};

/// A connection that stayed up this long resets the reconnect backoff.
pub const STABLE_CONNECTION: Duration = Duration::from_secs(30);

/// The agent: configuration, per-account unacked windows, list budgets,
/// metrics and published state. Build with [`Agent::new`], run with
/// [`Agent::run`].
#[derive(Debug)]
pub struct Agent {
    /// The running configuration: the file's, plus the assigned accounts.
    config: Config,
    /// The configuration as the file states it.
    file_config: Config,
    /// Accounts assigned over `Assignments` (dynamic accounts), by name.
    assigned: BTreeMap<String, AccountConfig>,
    state: Publisher,
    /// Per account; outlives connections so the window is replayed.
    outboxes: BTreeMap<String, Arc<Outbox>>,
    /// Per account list budget (`tasks.budgetPerAccount`).
    account_budgets: BTreeMap<String, Arc<Semaphore>>,
    /// Per account: held by its one cache stream (see [`AccountRun`]).
    cache_slots: BTreeMap<String, Arc<tokio::sync::Mutex<()>>>,
    /// Per account with leader election: this replica's term (0: another
    /// replica caches) and the elector's stop signal.
    leaders: BTreeMap<String, (tokio::sync::watch::Receiver<u64>, CancellationToken)>,
    /// The electors; dropped (aborted) with the agent, so a replica that
    /// dies stops renewing.
    electors: JoinSet<()>,
    /// Lease holder identity.
    identity: String,
    /// The agent's shutdown signal, once running.
    shutdown: CancellationToken,
    /// Agent-wide list budget (`tasks.totalBudget`).
    total_budget: Arc<Semaphore>,
    metrics: Metrics,
    /// Bound in `new` so the address is known before `run`.
    admin: Option<std::net::TcpListener>,
}

impl Agent {
    /// Checks the configuration and prepares the agent; nothing is dialled yet.
    pub fn new(mut config: Config) -> Result<Agent> {
        config.validate()?;
        config.read_kubeconfig_digests();
        let start = initial_seq();
        let names = || config.kubernetes.accounts.iter().map(|a| a.name.clone());
        let outboxes = names()
            .map(|n| (n, Arc::new(Outbox::new(config.cache.unacked_window, start))))
            .collect();
        let account_budgets = names()
            .map(|n| (n, Arc::new(Semaphore::new(config.tasks.budget_per_account))))
            .collect();
        let identity = config
            .leader_election
            .identity
            .clone()
            .unwrap_or_else(crate::leader::default_identity);
        let cache_slots = names()
            .map(|n| (n, Arc::new(tokio::sync::Mutex::new(()))))
            .collect();
        let admin = match config.admin.listen {
            Some(addr) => {
                let bind_error = |source| Error::AdminBind { addr, source };
                let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
                listener.set_nonblocking(true).map_err(bind_error)?;
                Some(listener)
            }
            None => None,
        };
        let state = Publisher::new();
        state.configured(config.kubernetes.accounts.iter().map(|a| (a, false)));
        Ok(Agent {
            admin,
            total_budget: Arc::new(Semaphore::new(config.tasks.total_budget)),
            file_config: config.clone(),
            assigned: BTreeMap::new(),
            config,
            state,
            outboxes,
            account_budgets,
            cache_slots,
            leaders: BTreeMap::new(),
            electors: JoinSet::new(),
            identity,
            shutdown: CancellationToken::new(),
            metrics: Metrics::new(),
        })
    }

    /// The admin port's address, when `admin.listen` is set.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The agent's metrics (served by the admin port, read by tests).
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// The agent's state as it changes.
    pub fn state(&self) -> tokio::sync::watch::Receiver<AgentState> {
        self.state.subscribe()
    }

    /// Runs until `shutdown` is cancelled, reconnecting as needed. Fails only
    /// when an account's cluster configuration cannot be loaded.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        if let Some(listener) = self.admin.take() {
            let addr = listener.local_addr().ok();
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|source| Error::AdminBind {
                    addr: addr.unwrap_or_else(|| ([0, 0, 0, 0], 0).into()),
                    source,
                })?;
            info!(?addr, "admin port serving");
            tokio::spawn(crate::admin::serve(
                listener,
                self.metrics.clone(),
                self.state.subscribe(),
                shutdown.clone(),
            ));
        }
        self.shutdown = shutdown.clone();
        let mut clusters = Vec::new();
        for account in &self.config.kubernetes.accounts {
            clusters.push(Cluster::connect(account, &self.metrics).await?);
        }
        for cluster in &clusters {
            self.start_elector(cluster);
        }
        let (reload_tx, mut reloads) = tokio::sync::mpsc::channel(RELOAD_QUEUE);
        match (&self.config.file, self.config.reload_interval_seconds) {
            (Some(file), secs) if secs > 0 => {
                let watcher = ConfigWatcher::new(
                    file.clone(),
                    Duration::from_secs(secs),
                    self.metrics.clone(),
                );
                tokio::spawn(watcher.run(reload_tx, shutdown.clone()));
            }
            // Nothing will ever arrive.
            _ => drop(reload_tx),
        }
        let mut backoff = Backoff::from_config(&self.config.reconnect);
        loop {
            let started = tokio::time::Instant::now();
            let outcome = tokio::select! {
                outcome = self.session(&mut clusters, &mut reloads) => outcome,
                () = shutdown.cancelled() => break,
            };
            self.state.disconnected();
            let Err(e) = outcome;
            if started.elapsed() >= STABLE_CONNECTION {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            warn!(error = %e, ?delay, "gateway connection ended, reconnecting");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                Some(config) = reloads.recv() => self.reload(config, &mut clusters, None).await?,
                () = shutdown.cancelled() => break,
            }
        }
        // Dropping the session above closed every stream and the connection.
        self.state.disconnected();
        info!("agent stopped");
        Ok(())
    }

    /// The agent's life on gateway connections: it only ends with the error
    /// that ended the current connection. A `Reconnect` from the gateway
    /// moves every account to a new connection before the old one is let
    /// go (make-before-break); the old one finishes its relayed requests in
    /// the background.
    async fn session(
        &mut self,
        clusters: &mut Vec<Cluster>,
        reloads: &mut tokio::sync::mpsc::Receiver<Config>,
    ) -> Result<Infallible> {
        let mut link = self.open_link(clusters).await?;
        // Old connections finishing their relayed requests.
        let mut draining: JoinSet<()> = JoinSet::new();
        let mut hello_backoff = Backoff::from_config(&self.config.reconnect);
        let mut move_backoff = Backoff::from_config(&self.config.reconnect);
        let mut renew_backoff = Backoff::from_config(&self.config.reconnect);
        let mut renew_not_before = tokio::time::Instant::now();
        let mut assign_backoff = Backoff::from_config(&self.config.reconnect);
        // Set while a `Reconnect` could not be followed yet: its deadline.
        let mut pending_move: Option<(tokio::time::Instant, Duration)> = None;
        // When the pending move is tried (next).
        let mut move_at = tokio::time::Instant::now();
        loop {
            let retry = async {
                if link.refused.is_empty() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(hello_backoff.next_delay()).await;
            };
            let renew_at = link.session.renew_at();
            let renew = async {
                match renew_at {
                    Some(at) => tokio::time::sleep_until(at.max(renew_not_before)).await,
                    None => std::future::pending().await,
                }
            };
            let assign_idle = !self.config.dynamic_accounts.enabled || link.assignments.is_some();
            let assign_retry = async {
                if assign_idle {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(assign_backoff.next_delay()).await;
            };
            let move_retry = async {
                if pending_move.is_none() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep_until(move_at).await;
            };
            tokio::select! {
                Some(done) = link.accounts.join_next() => match done {
                    // Only a drained account ends well, and only old links drain.
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(join) => return Err(Error::Task(join.to_string())),
                },
                event = next_control(&mut link.control, &self.metrics) => match event {
                    Some(Reconnect { reason, deadline_millis }) => {
                        let grace = Duration::from_millis(u64::from(deadline_millis));
                        // Not all at once with every other agent of this
                        // gateway: see `move_spread`.
                        let spread = crate::backoff::move_spread(grace, self.config.reconnect.move_spread_max());
                        info!(%reason, ?grace, ?spread, "gateway asks to move to a new connection");
                        let now = tokio::time::Instant::now();
                        pending_move = Some((now + grace, grace));
                        move_at = now + spread;
                        move_backoff.reset();
                    }
                    None => link.control = None,
                },
                () = move_retry => {
                    let Some((deadline, _)) = pending_move else { continue };
                    let grace = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if let Some(old) = self.try_move(clusters, &mut link, grace).await {
                        draining.spawn(old);
                        pending_move = None;
                    } else {
                        move_at = tokio::time::Instant::now() + move_backoff.next_delay();
                    }
                }
                () = renew => match link.session.renew().await {
                    Ok(renewed) => {
                        renew_backoff.reset();
                        self.metrics.token_renewals.inc();
                        debug!(tokens = renewed, "channel tokens renewed");
                    }
                    // Open streams do not need the tokens; a stream opened
                    // meanwhile asks for its own (`Session::token`).
                    Err(e) => {
                        let delay = renew_backoff.next_delay();
                        warn!(error = %e, ?delay, "channel token renewal failed; retrying");
                        renew_not_before = tokio::time::Instant::now() + delay;
                    }
                },
                () = retry => match link.session.hello(&link.refused).await {
                    Ok(answer) => {
                        let asked = std::mem::take(&mut link.refused);
                        link.refused = self.answer(&mut link, clusters, &asked, answer, &BTreeMap::new());
                        if link.refused.is_empty() {
                            hello_backoff.reset();
                        }
                    }
                    // Over the identity's Hello rate (a restart's Hellos
                    // count too): the accounts this connection carries are
                    // not to be dropped for it. Asked again after the next,
                    // longer, backoff.
                    Err(e) if e.is_hello_rate_refusal() => {
                        warn!(error = %e, accounts = ?link.refused, "Hello for refused accounts not answered; retrying later");
                    }
                    Err(e) => return Err(e),
                },
                Some(_) = draining.join_next() => {}
                Some(config) = reloads.recv() => {
                    self.reload(config, clusters, Some(&mut link)).await?;
                }
                change = next_assignment(&mut link.assignments) => match change {
                    Ok(change) => self.assignment(change, clusters, &mut link).await?,
                    Err(status) => {
                        warn!(error = %status, "Assignments stream ended; reopening it");
                        link.assignments = None;
                        assign_backoff.reset();
                    }
                },
                () = assign_retry => {
                    link.assignments = open_assignments(&self.config, &link.session).await;
                    if link.assignments.is_some() {
                        assign_backoff.reset();
                    }
                }
            }
        }
    }

    /// A new configuration file: applied with the assigned accounts it does
    /// not define itself.
    async fn reload(
        &mut self,
        config: Config,
        clusters: &mut Vec<Cluster>,
        link: Option<&mut Link>,
    ) -> Result<()> {
        let (merged, shadowed) = crate::assignments::merged(&config, &self.assigned);
        for name in &shadowed {
            warn!(account = %name, "assigned account refused: the configuration file defines an account of that name");
        }
        self.file_config = config;
        self.apply(merged, clusters, link).await
    }

    /// One change on the `Assignments` stream, applied like a reloaded
    /// configuration. An assigned account whose kubeconfig cannot be used
    /// is refused with a log line (never quoting it); the others run on.
    async fn assignment(
        &mut self,
        change: crate::assignments::Change,
        clusters: &mut Vec<Cluster>,
        link: &mut Link,
    ) -> Result<()> {
        use crate::assignments::Change;
        let mut assigned = self.assigned.clone();
        match change {
            Change::Assigned(account) => {
                let account = *account;
                let name = account.name.clone();
                if self
                    .file_config
                    .kubernetes
                    .accounts
                    .iter()
                    .any(|a| a.name == name)
                {
                    warn!(account = %name, "assigned account refused: the configuration file defines an account of that name");
                    return Ok(());
                }
                if assigned.get(&name) == Some(&account) {
                    return Ok(());
                }
                let mut check = self.file_config.clone();
                check.kubernetes.accounts = vec![account.clone()];
                if let Err(e) = check.validate() {
                    warn!(account = %name, error = %e, "assigned account refused");
                    return Ok(());
                }
                if let Err(e) = Cluster::connect(&account, &self.metrics).await {
                    warn!(account = %name, error = %e, "assigned account refused: its kubeconfig cannot be used");
                    return Ok(());
                }
                info!(account = %name, "account assigned");
                assigned.insert(name, account);
            }
            Change::Withdrawn(name) => {
                if assigned.remove(&name).is_none() {
                    return Ok(());
                }
                info!(account = %name, "assigned account withdrawn");
            }
            Change::Synced(named) => {
                let before = assigned.len();
                assigned.retain(|name, _| named.contains(name));
                if assigned.len() == before {
                    return Ok(());
                }
                info!(
                    kept = assigned.len(),
                    "assigned accounts withdrawn while disconnected removed"
                );
            }
        }
        self.assigned = assigned;
        let (merged, _) = crate::assignments::merged(&self.file_config, &self.assigned);
        let mut merged = merged;
        merged.origin = "assignments".to_owned();
        self.apply(merged, clusters, Some(link)).await
    }

    /// Applies a reloaded configuration: accounts removed stop (their relayed
    /// requests in flight finish), accounts added start, accounts changed
    /// restart on the same connection (new streams first, as in a move);
    /// the others are not touched. Keys outside `kubernetes.accounts` take
    /// effect for streams and connections made afterwards. An account whose
    /// cluster cannot be loaded refuses the whole change. Fails only when the
    /// gateway connection fails.
    async fn apply(
        &mut self,
        config: Config,
        clusters: &mut Vec<Cluster>,
        link: Option<&mut Link>,
    ) -> Result<()> {
        let old: BTreeMap<&str, &AccountConfig> = self
            .config
            .kubernetes
            .accounts
            .iter()
            .map(|a| (a.name.as_str(), a))
            .collect();
        let new: BTreeMap<&str, &AccountConfig> = config
            .kubernetes
            .accounts
            .iter()
            .map(|a| (a.name.as_str(), a))
            .collect();
        let removed: Vec<String> = old
            .keys()
            .filter(|n| !new.contains_key(*n))
            .map(|n| (*n).to_owned())
            .collect();
        let started: Vec<&AccountConfig> = new
            .iter()
            .filter(|(n, a)| old.get(*n) != Some(*a))
            .map(|(_, a)| *a)
            .collect();
        let mut fresh = Vec::new();
        for account in &started {
            match Cluster::connect(account, &self.metrics).await {
                Ok(cluster) => fresh.push(cluster),
                Err(e) => {
                    warn!(file = %config.origin, account = %account.name, error = %e, "configuration change refused; the running configuration stays");
                    self.metrics.reload("refused");
                    return Ok(());
                }
            }
        }
        let names: Vec<String> = fresh.iter().map(|c| c.account.clone()).collect();
        info!(file = %config.origin, removed = ?removed, started = ?names, "configuration reloaded");
        self.metrics.reload("applied");
        let mut link = link;
        for name in &removed {
            if let Some(link) = link.as_deref_mut() {
                if let Some(h) = link.drains.remove(name) {
                    h.superseded.cancel();
                    h.drain.cancel();
                }
                link.refused.retain(|r| r != name);
                link.session.remove(name);
            }
            clusters.retain(|c| &c.account != name);
            if let Some((_, stop)) = self.leaders.remove(name) {
                stop.cancel();
            }
            self.outboxes.remove(name);
            self.account_budgets.remove(name);
            self.cache_slots.remove(name);
            self.state.remove(name);
        }
        let start = initial_seq();
        for cluster in &fresh {
            let name = &cluster.account;
            clusters.retain(|c| &c.account != name);
            clusters.push(cluster.clone());
            // A changed account keeps its window and sequence numbers.
            self.outboxes
                .entry(name.clone())
                .or_insert_with(|| Arc::new(Outbox::new(config.cache.unacked_window, start)));
            self.account_budgets
                .entry(name.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(config.tasks.budget_per_account)));
            self.cache_slots
                .entry(name.clone())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())));
        }
        self.config = config;
        let assigned = &self.assigned;
        self.state.configured(
            self.config
                .kubernetes
                .accounts
                .iter()
                .map(|a| (a, assigned.contains_key(&a.name))),
        );
        for cluster in &fresh {
            // A changed cluster gets a new elector (the old one releases).
            if let Some((_, stop)) = self.leaders.remove(&cluster.account) {
                stop.cancel();
            }
            self.start_elector(cluster);
        }
        let Some(link) = link else {
            return Ok(()); // the next connection starts them
        };
        if fresh.is_empty() {
            return Ok(());
        }
        let mut handoff = BTreeMap::new();
        for cluster in &fresh {
            let info = cluster.account_info().await;
            self.state
                .kubernetes_version(&info.name, &info.kubernetes_version);
            link.session.set_info(info);
            link.refused.retain(|r| r != &cluster.account);
            if let Some(h) = link.drains.remove(&cluster.account) {
                h.superseded.cancel();
                handoff.insert(cluster.account.clone(), h);
            }
        }
        let answer = link.session.hello(&names).await?;
        let refused = self.answer(link, clusters, &names, answer, &handoff);
        for name in &refused {
            if let Some(h) = handoff.get(name) {
                h.drain.cancel();
            }
        }
        link.refused.extend(refused);
        Ok(())
    }

    /// Starts competing for `cluster`'s Lease, when leader election is on.
    fn start_elector(&mut self, cluster: &Cluster) {
        let le = &self.config.leader_election;
        if !le.enabled {
            return;
        }
        let elector = crate::leader::LeaderElector::new(
            cluster.client.clone(),
            &cluster.account,
            &le.namespace,
            &self.identity,
            Duration::from_secs(le.lease_duration_seconds),
        );
        let (tx, rx) = tokio::sync::watch::channel(0);
        let stop = self.shutdown.child_token();
        self.electors.spawn(elector.run(tx, stop.clone()));
        self.leaders.insert(cluster.account.clone(), (rx, stop));
    }

    /// Dials a new connection, says `Hello`, and moves every account of
    /// `link` to it; returns the old link's drain, to run in the background.
    /// On failure the old link stays in place (and is retried by the caller).
    async fn try_move(
        &self,
        clusters: &[Cluster],
        link: &mut Link,
        grace: Duration,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let handoff = link.drains.clone();
        match self.open_link_with(clusters, &handoff, false).await {
            Ok(new) => {
                let old = std::mem::replace(link, new);
                self.metrics.moves.inc();
                info!("accounts moved to the new connection");
                Some(old.drain(grace))
            }
            Err(e) => {
                warn!(error = %e, "moving to a new connection failed; staying for now");
                None
            }
        }
    }

    /// A new connection with every account started on it. Its `Hello`
    /// refused for the identity's rate is asked again on it, after the
    /// reconnect backoff's delays: the connection is sound, and dialling
    /// anew would cost a handshake and meet the same bound.
    async fn open_link(&self, clusters: &[Cluster]) -> Result<Link> {
        self.open_link_with(clusters, &BTreeMap::new(), true).await
    }

    /// A new connection: dial, `Hello`, `Control`, and start each granted
    /// account; an account in `handoff` takes over from its stream on the
    /// old connection, which is told to drain once the new relay stream is
    /// open. `patient`: a `Hello` refused for the identity's rate is asked
    /// again on this connection (see [`Self::open_link`]); else it fails
    /// the attempt at once.
    async fn open_link_with(
        &self,
        clusters: &[Cluster],
        handoff: &BTreeMap<String, Handoff>,
        patient: bool,
    ) -> Result<Link> {
        // The certificate this attempt presents, read before dialling (the
        // file is read on every connect): one that expired, and so fails
        // every handshake, still shows its date.
        if let Some(cert) = &self.config.gateway.cert_file {
            match spinlink_tls::identity::leaf_not_after(cert) {
                Ok(not_after) => self.metrics.client_certificate(not_after),
                Err(e) => warn!(error = %e, "reading the client certificate's expiry"),
            }
        }
        let client = connect(&self.config.gateway).await?;
        self.metrics.reconnects.inc();
        let infos = futures::future::join_all(clusters.iter().map(Cluster::account_info)).await;
        for info in &infos {
            self.state
                .kubernetes_version(&info.name, &info.kubernetes_version);
        }
        let session = Arc::new(Session::new(client, self.config.agent_id.clone(), infos));
        let mut hello_backoff = Backoff::from_config(&self.config.reconnect);
        let answer = loop {
            match session.hello(&[]).await {
                Err(e) if patient && e.is_hello_rate_refusal() => {
                    let delay = hello_backoff.next_delay();
                    warn!(error = %e, ?delay, "Hello not answered for the identity's rate; asking again on this connection");
                    tokio::time::sleep(delay).await;
                }
                answer => break answer?,
            }
        };
        info!(gateway = %answer.gateway_id, granted = answer.granted.len(), refused = answer.refused.len(), "Hello answered");
        let control = open_control(&session).await;
        let assignments = open_assignments(&self.config, &session).await;
        self.state.connected();
        let mut link = Link {
            session,
            control,
            assignments,
            accounts: JoinSet::new(),
            drains: BTreeMap::new(),
            refused: Vec::new(),
        };
        let all: Vec<String> = clusters.iter().map(|c| c.account.clone()).collect();
        link.refused = self.answer(&mut link, clusters, &all, answer, handoff);
        // Accounts the new connection did not get leave the old one too.
        for (name, h) in handoff {
            if link.refused.contains(name) {
                h.drain.cancel();
            }
        }
        Ok(link)
    }

    /// Starts the streams of every granted account among `asked`; returns
    /// those refused (or not answered).
    fn answer(
        &self,
        link: &mut Link,
        clusters: &[Cluster],
        asked: &[String],
        answer: HelloResponse,
        handoff: &BTreeMap<String, Handoff>,
    ) -> Vec<String> {
        let mut refused = Vec::new();
        for name in asked {
            if let Some(refusal) = answer.refused.iter().find(|r| &r.account == name) {
                warn!(account = %name, reason = %refusal.reason, "gateway refused account");
                self.state
                    .account(name, AccountState::Refused(refusal.reason.clone()));
                refused.push(name.clone());
                continue;
            }
            let granted = answer.granted.iter().any(|g| &g.account == name);
            let cluster = clusters.iter().find(|c| &c.account == name);
            let (true, Some(cluster)) = (granted, cluster) else {
                warn!(account = %name, "gateway did not answer for account");
                self.state
                    .account(name, AccountState::Refused("not answered".into()));
                refused.push(name.clone());
                continue;
            };
            let (Some(outbox), Some(account_budget), Some(slot), Some(account_config)) = (
                self.outboxes.get(name),
                self.account_budgets.get(name),
                self.cache_slots.get(name),
                self.config
                    .kubernetes
                    .accounts
                    .iter()
                    .find(|a| &a.name == name),
            ) else {
                continue; // every configured account has all four
            };
            let cache_config = &self.config.cache;
            let settings = CacheSettings {
                heartbeat: Duration::from_secs(self.config.heartbeat_seconds),
                outbox: outbox.clone(),
                filter: KindFilter::of(account_config),
                page_size: cache_config.page_size,
                discovery_interval: Duration::from_secs(cache_config.discovery_interval_seconds),
                resume_wait: Duration::from_millis(cache_config.resume_wait_millis),
                total_budget: self.total_budget.clone(),
                account_budget: account_budget.clone(),
                metrics: self.metrics.clone(),
            };
            let drain = CancellationToken::new();
            let superseded = CancellationToken::new();
            link.drains.insert(
                name.clone(),
                Handoff {
                    drain: drain.clone(),
                    superseded: superseded.clone(),
                },
            );
            link.accounts.spawn(run_account(AccountRun {
                session: link.session.clone(),
                cluster: cluster.clone(),
                settings,
                state: self.state.clone(),
                cache_slot: slot.clone(),
                drain,
                handoff: handoff.get(name).cloned(),
                superseded,
                leader: self.leaders.get(name).map(|(rx, _)| rx.clone()),
            }));
        }
        refused
    }
}

/// One gateway connection and the account streams on it.
struct Link {
    session: Arc<Session>,
    /// The gateway's signals; `None` when it serves no `Control` or the
    /// stream ended.
    control: Option<tonic::Streaming<ControlEvent>>,
    /// Dynamic accounts; `None` when off, or until the stream is reopened.
    assignments: Option<crate::assignments::Stream>,
    accounts: JoinSet<Result<()>>,
    /// Per account: cancelled when the account moves to a new connection.
    drains: BTreeMap<String, Handoff>,
    /// Accounts refused (or not answered) on this connection.
    refused: Vec<String>,
}

impl Link {
    /// Lets this connection go once every account on it has moved and its
    /// relayed requests have finished, or after `grace` (the gateway closes
    /// the connection then anyway).
    fn drain(mut self, grace: Duration) -> impl std::future::Future<Output = ()> + Send + 'static {
        let grace = grace.max(MIN_DRAIN_GRACE);
        async move {
            let all_done = async {
                while let Some(done) = self.accounts.join_next().await {
                    if let Ok(Err(e)) = done {
                        debug!(error = %e, "stream on the old connection ended");
                    }
                }
            };
            if tokio::time::timeout(grace, all_done).await.is_err() {
                warn!(?grace, "old connection still busy at its deadline; cut");
            } else {
                info!("old connection drained");
            }
            // Dropping the link aborts what is left and closes the connection.
            drop(self.control.take());
            drop(self.assignments.take());
        }
    }
}

/// What an account's streams on a new connection take over from.
#[derive(Debug, Clone)]
struct Handoff {
    /// The account's drain signal on the old connection.
    drain: CancellationToken,
    /// Cancelled when the new streams are being set up: from then on the
    /// old streams' errors are no reason to drop their connection.
    superseded: CancellationToken,
}

/// The shortest time an old connection gets to finish its relayed requests.
pub const MIN_DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Opens `Control` on the session's connection; `None` (logged) when the
/// gateway does not serve it.
async fn open_control(session: &Session) -> Option<tonic::Streaming<ControlEvent>> {
    let request = ControlRequest {
        agent_id: session.agent_id().to_owned(),
    };
    match session.client().control(request).await {
        Ok(response) => Some(response.into_inner()),
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            debug!("gateway serves no Control stream");
            None
        }
        Err(status) => {
            warn!(error = %status, "Control stream not opened; reconnect signals will be missed");
            None
        }
    }
}

/// Opens `Assignments` on the session's connection when dynamic accounts are
/// on; `None` (logged) when that fails, to be retried.
async fn open_assignments(
    config: &Config,
    session: &Session,
) -> Option<crate::assignments::Stream> {
    let dynamic = &config.dynamic_accounts;
    if !dynamic.enabled {
        return None;
    }
    match crate::assignments::open(session, &dynamic.zone).await {
        Ok(stream) => {
            info!(zone = %dynamic.zone, "Assignments stream open");
            Some(stream)
        }
        Err(status) => {
            warn!(error = %status, "Assignments stream not opened; retrying");
            None
        }
    }
}

/// The next change on `assignments` (never, while there is no stream).
async fn next_assignment(
    assignments: &mut Option<crate::assignments::Stream>,
) -> std::result::Result<crate::assignments::Change, tonic::Status> {
    match assignments {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// The next `Reconnect` on `control`; `None` once the stream has ended (and
/// never, while there is no stream). Heartbeats on the way are recorded in
/// `metrics` ([`gateway_heartbeat`]).
async fn next_control(
    control: &mut Option<tonic::Streaming<ControlEvent>>,
    metrics: &Metrics,
) -> Option<Reconnect> {
    let Some(stream) = control else {
        return std::future::pending().await;
    };
    loop {
        match stream.message().await {
            Ok(Some(ControlEvent {
                event: Some(control_event::Event::Reconnect(r)),
            })) => return Some(r),
            Ok(Some(ControlEvent {
                event: Some(control_event::Event::Heartbeat(beat)),
            })) => {
                gateway_heartbeat(metrics, beat.unix_millis, unix_millis_now());
            }
            Ok(Some(_)) => {}
            Ok(None) => return None,
            Err(status) => {
                debug!(error = %status, "Control stream ended");
                return None;
            }
        }
    }
}

/// Clock offsets past this are worth a warning: tokens, certificates and
/// JWTs are all checked against clocks.
pub const CLOCK_OFFSET_WARNING: Duration = Duration::from_secs(30);

/// Records the gateway's clock (`gateway_millis`, from a `Control`
/// heartbeat) against this host's (`local_millis`) and warns when they are
/// far apart. Returns the offset in seconds (gateway minus local).
fn gateway_heartbeat(metrics: &Metrics, gateway_millis: i64, local_millis: i64) -> f64 {
    metrics.control_heartbeats.inc();
    if gateway_millis <= 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)] // milliseconds within years: exact in f64
    let offset = gateway_millis.saturating_sub(local_millis) as f64 / 1000.0;
    metrics.gateway_clock_offset.set(offset);
    if offset.abs() > CLOCK_OFFSET_WARNING.as_secs_f64() {
        warn!(
            offset_seconds = offset,
            "this host's clock and the gateway's differ; check time sync (NTP) on both"
        );
    }
    offset
}

fn unix_millis_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One account's streams on one connection.
struct AccountRun {
    session: Arc<Session>,
    cluster: Cluster,
    settings: CacheSettings,
    state: Publisher,
    /// Held by the account's one cache stream, so the streams on an old and a
    /// new connection never feed the sidecar at once.
    cache_slot: Arc<tokio::sync::Mutex<()>>,
    drain: CancellationToken,
    handoff: Option<Handoff>,
    superseded: CancellationToken,
    /// With leader election: this replica's term; the cache stream runs
    /// only while it is not 0.
    leader: Option<tokio::sync::watch::Receiver<u64>>,
}

/// Both streams of one account. Ends with the first to fail, or — once
/// drained because the account moved — when the relay stream has finished
/// its requests in flight.
async fn run_account(run: AccountRun) -> Result<()> {
    let AccountRun {
        session,
        cluster,
        settings,
        state,
        cache_slot,
        drain,
        handoff,
        superseded,
        mut leader,
    } = run;
    let name = cluster.account.clone();
    let synced_state = state.clone();
    let synced_name = name.clone();
    let metrics = settings.metrics.clone();
    let (opened_tx, mut opened_rx) = tokio::sync::watch::channel(false);
    let relay = relay::run(&session, &cluster, &metrics, drain.clone(), opened_tx);
    let cache = async {
        if let Some(handoff) = handoff {
            // The old connection steps back once the sidecar has this
            // connection's relay stream, so no request finds no stream.
            if opened_rx.wait_for(|open| *open).await.is_err() {
                return Ok(()); // the relay stream failed; its error ends us
            }
            handoff.drain.cancel();
        }
        let on_synced = move || synced_state.account(&synced_name, AccountState::Synced);
        loop {
            let term = match leader.as_mut() {
                None => 0,
                Some(rx) if *rx.borrow() > 0 => *rx.borrow(),
                Some(rx) => {
                    state.account(&name, AccountState::Standby);
                    tokio::select! {
                        term = rx.wait_for(|t| *t > 0) => match term {
                            Ok(term) => *term,
                            Err(_) => return Ok(()), // the account's elector stopped
                        },
                        () = drain.cancelled() => return Ok(()),
                    }
                }
            };
            if leader.is_some() {
                state.account(&name, AccountState::Streaming);
            }
            let _slot = tokio::select! {
                slot = cache_slot.lock() => slot,
                () = drain.cancelled() => return Ok(()),
            };
            if term > 0 && settings.outbox.start_term(term, initial_seq()) {
                info!(account = %name, term, "leader: caching from the sidecar's resourceVersions");
            }
            let lost = async {
                match leader.as_mut() {
                    Some(rx) => {
                        let _ = rx.wait_for(|t| *t != term).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = cache::run(&session, &cluster, settings.clone(), on_synced.clone()) => {
                    return r.map(|never| match never {});
                }
                () = drain.cancelled() => return Ok(()),
                () = lost => info!(account = %name, "leadership lost; cache stream closed"),
            }
        }
    };
    state.account(&name, AccountState::Streaming);
    tokio::pin!(relay, cache);
    let mut cache_done = false;
    loop {
        tokio::select! {
            r = &mut relay => {
                // Once the account has moved (or was removed), how its old
                // stream ends is no reason to drop the connection.
                return match r {
                    Err(e) if drain.is_cancelled() || superseded.is_cancelled() => {
                        debug!(account = %name, error = %e, "drained relay stream ended");
                        Ok(())
                    }
                    r => r,
                };
            }
            r = &mut cache, if !cache_done => {
                if let Err(e) = r {
                    if !superseded.is_cancelled() {
                        return Err(e);
                    }
                    debug!(account = %name, error = %e, "superseded cache stream ended");
                }
                cache_done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_record_the_gateways_clock_offset() {
        let metrics = Metrics::new();
        // The gateway is 2.5 s ahead.
        assert!((gateway_heartbeat(&metrics, 1_002_500, 1_000_000) - 2.5).abs() < 1e-9);
        assert!(
            metrics
                .encode()
                .contains("spinlink_agent_gateway_clock_offset_seconds 2.5"),
            "{}",
            metrics.encode()
        );
        // Behind by 90 s: recorded (and warned about).
        assert!((gateway_heartbeat(&metrics, 910_000, 1_000_000) + 90.0).abs() < 1e-9);
        assert!(
            metrics
                .encode()
                .contains("spinlink_agent_gateway_clock_offset_seconds -90.0")
        );
        // A heartbeat without a clock changes nothing.
        assert_eq!(gateway_heartbeat(&metrics, 0, 1_000_000), 0.0);
        assert!(
            metrics
                .encode()
                .contains("spinlink_agent_gateway_clock_offset_seconds -90.0")
        );
    }
}
