//! The spinlink sidecar: it runs beside Clouddriver, terminates the agents'
//! `Cache` and `Relay` streams (carried to it by a gateway), keeps a cache of
//! every account's cluster, and serves each account to kubectl as a Kubernetes
//! API endpoint at `http://<facade>/accounts/<name>`.
//!
//! Start with [`Sidecar`]: [`Sidecar::bind`] then [`Sidecar::run`]. A request
//! flows through [`tunnel`] (streams in) → [`accounts`] / [`cache`] (state) →
//! [`facade`] (Kubernetes API out, relayed through [`relay`]); [`dynamic`]
//! holds the accounts created through the REST [`api`] and hands them to
//! agents; [`store`] records accounts in SQLite or PostgreSQL; [`lifecycle`]
//! ends grace periods and drives [`clouddriver`] registration; [`ownership`]
//! decides which sidecar serves an account and [`handover`] moves its cache
//! to the next one on a planned move, both between sidecars over the
//! [`peer`] port ([`peer_client`] on the calling side).
//!
//! The modules depend on each other in one direction: the leaves
//! ([`config`], [`http`](crate::http), [`metrics`], [`store`], [`cache`],
//! [`relay`], [`identity`]) on none of the others; [`accounts`] on leaves;
//! the components ([`tls_reload`], [`peer_client`], [`ownership`],
//! [`handover`], [`clouddriver`], [`lifecycle`], [`dynamic`], [`tunnel`]) on
//! what is below them; the serving modules ([`api`], [`facade`], [`peer`]) on
//! components; this file wires them.
#![forbid(unsafe_code)]

pub mod accounts;
pub mod api;
pub mod cache;
pub mod clouddriver;
pub mod config;
pub mod dynamic;
pub mod facade;
pub mod handover;
pub mod http;
pub mod identity;
pub mod lifecycle;
pub mod metrics;
pub mod ownership;
pub mod peer;
pub mod peer_client;
pub mod relay;
pub mod store;
pub mod tls_reload;
pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use spinlink_tls::config::{ALPN_H2, ClientAuth, ServerFiles};
use spinlink_tls::reload::ReloadingServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use accounts::{AccountStatus, Accounts};
pub use config::Config;

