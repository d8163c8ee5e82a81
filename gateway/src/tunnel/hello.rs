//! `Hello` and `Control`, answered by the gateway. `Hello`: for each account
//! the agent offers, a channel token if the policy lets the agent's identity
//! serve it, else a refusal with the reason. `Control`: a server stream per
//! connection on which the listener sends `Reconnect` when it drains or the
//! connection reaches its maximum age. `Cache` and `Relay` never reach this
//! service (the router sends them to the proxy) and answer `Unimplemented`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spinlink_proto::v1::tunnel_server::Tunnel;
use spinlink_proto::v1::{
    AssignmentsDown, AssignmentsUp, CacheDown, CacheUp, ChannelGrant, ChannelRefusal, HelloRequest,
    HelloResponse, RelayDown, RelayUp,
};
use tonic::{Request, Response, Status, Streaming};

use tokio_stream::wrappers::ReceiverStream;

use super::{ControlSlot, Shared};
use crate::identity::AgentPeer;
use crate::identity::owners::Claimed;
use crate::stats::{Counter, Refusal};
use crate::token::Claims;

/// Most accounts one `Hello` may offer: a bound on the work one request makes.
pub const MAX_ACCOUNTS_PER_HELLO: usize = 10_000;
/// Events queued on a `Control` stream; the gateway sends one `Reconnect` per
/// connection, so a handful is plenty.
pub const CONTROL_QUEUE: usize = 4;

/// The `Tunnel` implementation that serves `Hello`.
#[derive(Debug)]
pub struct HelloService {
    shared: Arc<Shared>,
}

impl HelloService {
    /// A service over the gateway's shared state.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Answers `request` for `peer` at `now`.
    pub fn answer(
        &self,
        peer: &AgentPeer,
        request: &HelloRequest,
        now: SystemTime,
    ) -> Result<HelloResponse, Status> {
        let shared = &self.shared;
        if request.accounts.len() > MAX_ACCOUNTS_PER_HELLO {
            shared.stats.refuse(Refusal::HelloInvalid);
            return Err(Status::invalid_argument(format!(
                "at most {MAX_ACCOUNTS_PER_HELLO} accounts per Hello"
            )));
        }
        let identity = &*peer.identity;
        let mut response = HelloResponse {
            gateway_id: shared.gateway_id.clone(),
            now_unix: now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
            ..HelloResponse::default()
        };
        // A token granted on a bootstrap JWT outlives neither the token TTL
        // nor the JWT.
        let ttl = match &peer.bootstrap {
            Some(bootstrap) => {
                let now_secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let left = Duration::from_secs(bootstrap.expires_at.saturating_sub(now_secs));
                shared.token_ttl.min(left.max(Duration::from_secs(1)))
            }
            None => shared.token_ttl,
        };
        let mut seen = HashSet::new();
        let mut renewed = 0;
        for account in &request.accounts {
            let name = account.name.as_str();
            let refusal = if name.is_empty() {
                shared.stats.refuse(Refusal::HelloInvalid);
                Some("empty account name".to_owned())
            } else if !seen.insert(name) {
                shared.stats.refuse(Refusal::HelloInvalid);
                Some(format!("account {name} offered twice"))
            } else if !match &peer.bootstrap {
                // A bootstrap JWT's accounts claim grants instead of the policy.
                Some(bootstrap) => bootstrap.allows(name),
                None => shared.policy.allows(identity, name),
            } {
                shared.stats.refuse(Refusal::Policy);
                Some(format!("identity {identity} may not serve account {name}"))
            } else {
                match peer.grants.claim(&shared.owners, name, &peer.identity) {
                    Ok(claimed) => {
                        // Granted on this connection before: the agent
                        // renewing its token ahead of expiry.
                        renewed += u64::from(claimed == Claimed::Again);
                        None
                    }
                    Err(owner) => {
                        shared.stats.refuse(Refusal::AccountOwned);
                        tracing::warn!(
                            agent_id = %request.agent_id,
                            identity,
                            owner = &*owner,
                            account = name,
                            remote = %peer.remote,
                            "account refused: already served by another identity"
                        );
                        // The owner is named in the log, not to the other agent.
                        Some(format!(
                            "account {name} is already served by another identity on this gateway"
                        ))
                    }
                }
            };
            if let Some(reason) = refusal {
                tracing::warn!(
                    agent_id = %request.agent_id,
                    identity,
                    account = name,
                    reason = %reason,
                    "account refused"
                );
                response.refused.push(ChannelRefusal {
                    account: name.to_owned(),
                    reason,
                });
                continue;
            }
            let claims = Claims {
                binding: &peer.binding,
                identity,
                account: name,
            };
            let (token, expiry) = shared
                .tokens
                .issue(claims, now, ttl)
                .map_err(|e| Status::internal(e.to_string()))?;
            response.granted.push(ChannelGrant {
                account: name.to_owned(),
                token: token.into_string(),
                expires_at_unix: i64::try_from(expiry).unwrap_or(i64::MAX),
            });
        }
        shared
            .stats
            .add(Counter::AccountsGranted, response.granted.len() as u64);
        shared.stats.add(Counter::AccountsRenewed, renewed);
        shared
            .stats
            .add(Counter::AccountsRefused, response.refused.len() as u64);
        tracing::info!(
            agent_id = %request.agent_id,
            agent_version = %request.agent_version,
            identity,
            remote = %peer.remote,
            granted = response.granted.len(),
            renewed,
            refused = response.refused.len(),
            "hello"
        );
        Ok(response)
    }
}

