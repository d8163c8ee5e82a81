//! Which sidecar owns an account when several share one store. The owner is
//! the instance holding the account's lease in the store ([`crate::store`]):
//! it is claimed when an agent's cache stream opens here, renewed while the
//! account is online, and released as soon as the account is stale (its
//! streams here ended), removed, or the sidecar drains — so the instance its
//! agent reconnects to takes it over at once, not one lease later. A cache stream for an account another
//! instance holds is refused with a retryable status until that lease ends.
//!
//! A facade request for an account this instance does not serve is forwarded
//! once to the owner's peer port ([`crate::peer`]: mutual TLS, sidecar
//! identities only; [`Ownership::forward`]), marked with
//! [`FORWARDED_HEADER`]; a forwarded request that finds no owner here is
//! answered with a retryable 503, never forwarded again. Start with
//! [`Ownership`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header};
use http_body_util::BodyExt;
use spinlink_kube_api::Status;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accounts::{Accounts, Presence};
use crate::http::body::{self, Body, BoxError};
use crate::store::{Acquired, Store};

pub mod versions;

/// Marks a request one sidecar forwarded to another; its value names the
/// forwarding instance.
pub const FORWARDED_HEADER: &str = "spinlink-forwarded-by";
/// How long a looked-up owner is remembered before asking the store again.
pub const OWNER_CACHE: Duration = Duration::from_secs(1);

/// The sidecar an account was taken from ([`Ownership::previous_owner`]),
/// whose snapshot a new owner fetches ([`crate::handover`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousOwner {
    /// Its instance id.
    pub instance: String,
    /// Where it serves snapshots, if it registered that.
    pub url: Option<String>,
}

/// Another sidecar instance that owns an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its instance id.
    pub instance: String,
    /// Its peer port's base URL.
    pub url: String,
}

/// How long an instance that stopped saying it runs is still listed by
/// [`Ownership::instances`] (not ready): long enough to see that a replica
/// went away, short enough that replaced pods do not pile up.
pub const INSTANCE_LISTED: Duration = Duration::from_secs(3600);

/// A sidecar instance sharing this one's store, as
/// [`Ownership::instances`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its instance id.
    pub id: String,
    /// Where its peers reach it (empty when it serves no peer port).
    pub url: String,
    /// When it last said it runs, Unix milliseconds.
    pub last_seen: i64,
    /// It said so within one lease (this instance always is).
    pub ready: bool,
}

/// Why a claim failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another instance holds the lease.
    #[error("account {account:?} is owned by sidecar {owner:?} for up to {seconds}s more")]
    HeldBy {
        /// The account.
        account: String,
        /// The holder.
        owner: String,
        /// Seconds until its lease expires unless renewed.
        seconds: i64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// What [`Ownership::deregistration`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deregistration {
    /// This instance holds the lease of the given epoch: delete, then
    /// [`Ownership::unfence`].
    Fenced(i64),
    /// Another instance serves the account: its definition stays.
    Elsewhere,
    /// Another instance held it last and its grace period runs until then.
    NotBefore(Instant),
}

/// This instance's view of account ownership.
#[derive(Debug)]
pub struct Ownership {
    store: Store,
    instance: String,
    /// Where the other sidecars reach this one's peer port, if it serves
    /// one.
    peer_url: Option<String>,
    lease: Duration,
    grace: Duration,
    owners: Mutex<HashMap<String, (Instant, Option<Owner>)>>,
    client: crate::peer_client::Client,
}

