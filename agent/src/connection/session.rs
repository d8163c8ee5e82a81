//! `Hello` on one connection and the channel tokens it granted. Tokens are
//! only valid on the connection they were issued on, so a session lives and
//! dies with its connection.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{AccountInfo, ChannelGrant, HelloRequest, HelloResponse};
use tonic::transport::Channel;

use crate::{Error, Result};

/// Tokens are renewed (by a new `Hello` on the same connection) this long
/// before they expire, or at two thirds of their lifetime when that is
/// shorter, so a stream is never opened with a token about to expire.
pub const TOKEN_RENEW_MARGIN: Duration = Duration::from_secs(30);
/// Renewals are at least this far apart, whatever the gateway's TTL.
pub const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(250);

/// A granted token and when to renew it.
#[derive(Clone)]
struct Grant {
    grant: ChannelGrant,
    /// `None`: the gateway stated no expiry.
    renew_at: Option<Instant>,
}

/// The agent's side of one gateway connection.
pub struct Session {
    client: TunnelClient<Channel>,
    agent_id: String,
    infos: Mutex<BTreeMap<String, AccountInfo>>,
    grants: Mutex<HashMap<String, Grant>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("Session")
            .field("agent_id", &self.agent_id)
            .field("accounts", &self.accounts())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session on `client`'s connection, announcing `infos`.
    pub fn new(client: TunnelClient<Channel>, agent_id: String, infos: Vec<AccountInfo>) -> Self {
        Self {
            client,
            agent_id,
            infos: Mutex::new(infos.into_iter().map(|i| (i.name.clone(), i)).collect()),
            grants: Mutex::default(),
        }
    }

    /// The accounts this session announces.
    pub fn accounts(&self) -> Vec<String> {
        let infos = self.infos.lock().unwrap_or_else(|p| p.into_inner());
        infos.keys().cloned().collect()
    }

    /// Announces `info` from the next `Hello` on (an account added or changed
    /// by a configuration reload).
    pub fn set_info(&self, info: AccountInfo) {
        let mut infos = self.infos.lock().unwrap_or_else(|p| p.into_inner());
        infos.insert(info.name.clone(), info);
    }

    /// Stops announcing `account` and forgets its token.
    pub fn remove(&self, account: &str) {
        self.infos
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(account);
        self.grants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(account);
    }

    /// A client on this session's connection.
    pub fn client(&self) -> TunnelClient<Channel> {
        self.client.clone()
    }

    /// The agent id.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// Says `Hello` for `accounts` (every known account when empty) and
    /// keeps the tokens granted.
    pub async fn hello(&self, accounts: &[String]) -> Result<HelloResponse> {
        let request = HelloRequest {
            agent_id: self.agent_id.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            accounts: self
                .infos
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .filter(|i| accounts.is_empty() || accounts.contains(&i.name))
                .cloned()
                .collect(),
        };
        let response = self
            .client
            .clone()
            .hello(request)
            .await
            .map_err(Error::Hello)?
            .into_inner();
        let now = Instant::now();
        // The grants' expiry is on the gateway's clock: a token's lifetime
        // is measured against it when the gateway states it, so an agent
        // whose clock lags still renews before the token expires.
        let unix = grant_clock(response.now_unix, unix_now());
        let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        for grant in &response.granted {
            let renew_at = renew_delay(grant.expires_at_unix, unix).map(|d| now + d);
            grants.insert(
                grant.account.clone(),
                Grant {
                    grant: grant.clone(),
                    renew_at,
                },
            );
        }
        Ok(response)
    }

    /// When the first granted token is due for renewal; `None` when no token
    /// expires.
    pub fn renew_at(&self) -> Option<Instant> {
        let grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        grants.values().filter_map(|g| g.renew_at).min()
    }

