//! The account lifecycle loop: an account that comes online is registered
//! with Clouddriver; one whose agent went away stays registered and is served
//! stale from its cache for the grace period, then it is removed (cache
//! dropped) and deregistered. Start with [`Lifecycle::run`].
//!
//! The loop is level-triggered: it wakes on any presence change (a
//! `tokio::sync::watch`, so bursts of changes coalesce) or when the earliest
//! grace period ends, and then looks at every account.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accounts::{Accounts, Presence};
use crate::clouddriver::Registrar;

/// Ends grace periods and drives registration.
#[derive(Debug)]
pub struct Lifecycle {
    accounts: Accounts,
    grace: Duration,
    registrar: Option<Registrar>,
}

impl Lifecycle {
    /// A loop over `accounts` removing those offline for longer than
    /// `grace`; `registrar` registers them with Clouddriver when configured.
    pub fn new(accounts: Accounts, grace: Duration, registrar: Option<Registrar>) -> Self {
        Self {
            accounts,
            grace,
            registrar,
        }
    }

    /// One pass over every account; returns when the next grace period ends.
    fn reconcile(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for account in self.accounts.all() {
            match account.presence() {
                Presence::Online => {
                    if let Some(r) = &self.registrar {
                        r.want(&account, true);
                    }
                }
                Presence::Removed => {
                    if let Some(r) = &self.registrar {
                        r.want(&account, false);
                    }
                }
                Presence::Stale => {
                    let Some(since) = account.offline_since() else {
                        continue;
                    };
                    // A deleted dynamic account gets no grace period.
                    let end = if account.withdrawn() {
                        since
                    } else {
                        since + self.grace
                    };
                    if end <= now {
                        if account.remove_if_offline() {
                            tracing::info!(
                                account = account.name(),
                                grace_seconds = self.grace.as_secs(),
                                "account offline past its grace period; removed"
                            );
                            if let Some(r) = &self.registrar {
                                r.want(&account, false);
                            }
                        }
                    } else {
                        next = Some(next.map_or(end, |n| n.min(end)));
                    }
                }
            }
        }
        next
    }

    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut changes = self.accounts.subscribe();
        loop {
            changes.borrow_and_update();
            let next = self.reconcile();
            let grace_end = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                r = changes.changed() => if r.is_err() { break },
                () = grace_end => {}
            }
        }
        if let Some(r) = self.registrar {
            r.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn withdrawn_accounts_are_removed_as_soon_as_they_are_offline() {
        let accounts = Accounts::new();
        let a = accounts.get_or_create("a");
        a.cache_opened("id");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            Lifecycle::new(accounts.clone(), Duration::from_secs(600), None).run(shutdown.clone()),
        );
        a.withdraw();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(a.presence(), Presence::Online, "online accounts stay");
        a.cache_closed();
        let deadline = Instant::now() + Duration::from_secs(5);
        while a.presence() != Presence::Removed {
            assert!(Instant::now() < deadline, "never removed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn stale_accounts_are_removed_after_the_grace_period_only() {
        let accounts = Accounts::new();
        let a = accounts.get_or_create("a");
        a.cache_opened("id");
        let b = accounts.get_or_create("b");
        b.cache_opened("id");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            Lifecycle::new(accounts.clone(), Duration::from_secs(600), None).run(shutdown.clone()),
        );
        a.cache_closed();
        // Paused time: advance just short of the grace period.
        tokio::time::sleep(Duration::from_secs(599)).await;
        assert_eq!(a.presence(), Presence::Stale);
        assert_eq!(b.presence(), Presence::Online);
        let deadline = Instant::now() + Duration::from_secs(5);
        while a.presence() != Presence::Removed {
            assert!(Instant::now() < deadline, "never removed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(b.presence(), Presence::Online);
        shutdown.cancel();
        task.await.unwrap();
    }
}
