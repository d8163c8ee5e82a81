//! The peer port: what the sidecars sharing a store serve each other, on a
//! listener of its own (`peer.listen`), never on the facade's.
//!
//! - `/accounts/<name>/…` — a facade request another sidecar forwarded to
//!   this one, the account's owner ([`crate::ownership`]). It is answered
//!   by the facade's handler, always as forwarded (never forwarded again).
//! - `GET /internal/accounts/<name>/snapshot` — the cache of an account
//!   this sidecar gave up, for its new owner ([`crate::handover`]).
//! - Anything else: 404.
//!
//! Both carry what the facade guards by listening on loopback only —
//! requests with the agents' rights in their clusters, whole caches — so
//! with `peer.tls` the port requires a client certificate chaining to
//! `peer.tls.caFile` (refused at the handshake otherwise) **and** naming one
//! of `peer.tls.peerIdentities`, read as the tunnel reads gateways'
//! ([`crate::identity::listed`]); a connection from any other
//! certificate the CA signs — a gateway's, an agent's — gets a 403 naming
//! the key for each request, before the facade or the handover sees it.
//! Refusals are counted in `spinlink_sidecar_peer_refused_total{reason}`.
//! The client side, [`crate::peer_client::Client`], presents this sidecar's
//! certificate and checks the other's the same way.
//!
//! Start with [`serve`].

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use spinlink_kube_api::Status;
use spinlink_tls::config::{ALPN_H2, ALPN_HTTP1, ClientAuth, ServerFiles};
use spinlink_tls::reload::ReloadingServer;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::config::PeerTlsConfig;
use crate::facade::Facade;
use crate::handover::{self, Handover};
use crate::http::body::{self, Body};
use crate::identity::{Listed, listed};
use crate::metrics::Metrics;
use crate::ownership::FORWARDED_HEADER;

/// How long a TLS handshake on the peer port may take.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open peer connections may finish after the listener stops.
pub const DEFAULT_CLOSE_GRACE: Duration = Duration::from_secs(5);
/// The `reason` of a connection whose handshake failed: no client
/// certificate, one the CA does not sign, or a broken or slow handshake.
pub const REFUSED_HANDSHAKE: &str = "handshake";
/// The `reason` of a request from a certificate naming no sidecar identity.
pub const REFUSED_NOT_PEER: &str = "not_peer";
/// The `reason` of a request for something the peer port does not serve.
pub const REFUSED_PATH: &str = "path";
/// Where forwarded facade requests start.
pub const FACADE_PREFIX: &str = "/accounts/";

/// How the peer port authenticates the sidecars that connect.
#[derive(Clone)]
pub enum Security {
    /// mTLS with a required client certificate; requests are served only
    /// on connections whose certificate names one of `identities`.
    Tls {
        /// Verifies the client certificate against `peer.tls.caFile`; its
        /// files are reloaded while the sidecar runs.
        tls: Arc<ReloadingServer>,
        /// `peer.tls.peerIdentities`.
        identities: Arc<BTreeSet<String>>,
    },
    /// Plaintext HTTP (`peer.insecure`, development only).
    Insecure,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tls { identities, .. } => f.debug_tuple("Tls").field(identities).finish(),
            Self::Insecure => f.write_str("Insecure"),
        }
    }
}

impl Security {
    /// The server side of `peer.tls`.
    pub fn tls(tls: &PeerTlsConfig) -> spinlink_tls::Result<Self> {
        let server = ReloadingServer::load(
            ServerFiles {
                cert: &tls.cert_file,
                key: &tls.key_file,
                client_ca: Some(&tls.ca_file),
            },
            ClientAuth::Required,
            &[ALPN_H2, ALPN_HTTP1],
        )?;
        Ok(Self::Tls {
            tls: server,
            identities: Arc::new(tls.peer_identities.iter().cloned().collect()),
        })
    }
}