impl Ownership {
    /// Ownership for `instance`, whose peer port the others reach at
    /// `peer_url` (none: it serves none, and nothing is forwarded to it);
    /// requests are forwarded with `client`. An account offline for less
    /// than `grace` is expected back ([`Ownership::recently_served`]).
    pub fn new(
        store: Store,
        instance: &str,
        peer_url: Option<&str>,
        client: crate::peer_client::Client,
        lease: Duration,
        grace: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            instance: instance.to_owned(),
            peer_url: peer_url.map(|u| u.trim_end_matches('/').to_owned()),
            lease,
            grace,
            owners: Mutex::default(),
            client,
        })
    }

    /// This instance's id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The sidecar instances sharing the store, this one among them, seen
    /// within [`INSTANCE_LISTED`], by id. Each says it runs with every
    /// lease renewal ([`Ownership::run`]), so one that has not for a lease
    /// is not ready: stopped, or cut off from the store.
    pub async fn instances(&self) -> Result<Vec<Instance>, crate::store::Error> {
        let now = chrono::Utc::now().timestamp_millis();
        let listed = i64::try_from(INSTANCE_LISTED.as_millis()).unwrap_or(i64::MAX);
        let lease = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        let rows = self.store.instances(now.saturating_sub(listed)).await?;
        Ok(rows
            .into_iter()
            .map(|row| Instance {
                ready: row.id == self.instance || now.saturating_sub(row.last_seen) <= lease,
                id: row.id,
                url: row.url,
                last_seen: row.last_seen,
            })
            .collect())
    }

    /// The other instance that held `account`'s lease last (expired,
    /// released or not), with where it serves snapshots: whom a new owner
    /// takes the account over from. Read before claiming, which replaces it.
    pub async fn previous_owner(&self, account: &str) -> Option<PreviousOwner> {
        let lease = match self.store.lease(account).await {
            Ok(lease) => lease?,
            Err(e) => {
                tracing::warn!(%account, error = %e, "reading the previous owner failed");
                return None;
            }
        };
        if lease.owner == self.instance {
            return None;
        }
        let url = match self.store.instance_peer_url(&lease.owner).await {
            Ok(url) => url,
            Err(e) => {
                tracing::warn!(%account, error = %e, "reading the previous owner's address failed");
                None
            }
        };
        Some(PreviousOwner {
            instance: lease.owner,
            url,
        })
    }

    /// Takes or renews the lease on `account`.
    pub async fn claim(&self, account: &str) -> Result<(), ClaimError> {
        match self
            .store
            .acquire_lease(account, &self.instance, self.lease)
            .await?
        {
            Acquired::Owned(_) => {
                self.forget(account);
                Ok(())
            }
            Acquired::HeldBy(lease) => Err(ClaimError::HeldBy {
                account: account.to_owned(),
                owner: lease.owner,
                seconds: (lease.expires_at - chrono::Utc::now().timestamp_millis()).max(0) / 1000,
            }),
        }
    }

    /// Whether this instance holds an unexpired lease on `account`: only
    /// then does it write the account's definition to Clouddriver
    /// ([`crate::clouddriver`]).
    pub async fn holds(&self, account: &str) -> Result<bool, crate::store::Error> {
        let now = chrono::Utc::now().timestamp_millis();
        Ok(self
            .store
            .lease(account)
            .await?
            .is_some_and(|l| l.owner == self.instance && l.expires_at > now))
    }

    /// Whether this instance may delete `account`'s definition from
    /// Clouddriver now that its grace period here ended. The last instance
    /// to hold the account owns its registration: while another holds it,
    /// or held it last and its own grace period still runs, the answer is
    /// no — [`Deregistration::Elsewhere`] or [`Deregistration::NotBefore`]
    /// (then ask again: if that instance died, this one deletes for it).
    /// Otherwise the lease is taken ([`Deregistration::Fenced`]) so that no
    /// instance takes the account while its definition goes; give it back
    /// with [`Ownership::unfence`].
    pub async fn deregistration(
        &self,
        account: &str,
    ) -> Result<Deregistration, crate::store::Error> {
        let now = chrono::Utc::now().timestamp_millis();
        if let Some(lease) = self.store.lease(account).await?
            && lease.owner != self.instance
        {
            if lease.expires_at > now {
                return Ok(Deregistration::Elsewhere);
            }
            // Released (expiry 0) or expired: its holder's grace period
            // runs from when it last served the account.
            let last_seen = self
                .store
                .account(account)
                .await?
                .map_or(0, |row| row.last_seen);
            let ends = last_seen
                .max(lease.expires_at)
                .saturating_add(i64::try_from(self.grace.as_millis()).unwrap_or(i64::MAX));
            if ends > now {
                let wait = Duration::from_millis(u64::try_from(ends - now).unwrap_or(0));
                return Ok(Deregistration::NotBefore(Instant::now() + wait));
            }
        }
        match self
            .store
            .acquire_lease(account, &self.instance, self.lease)
            .await?
        {
            Acquired::Owned(lease) => Ok(Deregistration::Fenced(lease.epoch)),
            Acquired::HeldBy(_) => Ok(Deregistration::Elsewhere),
        }
    }

    /// Gives back the lease [`Ownership::deregistration`] took.
    pub async fn unfence(&self, account: &str, epoch: i64) {
        if let Err(e) = self
            .store
            .release_lease(account, &self.instance, epoch)
            .await
        {
            tracing::warn!(%account, error = %e, "releasing the lease failed");
        }
        self.forget(account);
    }

    /// Releases this instance's lease on `account`, if it holds it.
    pub async fn release(&self, account: &str) {
        match self.store.lease(account).await {
            // Released already (expiry 0): nothing to write.
            Ok(Some(lease)) if lease.owner == self.instance && lease.expires_at > 0 => {
                if let Err(e) = self
                    .store
                    .release_lease(account, &self.instance, lease.epoch)
                    .await
                {
                    tracing::warn!(%account, error = %e, "releasing the lease failed");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(%account, error = %e, "reading the lease failed"),
        }
        self.forget(account);
    }

    fn forget(&self, account: &str) {
        self.owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(account);
    }

    /// The other instance that owns `account` now (an unexpired lease), if
    /// any; remembered for [`OWNER_CACHE`].
    pub async fn owner(&self, account: &str) -> Option<Owner> {
        if let Some((at, owner)) = self
            .owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(account)
            && at.elapsed() < OWNER_CACHE
        {
            return owner.clone();
        }
        let owner = self.look_up(account).await;
        self.owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(account.to_owned(), (Instant::now(), owner.clone()));
        owner
    }

    async fn look_up(&self, account: &str) -> Option<Owner> {
        let lease = match self.store.lease(account).await {
            Ok(lease) => lease?,
            Err(e) => {
                tracing::warn!(%account, error = %e, "looking up the owner failed");
                return None;
            }
        };
        if lease.owner == self.instance || lease.expires_at <= chrono::Utc::now().timestamp_millis()
        {
            return None;
        }
        match self.store.instance_peer_url(&lease.owner).await {
            Ok(Some(url)) => Some(Owner {
                instance: lease.owner,
                url,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(%account, error = %e, "looking up the owner's address failed");
                None
            }
        }
    }

    /// Whether some sidecar of this store serves `account` or did within the
    /// grace period: it is between owners (one drained or died and its agent
    /// is reconnecting elsewhere), not unknown.
    pub async fn recently_served(&self, account: &str) -> bool {
        match self.store.account(account).await {
            Ok(Some(row)) => {
                let age = chrono::Utc::now().timestamp_millis() - row.last_seen;
                row.state == "online" || u128::try_from(age).unwrap_or(0) < self.grace.as_millis()
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(%account, error = %e, "reading the account failed");
                false
            }
        }
    }

    /// Records where this instance's peer port answers, so others can
    /// forward to it and fetch snapshots from it; returns whether the store
    /// took it. Called before the sidecar serves, and again by
    /// [`Ownership::run`] until it succeeds. The `facade_url` column, where
    /// sidecars before the peer port forwarded to, gets the same URL: such a
    /// sidecar, mid-upgrade, then fails to reach this one (a retryable 503)
    /// rather than reach a loopback address — itself.
    pub async fn register(&self) -> bool {
        let url = self.peer_url.as_deref().unwrap_or("");
        if let Err(e) = self.store.register_instance(&self.instance, url).await {
            tracing::warn!(error = %e, "registering this instance failed");
            return false;
        }
        match self.store.set_instance_peer_url(&self.instance, url).await {
            Ok(registered) => registered,
            Err(e) => {
                tracing::warn!(error = %e, "registering this instance's snapshot address failed");
                false
            }
        }
    }

    /// Keeps the leases of this instance's accounts until `shutdown`, then
    /// releases them so another instance can take over at once. With each
    /// renewal `recorder` records the accounts' resourceVersions, and once
    /// more before a lease is released ([`versions`]). `registered` says
    /// whether [`Ownership::register`] already succeeded.
    pub async fn run(
        self: Arc<Self>,
        accounts: Accounts,
        mut recorder: versions::Recorder,
        mut registered: bool,
        shutdown: CancellationToken,
    ) {
        let every = (self.lease / 3).max(Duration::from_millis(100));
        // Wakes the loop when an account's streams open or close, so a
        // stale account's lease is released at once, not at the next renewal.
        let mut changes = accounts.subscribe();
        // Stale accounts already released (until they are online again),
        // and whether their last position made it to the store.
        let mut released: HashMap<String, bool> = HashMap::new();
        let mut renew_at = Instant::now();
        loop {
            if !registered {
                registered = self.register().await;
            }
            let renew = Instant::now() >= renew_at;
            for account in accounts.all() {
                match account.presence() {
                    Presence::Removed if renew => {
                        self.release(account.name()).await;
                        // Removed: the name is free for another cluster.
                        if let Err(e) = self.store.clear_fingerprint(account.name()).await {
                            tracing::warn!(account = account.name(), error = %e, "clearing the cluster fingerprint failed");
                        }
                        recorder.forget(&account).await;
                    }
                    Presence::Removed => {}
                    // The agent's streams here ended: wherever it reconnects
                    // takes the account over at once (warm, from this cache,
                    // see `crate::handover`). Until someone does, this
                    // instance serves its cached reads; a reconnect here
                    // claims it again.
                    Presence::Stale => match released.get(account.name()) {
                        None => {
                            // Where its cache stands goes to the store
                            // before anyone else may take the account.
                            let recorded = recorder.record(&account).await;
                            self.release(account.name()).await;
                            released.insert(account.name().to_owned(), recorded);
                        }
                        // The store was out of reach: again with each
                        // renewal (the lease fences it once another
                        // instance has taken the account).
                        Some(false) if renew => {
                            if recorder.record(&account).await {
                                released.insert(account.name().to_owned(), true);
                            }
                        }
                        Some(_) => {}
                    },
                    Presence::Online => {
                        released.remove(account.name());
                        if !renew {
                            continue;
                        }
                        match self.claim(account.name()).await {
                            Ok(()) => {
                                recorder.record(&account).await;
                            }
                            Err(ClaimError::HeldBy { owner, .. }) => {
                                // Another instance took it (our lease lapsed): let
                                // the agent reconnect to wherever it belongs.
                                tracing::warn!(
                                    account = account.name(), %owner,
                                    "account owned by another sidecar; ending its streams here"
                                );
                                account.disconnect();
                            }
                            Err(e) => {
                                tracing::warn!(account = account.name(), error = %e, "renewing the lease failed");
                            }
                        }
                    }
                }
            }
            if renew {
                renew_at = Instant::now() + every;
                // Says this instance runs, for `instances` (its readiness).
                if registered && let Err(e) = self.store.touch_instance(&self.instance).await {
                    tracing::warn!(error = %e, "recording that this instance runs failed");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep_until(renew_at) => {}
                changed = changes.changed() => {
                    if changed.is_err() {
                        // No more changes will come: renewals only.
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = tokio::time::sleep_until(renew_at) => {}
                        }
                    }
                }
            }
        }
        for account in accounts.all() {
            if account.presence() != Presence::Removed {
                recorder.record(&account).await;
            }
            self.release(account.name()).await;
        }
    }

    /// Forwards `req` (for the account at `path`, the full facade path) to
    /// `owner`'s peer port and streams its answer back.
    pub async fn forward<B>(&self, owner: &Owner, req: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display + Send,
    {
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let Ok(uri) = format!("{}{path_and_query}", owner.url).parse::<Uri>() else {
            return body::status(&Status::unavailable(format!(
                "sidecar {} has an unusable peer URL",
                owner.instance
            )));
        };
        parts.uri = uri;
        parts.headers.remove(header::HOST);
        parts.headers.remove(header::CONNECTION);
        if let Ok(v) = HeaderValue::from_str(&self.instance) {
            parts.headers.insert(FORWARDED_HEADER, v);
        }
        let body: crate::peer_client::PeerBody = body
            .map_err(|e| -> BoxError { e.to_string().into() })
            .boxed_unsync();
        match self.client.request(Request::from_parts(parts, body)).await {
            Ok(resp) => resp.map(|b| b.map_err(|e| -> BoxError { Box::new(e) }).boxed()),
            Err(e) => {
                tracing::warn!(owner = %owner.instance, error = %e, "forwarding to the owner failed");
                retryable(format!(
                    "the sidecar that owns this account ({}) did not answer; retry",
                    owner.instance
                ))
            }
        }
    }
}

/// A 503 Status with `Retry-After: 1` (and `details.retryAfterSeconds`, as
/// the API server writes both): kubectl and client-go retry it.
pub fn retryable(message: String) -> Response<Body> {
    let mut resp = body::status(&Status::unavailable(message).retry_after(1));
    mark_retryable(&mut resp);
    resp
}

/// Tells the client to send the request again in a second: client-go (and
/// so kubectl) sends any request again, its body rewound, on a 429 or 5xx
/// with `Retry-After` (`checkWait` in client-go's `rest/with_retry.go`).
pub fn mark_retryable(resp: &mut Response<Body>) {
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_previous_owner_is_whoever_held_the_lease_last() {
        let store = Store::open("sqlite::memory:").await.unwrap();
        let own = |id: &str| {
            let url = (id == "s1").then_some("https://s1:7011/");
            Ownership::new(
                store.clone(),
                id,
                url,
                crate::peer_client::Client::default(),
                Duration::from_secs(crate::config::DEFAULT_LEASE_SECS),
                Duration::from_secs(600),
            )
        };
        let (s1, s2) = (own("s1"), own("s2"));
        assert!(s1.register().await);
        // s2 serves no peer port (a store no other sidecar shares).
        assert!(s2.register().await);
        assert_eq!(s2.previous_owner("prod").await, None, "never owned");
        s1.claim("prod").await.unwrap();
        let from_s1 = Some(PreviousOwner {
            instance: "s1".into(),
            url: Some("https://s1:7011".into()),
        });
        assert_eq!(s2.previous_owner("prod").await, from_s1);
        assert_eq!(s1.previous_owner("prod").await, None, "itself");
        // A drain releases the lease but the record of who held it stays.
        s1.release("prod").await;
        assert_eq!(s2.previous_owner("prod").await, from_s1);
        s2.claim("prod").await.unwrap();
        assert_eq!(
            s1.previous_owner("prod").await,
            Some(PreviousOwner {
                instance: "s2".into(),
                url: None
            })
        );
    }
}