/// Sends `Heartbeat{unix_millis}` (the gateway's clock) on a `Control`
/// stream every `every`, until the stream's sender is gone (the connection
/// ended, or a `Reconnect` was sent and the stream let go) or the agent
/// closed it. Holds only a weak sender, so it never keeps a stream open; a
/// full queue (an agent not reading) skips a beat rather than waits.
async fn heartbeats(weak: tokio::sync::mpsc::WeakSender<ControlItem>, every: Duration) {
    use tokio::sync::mpsc::error::TrySendError;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(tx) = weak.upgrade() else { return };
        if let Err(TrySendError::Closed(_)) = tx.try_send(Ok(heartbeat())) {
            return;
        }
    }
}

/// A `Heartbeat` carrying the gateway's clock now, as both transports'
/// `Control` streams send it.
pub(crate) fn heartbeat() -> spinlink_proto::v1::ControlEvent {
    use spinlink_proto::v1::{ControlEvent, Heartbeat, control_event};
    let unix_millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    ControlEvent {
        event: Some(control_event::Event::Heartbeat(Heartbeat {
            unix_millis,
            ..Default::default()
        })),
    }
}

/// What a `Control` stream carries.
type ControlItem = Result<spinlink_proto::v1::ControlEvent, Status>;

type Unserved<T> = futures::stream::Empty<Result<T, Status>>;

#[tonic::async_trait]
impl Tunnel for HelloService {
    type ControlStream = ReceiverStream<Result<spinlink_proto::v1::ControlEvent, Status>>;

