//! `Hello` on one connection and the channel tokens it granted. Tokens are
//! only valid on the connection they were issued on, so a session lives and
//! dies with its connection.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{AccountInfo, ChannelGrant, HelloRequest, HelloResponse};
use tonic::transport::Channel;

use crate::{Error, Result};

/// A token expiring sooner than this is renewed (by a new `Hello` on the same
/// connection) before a stream is opened with it.
pub const TOKEN_RENEW_MARGIN: Duration = Duration::from_secs(30);

/// The agent's side of one gateway connection.
pub struct Session {
    client: TunnelClient<Channel>,
    agent_id: String,
    infos: BTreeMap<String, AccountInfo>,
    grants: Mutex<HashMap<String, ChannelGrant>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("Session")
            .field("agent_id", &self.agent_id)
            .field("accounts", &self.infos.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session on `client`'s connection, announcing `infos`.
    pub fn new(client: TunnelClient<Channel>, agent_id: String, infos: Vec<AccountInfo>) -> Self {
        Self {
            client,
            agent_id,
            infos: infos.into_iter().map(|i| (i.name.clone(), i)).collect(),
            grants: Mutex::default(),
        }
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
        let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        for grant in &response.granted {
            grants.insert(grant.account.clone(), grant.clone());
        }
        Ok(response)
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
            .map(|g| g.token.clone())
            .ok_or_else(|| Error::Refused {
                account: account.to_owned(),
                reason: "no token granted".into(),
            })
    }

    fn fresh_token(&self, account: &str) -> Option<String> {
        let grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        let grant = grants.get(account)?;
        expires_later_than(grant.expires_at_unix, unix_now(), TOKEN_RENEW_MARGIN)
            .then(|| grant.token.clone())
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// True when a token expiring at `expires_at_unix` (0: no expiry stated)
/// still has more than `margin` left at `now`.
fn expires_later_than(expires_at_unix: i64, now: i64, margin: Duration) -> bool {
    if expires_at_unix == 0 {
        return true;
    }
    let margin = i64::try_from(margin.as_secs()).unwrap_or(i64::MAX);
    expires_at_unix.saturating_sub(now) > margin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_margin() {
        let m = TOKEN_RENEW_MARGIN;
        assert!(expires_later_than(0, 1000, m));
        assert!(expires_later_than(1031, 1000, m));
        assert!(!expires_later_than(1030, 1000, m));
        assert!(!expires_later_than(1010, 1000, m));
        assert!(!expires_later_than(900, 1000, m));
    }
}
