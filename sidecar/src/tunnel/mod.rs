//! The tunnel: the gRPC server the gateways carry agent streams to. It accepts
//! TCP connections, terminates mTLS (a client certificate of one of the
//! configured gateways is required, [`gateways`]) or, in insecure mode,
//! plaintext HTTP/2, and serves the
//! `spinlink.v1.Tunnel` service: `Cache` streams go to [`cache`], `Relay`
//! streams to [`relay`], `Assignments` streams to [`assignments`]; `Hello`
//! belongs to the gateway.
//!
//! Every stream names its account and agent in the `spinlink-verified-*`
//! headers the gateway sets, believed only on a gateway's connection; the
//! first message must be `open` for the same account. An account's streams
//! come from one agent identity at a time ([`crate::accounts::AccountHeld`]).

pub mod assignments;
pub mod cache;
pub mod gateways;
mod io;
pub mod relay;

use std::sync::Arc;
use std::time::Duration;

use spinlink_proto::headers;
use spinlink_proto::v1::tunnel_server::{Tunnel, TunnelServer};
use spinlink_proto::v1::{self, cache_up, relay_up};
use spinlink_tls::reload::ReloadingServer;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::accounts::authz::ReadIdentity;
use crate::accounts::{AccountHeld, Accounts, NamespaceScope, Presence};
use crate::handover::Handover;
use crate::metrics::Metrics;
use crate::ownership::{ClaimError, Ownership};
use crate::relay::RelayHandle;
use crate::store::{AccountState, Store};
use gateways::{Gateways, Peer};
pub use io::{ConnectInfo, TunnelIo};

/// How long a stream may take to send its `open` message.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Accepted connections queued for the gRPC server.
pub const DEFAULT_ACCEPT_QUEUE: usize = 64;
/// The `reason` of refusals of a stream whose account another agent
/// identity holds.
pub const REFUSED_ACCOUNT_HELD: &str = "account_held";
/// How long a cache stream waits for another sidecar to let go of its
/// account before it is refused (`Unavailable`): long enough for a holder
/// that saw its own stream end to release the lease, short against the
/// agent's backoff when the holder is still serving or died.
pub const DEFAULT_CLAIM_WAIT: Duration = Duration::from_secs(2);
/// How often the lease is tried meanwhile.
const CLAIM_RETRY: Duration = Duration::from_millis(100);

/// The `Tunnel` service.
#[derive(Debug, Clone)]
pub struct TunnelService {
    accounts: Accounts,
    store: Store,
    shutdown: CancellationToken,
    ownership: Option<Arc<Ownership>>,
    dynamic: Option<Arc<crate::dynamic::Dynamic>>,
    handover: Option<Arc<Handover>>,
    metrics: Metrics,
}

impl TunnelService {
    /// A service writing to `accounts` and `store`; streams end on `shutdown`.
    pub fn new(accounts: Accounts, store: Store, shutdown: CancellationToken) -> Self {
        Self {
            accounts,
            store,
            shutdown,
            ownership: None,
            dynamic: None,
            handover: None,
            metrics: Metrics::default(),
        }
    }

    /// Counts refused streams in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The refusal of a stream of an account another identity holds:
    /// logged with both identities, counted, and answered without naming
    /// the holder.
    fn held(&self, stream: &str, identity: &str, e: AccountHeld) -> Status {
        tracing::warn!(account = %e.account, agent = %identity, holder = %e.holder, stream,
            "stream refused: the account's streams are open from another agent identity");
        self.metrics.tunnel_refused(REFUSED_ACCOUNT_HELD);
        Status::failed_precondition(e.to_string())
    }

    /// Takes accounts over warm from the sidecar that held them (needs
    /// [`TunnelService::with_ownership`] to know which one).
    #[must_use]
    pub fn with_handover(mut self, handover: Arc<Handover>) -> Self {
        self.handover = Some(handover);
        self
    }

    /// Serves `Assignments` streams from these dynamic accounts.
    #[must_use]
    pub fn with_dynamic(mut self, dynamic: Arc<crate::dynamic::Dynamic>) -> Self {
        self.dynamic = Some(dynamic);
        self
    }

    /// Claims an account's lease before taking its cache stream.
    #[must_use]
    pub fn with_ownership(mut self, ownership: Arc<Ownership>) -> Self {
        self.ownership = Some(ownership);
        self
    }
}

/// The first 16 hex digits of a fingerprint, for messages.
fn short(fingerprint: &str) -> &str {
    fingerprint.get(..16).unwrap_or(fingerprint)
}

fn header(md: &MetadataMap, name: &str) -> Result<String, Status> {
    md.get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Status::unauthenticated(format!("missing {name} header")))
}