    /// Renews every granted token with one `Hello` on this connection.
    /// Streams already open keep running (the gateway checks a token once,
    /// when a stream opens); streams opened later use the new tokens.
    /// Returns how many were renewed.
    pub async fn renew(&self) -> Result<usize> {
        let accounts: Vec<String> = {
            let grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
            grants.keys().cloned().collect()
        };
        if accounts.is_empty() {
            return Ok(0);
        }
        let response = self.hello(&accounts).await?;
        if !response.refused.is_empty() {
            let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
            for refusal in &response.refused {
                // A refused account keeps no token: its next stream asks again.
                grants.remove(&refusal.account);
            }
        }
        Ok(response.granted.len())
    }

    /// The token to open a stream for `account` with, renewed first when it
    /// expires within [`TOKEN_RENEW_MARGIN`].
    pub async fn token(&self, account: &str) -> Result<String> {
        if let Some(token) = self.fresh_token(account) {
            return Ok(token);
        }
        let response = self.hello(&[account.to_owned()]).await?;
        if let Some(refusal) = response.refused.iter().find(|r| r.account == account) {
            return Err(Error::Refused {
                account: account.to_owned(),
                reason: refusal.reason.clone(),
            });
        }
        // Use the renewed token even if it is short-lived: better than looping.
        let grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        grants
            .get(account)
            .map(|g| g.grant.token.clone())
            .ok_or_else(|| Error::Refused {
                account: account.to_owned(),
                reason: "no token granted".into(),
            })
    }

    fn fresh_token(&self, account: &str) -> Option<String> {
        let grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        let grant = grants.get(account)?;
        grant
            .renew_at
            .is_none_or(|at| Instant::now() < at)
            .then(|| grant.grant.token.clone())
    }
}

/// How long after issue a token expiring at `expires_at_unix` (0: never) is
/// renewed, at `now`: [`TOKEN_RENEW_MARGIN`] before expiry, or after two
/// thirds of its lifetime when that comes first.
fn renew_delay(expires_at_unix: i64, now: i64) -> Option<Duration> {
    if expires_at_unix == 0 {
        return None;
    }
    let lifetime = u64::try_from(expires_at_unix.saturating_sub(now)).unwrap_or(0);
    let lifetime = Duration::from_secs(lifetime);
    let by_margin = lifetime.saturating_sub(TOKEN_RENEW_MARGIN);
    let by_share = lifetime * 2 / 3;
    Some(by_margin.max(by_share).max(MIN_RENEW_INTERVAL))
}

/// The clock grants are measured against: the gateway's, as its `Hello`
/// answer stated it (`stated`, 0 when it did not), else this host's
/// (`local`).
fn grant_clock(stated: i64, local: i64) -> i64 {
    if stated > 0 { stated } else { local }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_time() {
        let secs = Duration::from_secs;
        assert_eq!(renew_delay(0, 1000), None);
        // Long-lived: renewed the margin before expiry.
        assert_eq!(renew_delay(1600, 1000), Some(secs(570)));
        // Short-lived: after two thirds of its lifetime.
        assert_eq!(renew_delay(1060, 1000), Some(secs(40)));
        assert_eq!(renew_delay(1003, 1000), Some(secs(2)));
        // Already expired, or nearly: soon, but not in a loop.
        assert_eq!(renew_delay(1000, 1000), Some(MIN_RENEW_INTERVAL));
        assert_eq!(renew_delay(900, 1000), Some(MIN_RENEW_INTERVAL));
    }

    #[test]
    fn lifetimes_are_measured_on_the_gateways_clock() {
        let secs = Duration::from_secs;
        // A token the gateway issued at its 1000 for 600 s; this host's
        // clock lags two minutes. On the local clock the renewal would
        // come 90 s after the token expired.
        let (expires, gateway, local) = (1600, 1000, 880);
        assert_eq!(renew_delay(expires, local), Some(secs(690)));
        assert_eq!(
            renew_delay(expires, grant_clock(gateway, local)),
            Some(secs(570))
        );
        // A clock running ahead renews early, also fixed.
        assert_eq!(
            renew_delay(expires, grant_clock(gateway, 1300)),
            Some(secs(570))
        );
        // A gateway that does not state its clock: the local one.
        assert_eq!(grant_clock(0, local), local);
    }
}
