//! Leader election among an agent's replicas, one `coordination.k8s.io/v1`
//! Lease per account (`spinlink-agent-<account>` in
//! `leaderElection.namespace` of the account's cluster). The holder caches;
//! every replica relays. [`LeaderElector::run`] publishes this replica's
//! term through a `watch`: 0 while another replica holds the Lease, a new
//! number each time this one acquires it.
//!
//! As client-go does, expiry is judged by this replica's own clock: a Lease
//! whose `resourceVersion` has not changed for `leaseDurationSeconds` since
//! this replica first saw it is free, whatever the holder's clock wrote in
//! `renewTime`. Updates carry the `resourceVersion` read, so two replicas
//! racing for a free Lease cannot both win (the loser gets a 409). A leader
//! that cannot renew for two thirds of the duration stops caching before
//! anyone can take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The Lease name of an account.
pub fn lease_name(account: &str) -> String {
    format!("spinlink-agent-{account}")
}

/// This replica's default holder identity: `POD_NAME` or the host name, and a
/// random suffix (a restarted pod must not inherit its predecessor's lease
/// before it expires... nor be mistaken for it).
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "agent".to_owned());
    format!("{base}-{:08x}", rand::random::<u32>())
}

/// Competes for one account's Lease.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    account: String,
    name: String,
    identity: String,
    duration: Duration,
}

/// What this replica last saw of the Lease: its resourceVersion and when it
/// last changed, by this replica's clock.
#[derive(Debug, Default)]
struct Observed {
    version: Option<String>,
    since: Option<Instant>,
}

impl LeaderElector {
    /// An elector for `account` with the account's cluster client.
    pub fn new(
        client: kube::Client,
        account: &str,
        namespace: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            account: account.to_owned(),
            name: lease_name(account),
            identity: identity.to_owned(),
            duration,
        }
    }

    /// Tries to take or renew the Lease every third of its duration until
    /// `shutdown`, publishing the term on `leader`; on shutdown a held
    /// Lease is released so another replica takes over at once.
    pub async fn run(self, leader: watch::Sender<u64>, shutdown: CancellationToken) {
        let mut term = 0u64;
        let retry = (self.duration / 3).max(Duration::from_millis(100));
        let renew_deadline = self.duration * 2 / 3;
        let mut observed = Observed::default();
        let mut renewed: Option<Instant> = None;
        loop {
            match self.attempt(&mut observed).await {
                Ok(true) => {
                    renewed = Some(Instant::now());
                    if *leader.borrow() == 0 {
                        term += 1;
                        leader.send_replace(term);
                        info!(account = %self.account, identity = %self.identity, "Lease acquired; this replica caches");
                    }
                }
                Ok(false) => {
                    if leader.send_replace(0) != 0 {
                        info!(account = %self.account, "Lease held by another replica; caching stopped");
                    }
                    renewed = None;
                }
                Err(e) => {
                    warn!(account = %self.account, error = %e, "Lease not renewed");
                    if renewed.is_some_and(|at| at.elapsed() >= renew_deadline) {
                        leader.send_replace(0);
                        renewed = None;
                        warn!(account = %self.account, "Lease renewal deadline passed; caching stopped");
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(retry) => {}
                () = shutdown.cancelled() => break,
            }
        }
        if leader.send_replace(0) != 0 {
            self.release().await;
        }
    }

    /// One round: `Ok(true)` when this replica holds the Lease afterwards.
    async fn attempt(&self, observed: &mut Observed) -> kube::Result<bool> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let duration_secs = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let version = lease.metadata.resource_version.clone();
        if observed.version != version {
            observed.version = version;
            observed.since = Some(Instant::now());
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        if !mine && !holder.is_empty() {
            let held_for = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.duration, Duration::from_secs);
            let unchanged = observed.since.map_or(Duration::ZERO, |t| t.elapsed());
            if unchanged < held_for {
                return Ok(false);
            }
            debug!(account = %self.account, %holder, "Lease expired; taking over");
        }
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(duration_secs);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                observed.version = updated.metadata.resource_version;
                observed.since = Some(Instant::now());
                Ok(true)
            }
            // Someone else wrote first: theirs, for now.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up (holder cleared), so a waiting replica need not
    /// wait for it to expire.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(account = %self.account, "Lease released"),
            Err(e) => debug!(account = %self.account, error = %e, "Lease not released"),
        }
    }
}