/// The account and agent identity the gateway verified.
fn verified(md: &MetadataMap) -> Result<(String, String), Status> {
    Ok((
        header(md, headers::VERIFIED_ACCOUNT)?,
        header(md, headers::VERIFIED_IDENTITY)?,
    ))
}

async fn first<T>(inbound: &mut Streaming<T>) -> Result<T, Status> {
    match tokio::time::timeout(DEFAULT_OPEN_TIMEOUT, inbound.message()).await {
        Err(_) => Err(Status::deadline_exceeded("no open message")),
        Ok(Ok(Some(m))) => Ok(m),
        Ok(Ok(None)) => Err(Status::invalid_argument("stream ended before open")),
        Ok(Err(status)) => Err(status),
    }
}

fn check_open(open_account: &str, verified: &str) -> Result<(), Status> {
    if open_account == verified {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "open names account {open_account:?} but the stream is verified for {verified:?}"
        )))
    }
}

#[tonic::async_trait]
impl Tunnel for TunnelService {
    type ControlStream = ReceiverStream<Result<v1::ControlEvent, Status>>;

    async fn control(
        &self,
        _request: Request<v1::ControlRequest>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        Err(Status::unimplemented("Control is answered by the gateway"))
    }

    async fn hello(
        &self,
        _request: Request<v1::HelloRequest>,
    ) -> Result<Response<v1::HelloResponse>, Status> {
        Err(Status::unimplemented("Hello is answered by the gateway"))
    }

    type AssignmentsStream = ReceiverStream<Result<v1::AssignmentsDown, Status>>;

