//! The agent's main loop: connect, `Hello`, run every granted account's
//! streams, and when anything breaks tear it all down and start again after
//! a jittered backoff.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use spinlink_proto::v1::HelloResponse;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::cache::outbox::{Outbox, initial_seq};
use crate::cache::{self, CacheSettings};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::connection::{connect, session::Session};
use crate::kinds::KindFilter;
use crate::metrics::Metrics;
use crate::relay;
use crate::state::{AccountState, AgentState, Publisher};
use crate::{Error, Result};

/// A connection that stayed up this long resets the reconnect backoff.
pub const STABLE_CONNECTION: Duration = Duration::from_secs(30);

/// The agent: configuration, per-account unacked windows, list budgets,
/// metrics and published state. Build with [`Agent::new`], run with
/// [`Agent::run`].
#[derive(Debug)]
pub struct Agent {
    config: Config,
    state: Publisher,
    /// Per account; outlives connections so the window is replayed.
    outboxes: BTreeMap<String, Arc<Outbox>>,
    /// Per account list budget (`tasks.budgetPerAccount`).
    account_budgets: BTreeMap<String, Arc<Semaphore>>,
    /// Agent-wide list budget (`tasks.totalBudget`).
    total_budget: Arc<Semaphore>,
    metrics: Metrics,
    /// Bound in `new` so the address is known before `run`.
    admin: Option<std::net::TcpListener>,
}

impl Agent {
    /// Checks the configuration and prepares the agent; nothing is dialled yet.
    pub fn new(config: Config) -> Result<Agent> {
        config.validate()?;
        let start = initial_seq();
        let names = || config.kubernetes.accounts.iter().map(|a| a.name.clone());
        let outboxes = names()
            .map(|n| (n, Arc::new(Outbox::new(config.cache.unacked_window, start))))
            .collect();
        let account_budgets = names()
            .map(|n| (n, Arc::new(Semaphore::new(config.tasks.budget_per_account))))
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
        Ok(Agent {
            admin,
            total_budget: Arc::new(Semaphore::new(config.tasks.total_budget)),
            config,
            state: Publisher::new(),
            outboxes,
            account_budgets,
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
        let mut clusters = Vec::new();
        for account in &self.config.kubernetes.accounts {
            clusters.push(Cluster::connect(account).await?);
        }
        let mut backoff = Backoff::from_config(&self.config.reconnect);
        loop {
            let started = tokio::time::Instant::now();
            let outcome = tokio::select! {
                outcome = self.session(&clusters) => outcome,
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
                () = shutdown.cancelled() => break,
            }
        }
        // Dropping the session above closed every stream and the connection.
        self.state.disconnected();
        info!("agent stopped");
        Ok(())
    }

    /// One connection's life: it only ends with the error that ended it.
    async fn session(&self, clusters: &[Cluster]) -> Result<Infallible> {
        let client = connect(&self.config.gateway).await?;
        self.metrics.reconnects.inc();
        let infos = futures::future::join_all(clusters.iter().map(Cluster::account_info)).await;
        let session = Arc::new(Session::new(client, self.config.agent_id.clone(), infos));
        let answer = session.hello(&[]).await?;
        info!(gateway = %answer.gateway_id, granted = answer.granted.len(), refused = answer.refused.len(), "Hello answered");
        self.state.connected();

        let mut accounts: JoinSet<Result<Infallible>> = JoinSet::new();
        let all: Vec<String> = clusters.iter().map(|c| c.account.clone()).collect();
        let mut refused = self.answer(&session, clusters, &all, answer, &mut accounts);
        let mut hello_backoff = Backoff::from_config(&self.config.reconnect);
        loop {
            let retry = async {
                if refused.is_empty() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(hello_backoff.next_delay()).await;
            };
            tokio::select! {
                Some(done) = accounts.join_next() => match done {
                    Ok(Err(e)) => return Err(e),
                    Err(join) => return Err(Error::Task(join.to_string())),
                },
                () = retry => {
                    let answer = session.hello(&refused).await?;
                    let asked = std::mem::take(&mut refused);
                    refused = self.answer(&session, clusters, &asked, answer, &mut accounts);
                    if refused.is_empty() {
                        hello_backoff.reset();
                    }
                }
            }
        }
    }

    /// Starts the streams of every granted account among `asked`; returns
    /// those refused (or not answered).
    fn answer(
        &self,
        session: &Arc<Session>,
        clusters: &[Cluster],
        asked: &[String],
        answer: HelloResponse,
        accounts: &mut JoinSet<Result<Infallible>>,
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
            let (Some(outbox), Some(account_budget), Some(account_config)) = (
                self.outboxes.get(name),
                self.account_budgets.get(name),
                self.config
                    .kubernetes
                    .accounts
                    .iter()
                    .find(|a| &a.name == name),
            ) else {
                continue; // every configured account has all three
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
            accounts.spawn(run_account(
                session.clone(),
                cluster.clone(),
                settings,
                self.state.clone(),
            ));
        }
        refused
    }
}

/// Both streams of one account; ends with the first to fail.
async fn run_account(
    session: Arc<Session>,
    cluster: Cluster,
    settings: CacheSettings,
    state: Publisher,
) -> Result<Infallible> {
    let name = cluster.account.clone();
    let synced_state = state.clone();
    let synced_name = name.clone();
    let metrics = settings.metrics.clone();
    let cache = cache::run(&session, &cluster, settings, move || {
        synced_state.account(&synced_name, AccountState::Synced);
    });
    let relay = relay::run(&session, &cluster, &metrics);
    state.account(&name, AccountState::Streaming);
    tokio::select! {
        r = cache => r,
        r = relay => r,
    }
}