    async fn control(
        &self,
        request: Request<spinlink_proto::v1::ControlRequest>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        let Some(slot) = request.extensions().get::<ControlSlot>().cloned() else {
            return Err(Status::unavailable("no connection to signal on"));
        };
        let (tx, rx) = tokio::sync::mpsc::channel(CONTROL_QUEUE);
        if let Some(every) = self.shared.limits.control_heartbeat {
            tokio::spawn(heartbeats(tx.downgrade(), every));
        }
        slot.set_control(tx);
        tracing::debug!(agent_id = %request.get_ref().agent_id, "control stream open");
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloResponse>, Status> {
        let Some(peer) = request.extensions().get::<AgentPeer>().cloned() else {
            // The router always attaches the peer; without one nobody was
            // authenticated.
            return Err(Status::unauthenticated("no agent identity"));
        };
        let answer = self.answer(&peer, request.get_ref(), SystemTime::now())?;
        // `Assignments` streams on this connection must name this agent id.
        if let Some(slot) = request.extensions().get::<ControlSlot>() {
            slot.set_hello_agent(&request.get_ref().agent_id);
        }
        Ok(Response::new(answer))
    }

    type AssignmentsStream = Unserved<AssignmentsDown>;

    async fn assignments(
        &self,
        _request: Request<Streaming<AssignmentsUp>>,
    ) -> Result<Response<Self::AssignmentsStream>, Status> {
        Err(Status::unimplemented("Assignments is carried to a sidecar"))
    }

    type CacheStream = Unserved<CacheDown>;

    async fn cache(
        &self,
        _request: Request<Streaming<CacheUp>>,
    ) -> Result<Response<Self::CacheStream>, Status> {
        Err(Status::unimplemented("Cache is carried to a sidecar"))
    }

    type RelayStream = Unserved<RelayDown>;

    async fn relay(
        &self,
        _request: Request<Streaming<RelayUp>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        Err(Status::unimplemented("Relay is carried to a sidecar"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use spinlink_proto::v1::AccountInfo;
    use spinlink_tls::binding::ConnectionBinding;

    use super::*;
    use crate::config::PolicyRule;
    use crate::identity::Policy;
    use crate::stats::Stats;
    use crate::token::TokenKey;

    fn service() -> HelloService {
        let policy = Policy::compile(&[PolicyRule {
            identities: vec!["spiffe://spinlink.dev/agent/*".into()],
            accounts: vec!["dev-*".into(), "staging".into()],
        }])
        .unwrap();
        HelloService::new(Arc::new(Shared {
            gateway_id: "gw-test".into(),
            policy,
            tokens: TokenKey::generate().unwrap(),
            token_ttl: Duration::from_secs(60),
            upstreams: Arc::default(),
            stats: Arc::new(Stats::default()),
            limits: crate::tunnel::TunnelLimits::default(),
            owners: Arc::default(),
            jwt: None,
        }))
    }

    fn account(name: &str) -> AccountInfo {
        AccountInfo {
            name: name.into(),
            ..AccountInfo::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn control_streams_get_heartbeats_until_their_sender_goes() {
        use spinlink_proto::v1::control_event;
        let (tx, mut rx) = tokio::sync::mpsc::channel(CONTROL_QUEUE);
        let task = tokio::spawn(heartbeats(tx.downgrade(), Duration::from_secs(30)));
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(rx.try_recv().is_err(), "a heartbeat before its interval");
        for _ in 0..2 {
            let event = rx.recv().await.unwrap().unwrap();
            match event.event {
                Some(control_event::Event::Heartbeat(h)) => assert!(h.unix_millis > 0),
                other => panic!("not a heartbeat: {other:?}"),
            }
        }
        // The stream let go (a `Reconnect` sent, or the connection ended):
        // the heartbeats stop and hold nothing open.
        drop(tx);
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("heartbeats outlived their stream")
            .unwrap();
        assert!(rx.recv().await.is_none());
    }

    #[test]
    fn grants_allowed_and_refuses_others_with_reason() {
        let svc = service();
        let peer = AgentPeer {
            identity: "spiffe://spinlink.dev/agent/a1".into(),
            binding: ConnectionBinding([1; 32]),
            remote: "127.0.0.1:1".parse().unwrap(),
            grants: Arc::default(),
            bootstrap: None,
            tokens: Arc::default(),
        };
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let req = HelloRequest {
            agent_id: "a1".into(),
            agent_version: "test".into(),
            accounts: vec![
                account("dev-1"),
                account("prod"),
                account("staging"),
                account(""),
                account("dev-1"),
            ],
        };
        let resp = svc.answer(&peer, &req, now).unwrap();
        assert_eq!(resp.gateway_id, "gw-test");
        // Expiry and the clock it is on travel together.
        assert_eq!(resp.now_unix, 1_000);
        let granted: Vec<_> = resp.granted.iter().map(|g| g.account.as_str()).collect();
        assert_eq!(granted, ["dev-1", "staging"]);
        assert!(resp.granted.iter().all(|g| g.expires_at_unix == 1_060));
        let refused: Vec<_> = resp.refused.iter().map(|r| r.account.as_str()).collect();
        assert_eq!(refused, ["prod", "", "dev-1"]);
        assert_eq!(
            resp.refused[0].reason,
            "identity spiffe://spinlink.dev/agent/a1 may not serve account prod"
        );
        let g = &resp.granted[0];
        let claims = Claims {
            binding: &peer.binding,
            identity: &peer.identity,
            account: "dev-1",
        };
        assert!(svc.shared.tokens.verify(&g.token, claims, now).is_ok());
        let stats = svc.shared.stats.snapshot();
        assert_eq!((stats.accounts_granted, stats.accounts_refused), (2, 3));
    }

    #[test]
    fn granting_again_on_the_same_connection_is_a_renewal() {
        let svc = service();
        let peer = |binding: u8| AgentPeer {
            identity: "spiffe://spinlink.dev/agent/a1".into(),
            binding: ConnectionBinding([binding; 32]),
            remote: "127.0.0.1:1".parse().unwrap(),
            grants: Arc::default(),
            bootstrap: None,
            tokens: Arc::default(),
        };
        let (conn, other_conn) = (peer(1), peer(2));
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let req = |names: &[&str]| HelloRequest {
            accounts: names.iter().map(|n| account(n)).collect(),
            ..HelloRequest::default()
        };
        let first = svc.answer(&conn, &req(&["dev-1"]), now).unwrap();
        let later = now + Duration::from_secs(30);
        let again = svc.answer(&conn, &req(&["dev-1", "dev-2"]), later).unwrap();
        assert_eq!(again.granted.len(), 2);
        assert_ne!(first.granted[0].token, again.granted[0].token);
        // A make-before-break connection's first grant is not a renewal.
        svc.answer(&other_conn, &req(&["dev-1"]), later).unwrap();
        let stats = svc.shared.stats.snapshot();
        assert_eq!((stats.accounts_granted, stats.accounts_renewed), (4, 1));
        let metrics = svc.shared.stats.metrics();
        assert_eq!(metrics.tokens_renewed.get(), 1);
        assert_eq!(metrics.tokens_issued.get(), 4);
    }

    #[test]
    fn bootstrap_grants_follow_the_jwt_claim_and_end_with_it() {
        let svc = service();
        let mut accounts = globset::GlobSetBuilder::new();
        accounts.add(globset::Glob::new("boot-*").unwrap());
        let peer = AgentPeer {
            identity: "cluster-7".into(),
            binding: ConnectionBinding([2; 32]),
            remote: "127.0.0.1:1".parse().unwrap(),
            grants: Arc::default(),
            bootstrap: Some(Arc::new(crate::identity::jwt::Bootstrap {
                identity: "cluster-7".into(),
                accounts: accounts.build().unwrap(),
                expires_at: 1_030,
            })),
            tokens: Arc::default(),
        };
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let req = HelloRequest {
            accounts: vec![account("boot-1"), account("dev-1")],
            ..HelloRequest::default()
        };
        let resp = svc.answer(&peer, &req, now).unwrap();
        let granted: Vec<_> = resp.granted.iter().map(|g| g.account.as_str()).collect();
        // The policy would grant dev-1 to a certificate; the JWT does not.
        assert_eq!(granted, ["boot-1"]);
        // 60 s TTL, but the JWT ends in 30.
        assert_eq!(resp.granted[0].expires_at_unix, 1_030);
    }
}