    async fn assignments(
        &self,
        request: Request<Streaming<v1::AssignmentsUp>>,
    ) -> Result<Response<Self::AssignmentsStream>, Status> {
        let Some(dynamic) = self.dynamic.clone() else {
            return Err(Status::unimplemented(
                "this sidecar serves no dynamic accounts",
            ));
        };
        let agent_id = header(request.metadata(), headers::VERIFIED_AGENT)?;
        let identity = header(request.metadata(), headers::VERIFIED_IDENTITY)?;
        let allowed = assignments::allowed_accounts(&header(
            request.metadata(),
            headers::VERIFIED_ACCOUNTS,
        )?)?;
        let mut inbound = request.into_inner();
        let open = match first(&mut inbound).await?.msg {
            Some(v1::assignments_up::Msg::Open(open)) => open,
            _ => return Err(Status::invalid_argument("the first message must be open")),
        };
        if open.agent_id != agent_id {
            return Err(Status::invalid_argument(format!(
                "open names agent {:?} but the stream is verified for {agent_id:?}",
                open.agent_id
            )));
        }
        tracing::info!(agent = %agent_id, %identity, zone = %open.zone, "assignments stream open");
        let (tx, rx) = mpsc::channel(assignments::DEFAULT_DOWN_CAPACITY);
        tokio::spawn(assignments::run(
            dynamic,
            agent_id,
            open.zone,
            allowed,
            inbound,
            tx,
            self.shutdown.child_token(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type CacheStream = ReceiverStream<Result<v1::CacheDown, Status>>;

    async fn cache(
        &self,
        request: Request<Streaming<v1::CacheUp>>,
    ) -> Result<Response<Self::CacheStream>, Status> {
        let (name, identity) = verified(request.metadata())?;
        let mut inbound = request.into_inner();
        let open = first(&mut inbound).await?;
        let (fingerprint, scope, reads_as, reports_synced) = match &open.msg {
            Some(cache_up::Msg::Open(o)) => {
                check_open(&o.account, &name)?;
                let scope = NamespaceScope {
                    namespaces: o.namespaces.clone(),
                    omit_namespaces: o.omit_namespaces.clone(),
                };
                let reads_as = o.reads_as.as_ref().map(|id| ReadIdentity {
                    user: id.user.clone(),
                    groups: id.groups.clone(),
                });
                (o.ca_fingerprint.clone(), scope, reads_as, o.reports_synced)
            }
            _ => return Err(Status::invalid_argument("the first message must be open")),
        };
        // Before anything is claimed or recorded for the stream.
        if let Some(account) = self.accounts.get(&name) {
            account
                .admits(&identity)
                .map_err(|e| self.held("cache", &identity, e))?;
        }
        // One name, one cluster: an account already held for a cluster with
        // another CA is refused, loudly, rather than mixing two clusters.
        match self.store.claim_fingerprint(&name, &fingerprint).await {
            Ok(None) => {}
            Ok(Some(held)) => {
                let message = format!(
                    "account {name:?} is already held for another cluster (CA fingerprint {} \
                     here, {} from agent {identity}); rename one of the accounts",
                    short(&held),
                    short(&fingerprint)
                );
                tracing::error!(account = %name, agent = %identity, held = %held, offered = %fingerprint,
                    "cache stream refused: account name held for another cluster");
                return Err(Status::failed_precondition(message));
            }
            Err(e) => {
                tracing::warn!(account = %name, error = %e, "cluster fingerprint not checked");
            }
        }
        let mut claimed = None;
        if let Some(ownership) = &self.ownership {
            let give_up = tokio::time::Instant::now() + DEFAULT_CLAIM_WAIT;
            loop {
                // Whom the account comes from: claiming replaces the record.
                let previous = match &self.handover {
                    Some(_) => ownership.previous_owner(&name).await,
                    None => None,
                };
                match ownership.claim(&name).await {
                    Ok(()) => claimed = Some(previous),
                    // An agent moving to a new gateway connection ends its
                    // old cache stream just before it opens this one, and
                    // the new gateway may have sent it to another sidecar
                    // than the old one did (each balances by its own load).
                    // The holder lets go as soon as it sees its stream end:
                    // wait for that rather than fail the move.
                    Err(ClaimError::HeldBy { .. }) if tokio::time::Instant::now() < give_up => {
                        tokio::time::sleep(CLAIM_RETRY).await;
                        continue;
                    }
                    // The agent retries with backoff; the holder's lease ends
                    // within one lease period unless its agent is still there.
                    Err(e @ ClaimError::HeldBy { .. }) => {
                        tracing::info!(account = %name, agent = %identity, reason = %e, "cache stream refused");
                        return Err(Status::unavailable(e.to_string()));
                    }
                    // Without the store ownership cannot be checked; serving
                    // beats refusing (the gateways route each account to one
                    // sidecar anyway).
                    Err(e) => {
                        tracing::warn!(account = %name, error = %e, "lease not claimed; serving anyway");
                    }
                }
                break;
            }
        }
        let account = self.accounts.get_or_create(&name);
        if account.set_cluster(&fingerprint) {
            tracing::warn!(account = %name, agent = %identity,
                "the cache held for this name was another cluster's; dropped");
        }
        // The account's first stream here decides what its cache starts
        // from; a second one (the agent moving connections) continues it.
        let first = account.presence() != Presence::Online;
        // Checked again: another identity's stream may have opened since.
        account
            .open_cache(&identity, scope, reads_as, reports_synced)
            .map_err(|e| self.held("cache", &identity, e))?;
        let takeover = match (&self.handover, claimed) {
            (Some(handover), Some(previous)) if first => Some((handover.clone(), previous)),
            _ => None,
        };
        tracing::info!(account = %name, agent = %identity, "cache stream open");
        if let Err(e) = self
            .store
            .upsert_account(&name, &identity, AccountState::Online)
            .await
        {
            tracing::warn!(account = %name, error = %e, "recording the account failed");
        }
        let (tx, rx) = mpsc::channel(cache::DEFAULT_DOWN_CAPACITY);
        // Ends with the sidecar or with a manual disconnect of the account.
        let stop = account.stream_token(&self.shutdown);
        tokio::spawn(cache::run(
            account,
            self.store.clone(),
            open.seq,
            takeover,
            inbound,
            tx,
            stop,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type RelayStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<v1::RelayDown, Status>> + Send + 'static>,
    >;

    async fn relay(
        &self,
        request: Request<Streaming<v1::RelayUp>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        use futures::StreamExt as _;
        let (name, identity) = verified(request.metadata())?;
        let mut inbound = request.into_inner();
        let open = first(&mut inbound).await?;
        match &open.msg {
            Some(relay_up::Msg::Open(o)) => check_open(&o.account, &name)?,
            _ => return Err(Status::invalid_argument("the first message must be open")),
        }
        let account = self.accounts.get_or_create(&name);
        let (tx, rx) = mpsc::channel(crate::relay::DEFAULT_DOWN_CAPACITY);
        let handle = RelayHandle::new(tx);
        account
            .attach_relay(&identity, handle.clone())
            .map_err(|e| self.held("relay", &identity, e))?;
        tracing::info!(account = %name, agent = %identity, "relay stream open");
        let stop = account.stream_token(&self.shutdown);
        // A draining stream ends (OK) once it has answered everything.
        let ended = handle.ended();
        tokio::spawn(relay::run(account, handle, inbound, stop));
        let out = ReceiverStream::new(rx)
            .take_until(ended.cancelled_owned())
            .map(Ok);
        Ok(Response::new(Box::pin(out)))
    }
}

/// How the tunnel listener authenticates its peers.
#[derive(Clone)]
pub enum Security {
    /// mTLS with a required client certificate; streams are served only
    /// on connections whose certificate names one of `gateways`.
    Tls {
        /// Verifies the client certificate against the client CA; its
        /// files are reloaded while the sidecar runs ([`crate::tls_reload`]).
        tls: Arc<ReloadingServer>,
        /// The identities served.
        gateways: Arc<Gateways>,
    },
    /// Plaintext HTTP/2 (development only).
    Insecure,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tls { gateways, .. } => f.debug_tuple("Tls").field(gateways).finish(),
            Self::Insecure => f.write_str("Insecure"),
        }
    }
}

/// Accepts connections until `shutdown`, hands finished handshakes to `out`.
async fn accept_loop(
    listener: TcpListener,
    security: Security,
    out: mpsc::Sender<Result<TunnelIo, std::io::Error>>,
    shutdown: CancellationToken,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off a little.
                    tracing::warn!(error = %e, "tunnel accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        match &security {
            Security::Insecure => {
                if out.send(Ok(TunnelIo::plain(tcp, peer))).await.is_err() {
                    return;
                }
            }
            Security::Tls { tls, gateways } => {
                let (acceptor, gateways) = (tls.acceptor(), gateways.clone());
                let out = out.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(DEFAULT_HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let judged = gateways.judge(tls.get_ref().1.peer_certificates());
                            if let Peer::NotGateway(identity) = &judged {
                                // Once per connection: its streams are
                                // refused (and counted) one by one.
                                tracing::warn!(%peer, identity = identity.as_deref().unwrap_or("<none>"),
                                    "tunnel connection from a certificate that is not one of \
                                     tunnel.tls.gatewayIdentities; its streams will be refused");
                            }
                            let _ = out.send(Ok(TunnelIo::tls(tls, peer, judged))).await;
                        }
                        Ok(Err(e)) => {
                            tracing::info!(%peer, error = %e, "tunnel TLS handshake failed")
                        }
                        Err(_) => tracing::info!(%peer, "tunnel TLS handshake timed out"),
                    }
                });
            }
        }
    }
}

/// Streams the gateway may have reset before this sidecar took them up, at
/// once, before the HTTP/2 server ends the connection with
/// ENHANCE_YOUR_CALM. The server's default (20) is sized for a client; the
/// gateway multiplexes every agent's streams onto a few connections, and an
/// agent cancelling requests before they are answered shows up here as such
/// resets. The gateway bounds them per identity (`listener.cancelsPerSecond`,
/// `cancelBurst`); this lets a burst within those bounds from several agents
/// pass without taking down a connection every account shares.
pub const MAX_PENDING_ACCEPT_RESETS: usize = 1024;

/// Receive window of each tunnel stream (one account's `Cache`, `Relay`).
pub const TUNNEL_STREAM_WINDOW: u32 = 1 << 20;
/// Receive window of each gateway connection, shared by the streams it
/// carries: many stream windows, so an account whose stream this sidecar
/// is slow to read (its cache busy) cannot hold up the others on the same
/// connection.
pub const TUNNEL_CONNECTION_WINDOW: u32 = 64 << 20;

/// Serves the tunnel on `listener` until `shutdown`; streams from peers
/// that are not gateways are refused and counted in `metrics`.
pub async fn serve(
    listener: TcpListener,
    security: Security,
    service: TunnelService,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let (tx, rx) = mpsc::channel(DEFAULT_ACCEPT_QUEUE);
    let accept = tokio::spawn(accept_loop(listener, security, tx, shutdown.clone()));
    let result = tonic::transport::Server::builder()
        // Application heartbeats keep streams alive; PINGs find dead peers.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .initial_stream_window_size(TUNNEL_STREAM_WINDOW)
        .initial_connection_window_size(TUNNEL_CONNECTION_WINDOW)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
        // Before any handler: a peer that is not a gateway gets nowhere.
        .add_service(tonic::service::interceptor::InterceptedService::new(
            TunnelServer::new(service).max_decoding_message_size(spinlink_proto::MAX_MESSAGE_BYTES),
            move |r| gateways::admit(r, &metrics),
        ))
        .serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown.cancelled_owned())
        .await;
    accept.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    #[test]
    fn verified_headers_are_required() {
        let mut md = MetadataMap::new();
        assert_eq!(
            verified(&md).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        md.insert(headers::VERIFIED_ACCOUNT, MetadataValue::from_static("a"));
        assert_eq!(
            verified(&md).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        md.insert(headers::VERIFIED_IDENTITY, MetadataValue::from_static("id"));
        assert_eq!(verified(&md).unwrap(), ("a".to_owned(), "id".to_owned()));
    }

    #[test]
    fn open_must_name_the_verified_account() {
        assert!(check_open("a", "a").is_ok());
        assert_eq!(
            check_open("b", "a").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