/// What the peer port answers with: the facade (forwarded requests) and the
/// handover (snapshots).
#[derive(Debug, Clone)]
pub struct Service {
    /// Answers forwarded facade requests.
    pub facade: Arc<Facade>,
    /// Answers snapshot requests.
    pub handover: Arc<Handover>,
    /// Counts refusals.
    pub metrics: Metrics,
}

impl Service {
    /// Answers one request from a connection whose peer was judged `peer`
    /// (`None`: plaintext, nothing to judge).
    pub async fn handle(
        &self,
        peer: Option<&Listed>,
        mut req: Request<Incoming>,
    ) -> Response<Body> {
        let name = match peer {
            None => "plaintext-peer".to_owned(),
            Some(Listed::Yes(identity)) => identity.clone(),
            Some(Listed::No(_) | Listed::NoCertificate) => {
                self.metrics.peer_refused(REFUSED_NOT_PEER);
                return body::status(&Status::new(
                    403,
                    "Forbidden",
                    "the sidecar's peer port serves only sidecars: this client certificate is \
                     not one of its peer.tls.peerIdentities"
                        .to_owned(),
                ));
            }
        };
        let path = req.uri().path();
        if path.starts_with(handover::PATH_PREFIX) {
            return self.handover.respond(req.method(), path);
        }
        if path.starts_with(FACADE_PREFIX) {
            // Whatever reaches the owner here is answered here: a request
            // that finds no owner is a retryable 503, never a second hop.
            if !req.headers().contains_key(FORWARDED_HEADER) {
                let by = HeaderValue::from_str(&name)
                    .unwrap_or_else(|_| HeaderValue::from_static("peer"));
                req.headers_mut().insert(FORWARDED_HEADER, by);
            }
            return self.facade.handle(req).await;
        }
        self.metrics.peer_refused(REFUSED_PATH);
        body::status(&Status::not_found_message(format!(
            "{path} is not served on the peer port: only {FACADE_PREFIX}<name>/… (forwarded) and \
             {}<name>{}",
            handover::PATH_PREFIX,
            handover::PATH_SUFFIX
        )))
    }
}

/// Serves the peer port on `listener` until `shutdown`, then lets open
/// connections finish for [`DEFAULT_CLOSE_GRACE`].
pub async fn serve(
    listener: TcpListener,
    security: Security,
    service: Service,
    shutdown: CancellationToken,
) {
    let service = Arc::new(service);
    crate::http::serve::serve_with(
        listener,
        "peer",
        move |tcp: TcpStream, addr: SocketAddr| {
            let (security, service) = (security.clone(), service.clone());
            async move {
                let (io, peer) = match security {
                    Security::Insecure => (Either::Left(tcp), None),
                    Security::Tls { tls, identities } => {
                        let tls = match tokio::time::timeout(
                            DEFAULT_HANDSHAKE_TIMEOUT,
                            tls.acceptor().accept(tcp),
                        )
                        .await
                        {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                service.metrics.peer_refused(REFUSED_HANDSHAKE);
                                tracing::info!(peer = %addr, error = %e, "peer TLS handshake failed");
                                return None;
                            }
                            Err(_) => {
                                service.metrics.peer_refused(REFUSED_HANDSHAKE);
                                tracing::info!(peer = %addr, "peer TLS handshake timed out");
                                return None;
                            }
                        };
                        let judged = listed(&identities, tls.get_ref().1.peer_certificates());
                        if let Listed::No(identity) = &judged {
                            // Once per connection; its requests are refused
                            // (and counted) one by one.
                            tracing::warn!(peer = %addr, identity = identity.as_deref().unwrap_or("<none>"),
                                "peer connection from a certificate that is not one of \
                                 peer.tls.peerIdentities; its requests will be refused");
                        }
                        (Either::Right(tls), Some(judged))
                    }
                };
                let handle = move |req: Request<Incoming>| {
                    let (service, peer) = (service.clone(), peer.clone());
                    async move { service.handle(peer.as_ref(), req).await }
                };
                Some((io, handle))
            }
        },
        shutdown,
        DEFAULT_CLOSE_GRACE,
    )
    .await;
}