/// How long the tunnel may take to close its connections after shutdown.
pub const DEFAULT_TUNNEL_DRAIN_GRACE: Duration = Duration::from_secs(10);
/// How long an open scrape on the metrics listener may take to finish once
/// the sidecar drains.
pub const DEFAULT_METRICS_DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Why the sidecar could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::Error),
    /// The tunnel's TLS files could not be used.
    #[error("tunnel TLS: {0}")]
    Tls(#[from] spinlink_tls::Error),
    /// The peer port's TLS files could not be used.
    #[error("peer.tls: {0}")]
    PeerTls(#[source] spinlink_tls::Error),
    /// A listener could not be bound.
    #[error("binding {what} to {addr}: {source}")]
    Bind {
        /// `tunnel`, `facade` or `peer`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// The dynamic accounts' encryption key could not be loaded.
    #[error("accounts.encryptionKeyFile: {0}")]
    EncryptionKey(#[from] dynamic::crypto::Error),
    /// The tunnel server failed.
    #[error("tunnel server: {0}")]
    Tunnel(#[from] tonic::transport::Error),
    /// A server task panicked.
    #[error("{0} task failed: {1}")]
    Task(&'static str, tokio::task::JoinError),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The facade's base URL as a process on this host reaches it: its bound
/// address, a loopback one (validation refuses any other).
fn facade_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// The bound peer port.
#[derive(Debug)]
struct Peer {
    listener: TcpListener,
    addr: SocketAddr,
    security: peer::Security,
    client: peer_client::Client,
}

/// A bound sidecar, ready to run.
#[derive(Debug)]
pub struct Sidecar {
    config: Config,
    tunnel: TcpListener,
    tunnel_addr: SocketAddr,
    facade: TcpListener,
    facade_addr: SocketAddr,
    /// The peer port, when served.
    peer: Option<Peer>,
    /// The metrics listener, when configured.
    metrics_listener: Option<(TcpListener, SocketAddr)>,
    security: tunnel::Security,
    accounts: Accounts,
    journal: accounts::journal::Writer,
    metrics: metrics::Metrics,
    store: store::Store,
    cipher: Option<dynamic::crypto::Cipher>,
    /// Certificates reloaded while it runs ([`tls_reload`]).
    reloading: Vec<(&'static str, tls_reload::Reloading)>,
}

async fn bind_listener(what: &'static str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
    let err = |source| Error::Bind { what, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(err)?;
    let local = listener.local_addr().map_err(err)?;
    Ok((listener, local))
}

impl Sidecar {
    /// Validates `config`, loads the TLS files, opens the store and binds the
    /// listeners: tunnel, facade, and the peer port when configured.
    pub async fn bind(config: Config) -> Result<Sidecar> {
        config.validate()?;
        let security = match (&config.tunnel.tls, config.tunnel.insecure) {
            (Some(tls), _) => {
                let server = ReloadingServer::load(
                    ServerFiles {
                        cert: &tls.cert_file,
                        key: &tls.key_file,
                        client_ca: Some(&tls.client_ca_file),
                    },
                    ClientAuth::Required,
                    &[ALPN_H2],
                )?;
                tunnel::Security::Tls {
                    tls: server,
                    gateways: Arc::new(tunnel::gateways::Gateways::new(
                        tls.gateway_identities.iter().cloned(),
                    )),
                }
            }
            (None, _) => {
                tracing::warn!(
                    "tunnel.insecure: the tunnel accepts PLAINTEXT HTTP/2 from ANY peer and trusts \
                     its spinlink-verified-* headers; never use this outside development"
                );
                tunnel::Security::Insecure
            }
        };
        let cipher = match &config.accounts.encryption_key_file {
            Some(path) => Some(dynamic::crypto::Cipher::from_file(path)?),
            None => None,
        };
        let store = store::Store::open(&config.store.url).await?;
        let (tunnel, tunnel_addr) = bind_listener("tunnel", config.tunnel.listen).await?;
        let (facade, facade_addr) = bind_listener("facade", config.facade.listen).await?;
        let peer = if config.peer.enabled() {
            let (security, client) = match &config.peer.tls {
                Some(tls) => (
                    peer::Security::tls(tls).map_err(Error::PeerTls)?,
                    peer_client::Client::tls(tls).map_err(Error::PeerTls)?,
                ),
                None => {
                    tracing::warn!(
                        "peer.insecure: the peer port serves account caches and the agents' \
                         rights to ANY client in PLAINTEXT; never use this outside development"
                    );
                    (peer::Security::Insecure, peer_client::Client::plaintext())
                }
            };
            let (listener, addr) = bind_listener("peer", config.peer.listen).await?;
            Some(Peer {
                listener,
                addr,
                security,
                client,
            })
        } else {
            // A sole sidecar on a SQLite file is a setup of its own; say
            // what it lacks without crying wolf.
            if config.store.shared() {
                tracing::info!(
                    store = %config.store.url,
                    "no peer port (peer.tls): another sidecar sharing this store cannot forward \
                     requests to this one or take its accounts over warm"
                );
            }
            None
        };
        let metrics_listener = match config.metrics.listen {
            Some(addr) => Some(bind_listener("metrics", addr).await?),
            None => None,
        };
        let metrics = metrics::Metrics::default();
        // The files were loaded above, so they are read again here only
        // for the date; a failure now is a file changed meanwhile.
        let served = [
            ("tunnel", config.tunnel.tls.as_ref().map(|t| &t.cert_file)),
            ("peer", config.peer.tls.as_ref().map(|t| &t.cert_file)),
        ];
        for (listener, cert) in served {
            if let Some(cert) = cert {
                match spinlink_tls::identity::leaf_not_after(cert) {
                    Ok(not_after) => metrics.certificate(listener, not_after),
                    Err(e) => {
                        tracing::warn!(listener, error = %e, "reading the certificate's expiry")
                    }
                }
            }
        }
        let (journal, journal_writer) = accounts::journal::Journal::new(
            store.clone(),
            &config.instance_id,
            config.accounts.operation_history,
            metrics.journal_dropped(),
        );
        let accounts = Accounts::new()
            .with_journal(journal)
            .with_instance(&config.instance_id);
        let mut reloading = Vec::new();
        if let tunnel::Security::Tls { tls, .. } = &security {
            reloading.push(("tunnel", tls_reload::Reloading::Server(tls.clone())));
        }
        if let Some(peer) = &peer {
            if let peer::Security::Tls { tls, .. } = &peer.security {
                reloading.push(("peer", tls_reload::Reloading::Server(tls.clone())));
            }
            if let Some(cert) = peer.client.certificate() {
                reloading.push(("peer-client", tls_reload::Reloading::Client(cert.clone())));
            }
        }
        Ok(Sidecar {
            reloading,
            config,
            tunnel,
            tunnel_addr,
            facade,
            facade_addr,
            peer,
            metrics_listener,
            security,
            accounts,
            journal: journal_writer,
            metrics,
            store,
            cipher,
        })
    }

    /// The tunnel listener's address.
    pub fn tunnel_addr(&self) -> SocketAddr {
        self.tunnel_addr
    }

    /// The facade listener's address.
    pub fn facade_addr(&self) -> SocketAddr {
        self.facade_addr
    }

    /// The peer port's address, when it is served.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer.as_ref().map(|p| p.addr)
    }

    /// The metrics listener's address, when configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|(_, addr)| *addr)
    }

    /// A handle on the accounts registry, usable after `run` starts.
    pub fn accounts(&self) -> Accounts {
        self.accounts.clone()
    }

    /// Serves the tunnel and the facade until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        tracing::info!(
            instance = %self.config.instance_id,
            tunnel = %self.tunnel_addr,
            facade = %self.facade_addr,
            "sidecar running"
        );
        let peer_url = self
            .peer
            .as_ref()
            .map(|p| self.config.peer.advertise(p.addr));
        let client = self
            .peer
            .as_ref()
            .map(|p| p.client.clone())
            .unwrap_or_default();
        let ownership = ownership::Ownership::new(
            self.store.clone(),
            &self.config.instance_id,
            peer_url.as_deref(),
            client.clone(),
            Duration::from_secs(self.config.ownership.lease_seconds),
            Duration::from_secs(self.config.accounts.grace_period_seconds),
        );
        let metrics = self.metrics.clone();
        // Outlives the facade: the operations it relays last are journaled.
        let journal_stop = CancellationToken::new();
        let journal = tokio::spawn(self.journal.run(journal_stop.clone()));
        tokio::spawn(tls_reload::run(
            self.reloading.clone(),
            self.metrics.clone(),
            shutdown.clone(),
        ));
        let handover = handover::Handover::new(
            self.accounts.clone(),
            handover::Settings {
                timeout: Duration::from_millis(self.config.ownership.handover_timeout_millis),
                max_bytes: self.config.ownership.handover_max_bytes,
                client,
            },
            metrics.clone(),
        );
        // The drain runs in order: the facade stops taking connections and
        // finishes the requests it has — relayed ones need the agents'
        // streams —, the relays peers forwarded are answered (new ones
        // refused as retryable), and only then do the streams end and the
        // leases go, so no request in flight is cut and the account moves
        // once.
        let streams = CancellationToken::new();
        let registered = ownership.register().await;
        let recorder = ownership::versions::Recorder::new(
            self.store.clone(),
            &self.config.instance_id,
            metrics.resource_version_writes(),
        );
        let owning = tokio::spawn(ownership.clone().run(
            self.accounts.clone(),
            recorder,
            registered,
            streams.clone(),
        ));
        let dynamic = Arc::new(
            dynamic::Dynamic::new(self.store.clone(), self.cipher, self.accounts.clone())
                .with_clouddriver(self.config.clouddriver.clone()),
        );
        let service =
            tunnel::TunnelService::new(self.accounts.clone(), self.store.clone(), streams.clone())
                .with_metrics(metrics.clone())
                .with_ownership(ownership.clone())
                .with_handover(handover.clone())
                .with_dynamic(dynamic.clone());
        let tunnel = tokio::spawn(tunnel::serve(
            self.tunnel,
            self.security,
            service,
            metrics.clone(),
            streams.clone(),
        ));
        let registrar = self.config.clouddriver.clone().map(|cd| {
            clouddriver::Registrar::start(
                cd,
                &facade_url(self.facade_addr),
                Some(ownership.clone()),
                metrics.clone(),
            )
        });
        let lifecycle = tokio::spawn(
            lifecycle::Lifecycle::new(
                self.accounts.clone(),
                Duration::from_secs(self.config.accounts.grace_period_seconds),
                registrar,
            )
            .run(shutdown.clone()),
        );
        let facade_impl = Arc::new(
            facade::Facade::new(
                self.accounts.clone(),
                Duration::from_secs(self.config.facade.relay_timeout_seconds),
            )
            .with_metrics(metrics.clone())
            .with_openapi_cache_bytes(
                usize::try_from(self.config.facade.openapi_cache_bytes).unwrap_or(usize::MAX),
            )
            .with_ownership(ownership)
            .with_dynamic(dynamic)
            .with_shutdown(shutdown.clone()),
        );
        // Outlives the facade and the streams: peers read the caches of the
        // accounts this sidecar gives up until the drain ends (below), and
        // forwarded requests are answered — as a stale account's, or with a
        // retryable 503 — until then.
        let peer_stop = CancellationToken::new();
        let peer_server = self.peer.map(|p| {
            tracing::info!(peer = %p.addr, advertised = peer_url.as_deref().unwrap_or(""), "peer port listening");
            tokio::spawn(peer::serve(
                p.listener,
                p.security,
                peer::Service {
                    facade: facade_impl.clone(),
                    handover: handover.clone(),
                    metrics: metrics.clone(),
                },
                peer_stop.clone(),
            ))
        });
        // `/metrics` only, answered as the facade answers it; it stops with
        // the facade.
        let metrics_server = self.metrics_listener.map(|(listener, addr)| {
            tracing::info!(metrics = %addr, "metrics listening");
            let facade = facade_impl.clone();
            tokio::spawn(crate::http::serve::serve_http(
                listener,
                "metrics",
                move |req| {
                    let facade = facade.clone();
                    async move {
                        if req.uri().path() == "/metrics" {
                            facade.handle(req).await
                        } else {
                            crate::http::body::status(
                                &spinlink_kube_api::Status::not_found_message(
                                    "only /metrics is served here",
                                ),
                            )
                        }
                    }
                },
                shutdown.clone(),
                DEFAULT_METRICS_DRAIN_GRACE,
            ))
        });
        let facade = tokio::spawn({
            let serve = facade::serve(self.facade, facade_impl, shutdown.clone());
            let streams = streams.clone();
            let accounts = self.accounts.clone();
            async move {
                serve.await;
                // Peers forward requests here through the peer port, which
                // outlives the facade's listener: new ones are refused as
                // retryable from now on, and those already with an agent
                // are answered before the streams end.
                let cut = accounts.close_relays(facade::DEFAULT_DRAIN_GRACE).await;
                if cut > 0 {
                    tracing::warn!(
                        requests = cut,
                        "drain grace over with relayed requests in flight; they fail"
                    );
                }
                // What this sidecar gives up: new owners fetch their caches
                // before it exits (below).
                let leaving: Vec<String> = accounts
                    .all()
                    .iter()
                    .filter(|a| a.presence() == accounts::Presence::Online)
                    .map(|a| a.name().to_owned())
                    .collect();
                streams.cancel();
                leaving
            }
        });
        let stop = shutdown.clone();
        // A server failing alone takes the sidecar down with it.
        let tunnel_abort = tunnel.abort_handle();
        let tunnel_result = async {
            let r = tunnel.await;
            stop.cancel();
            r
        };
        let drained = async {
            streams.cancelled().await;
            tokio::time::sleep(DEFAULT_TUNNEL_DRAIN_GRACE).await;
        };
        let tunnel_result = tokio::select! {
            r = tunnel_result => Some(r),
            () = drained => {
                tracing::warn!("tunnel connections did not close in time; cutting them");
                tunnel_abort.abort();
                None
            }
        };
        let facade_result = facade.await;
        let metrics_result = match metrics_server {
            Some(server) => server.await,
            None => Ok(()),
        };
        journal_stop.cancel();
        let journal_result = journal.await;
        let lifecycle_result = lifecycle.await;
        // The last positions are recorded and the leases released before
        // the store closes.
        let owning_result = owning.await;
        // The leases are free: the accounts' new owners fetch their caches
        // now. Only a store other sidecars share can have any, and only
        // over the peer port.
        if self.config.store.shared()
            && peer_server.is_some()
            && let Ok(online) = &facade_result
        {
            let leaving: Vec<String> = online
                .iter()
                .filter(|name| {
                    self.accounts.get(name).is_some_and(|a| {
                        a.presence() == accounts::Presence::Stale && a.read_cache().counts().0 > 0
                    })
                })
                .cloned()
                .collect();
            let within = Duration::from_secs(self.config.ownership.handover_drain_seconds);
            if !leaving.is_empty() && !handover.wait_fetched(&leaving, within).await {
                tracing::info!(
                    accounts = leaving.len(),
                    "not every account's cache was fetched by a new owner before the drain ended"
                );
            }
        }
        peer_stop.cancel();
        let peer_result = match peer_server {
            Some(server) => server.await,
            None => Ok(()),
        };
        self.store.close().await;
        owning_result.map_err(|e| Error::Task("ownership", e))?;
        journal_result.map_err(|e| Error::Task("journal", e))?;
        peer_result.map_err(|e| Error::Task("peer", e))?;
        metrics_result.map_err(|e| Error::Task("metrics", e))?;
        lifecycle_result.map_err(|e| Error::Task("lifecycle", e))?;
        facade_result.map_err(|e| Error::Task("facade", e))?;
        if let Some(r) = tunnel_result {
            r.map_err(|e| Error::Task("tunnel", e))??;
        }
        tracing::info!("sidecar stopped");
        Ok(())
    }
}
