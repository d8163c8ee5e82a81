//! The spinlink sidecar: it runs beside Clouddriver, terminates the agents'
//! `Cache` and `Relay` streams (carried to it by a gateway), keeps a cache of
//! every account's cluster, and serves each account to kubectl as a Kubernetes
//! API endpoint at `http://<facade>/accounts/<name>`.
//!
//! Start with [`Sidecar`]: [`Sidecar::bind`] then [`Sidecar::run`]. A request
//! flows through [`tunnel`] (streams in) → [`accounts`] / [`cache`] (state) →
//! [`facade`] (Kubernetes API out); [`store`] records accounts in SQLite;
//! [`accounts::lifecycle`] ends grace periods and drives [`clouddriver`]
//! registration.
#![forbid(unsafe_code)]

pub mod accounts;
pub mod cache;
pub mod clouddriver;
pub mod config;
pub mod facade;
pub mod metrics;
pub mod ownership;
pub mod store;
pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use spinlink_tls::config::{ALPN_H2, ClientAuth, ServerFiles, server_config};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use accounts::{AccountStatus, Accounts};
pub use config::Config;

/// How long the tunnel may take to close its connections after shutdown.
pub const DEFAULT_TUNNEL_DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Why the sidecar could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::Error),
    /// The tunnel's TLS files could not be used.
    #[error("tunnel TLS: {0}")]
    Tls(#[from] spinlink_tls::Error),
    /// A listener could not be bound.
    #[error("binding {what} to {addr}: {source}")]
    Bind {
        /// `tunnel` or `facade`.
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
    /// The tunnel server failed.
    #[error("tunnel server: {0}")]
    Tunnel(#[from] tonic::transport::Error),
    /// A server task panicked.
    #[error("{0} task failed: {1}")]
    Task(&'static str, tokio::task::JoinError),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The facade's base URL as a process on this host reaches it.
fn facade_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// A bound sidecar, ready to run.
#[derive(Debug)]
pub struct Sidecar {
    config: Config,
    tunnel: TcpListener,
    tunnel_addr: SocketAddr,
    facade: TcpListener,
    facade_addr: SocketAddr,
    security: tunnel::Security,
    accounts: Accounts,
    store: store::Store,
}

async fn bind_listener(what: &'static str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
    let err = |source| Error::Bind { what, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(err)?;
    let local = listener.local_addr().map_err(err)?;
    Ok((listener, local))
}

impl Sidecar {
    /// Validates `config`, loads the TLS files, opens the store and binds both
    /// listeners.
    pub async fn bind(config: Config) -> Result<Sidecar> {
        config.validate()?;
        let security = match (&config.tunnel.tls, config.tunnel.insecure) {
            (Some(tls), _) => {
                let server = server_config(
                    ServerFiles {
                        cert: &tls.cert_file,
                        key: &tls.key_file,
                        client_ca: Some(&tls.client_ca_file),
                    },
                    ClientAuth::Required,
                    &[ALPN_H2],
                )?;
                tunnel::Security::Tls(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
            }
            (None, _) => {
                tracing::warn!(
                    "tunnel.insecure: the tunnel accepts PLAINTEXT HTTP/2 from ANY peer and trusts \
                     its spinlink-verified-* headers; never use this outside development"
                );
                tunnel::Security::Insecure
            }
        };
        let store = store::Store::open(&config.store.url).await?;
        let (tunnel, tunnel_addr) = bind_listener("tunnel", config.tunnel.listen).await?;
        let (facade, facade_addr) = bind_listener("facade", config.facade.listen).await?;
        let accounts = Accounts::with_history(config.accounts.operation_history)
            .with_instance(&config.instance_id);
        Ok(Sidecar {
            config,
            tunnel,
            tunnel_addr,
            facade,
            facade_addr,
            security,
            accounts,
            store,
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
        let advertise = self
            .config
            .facade
            .advertise_url
            .clone()
            .unwrap_or_else(|| facade_url(self.facade_addr));
        let ownership = ownership::Ownership::new(
            self.store.clone(),
            &self.config.instance_id,
            &advertise,
            Duration::from_secs(self.config.ownership.lease_seconds),
            Duration::from_secs(self.config.accounts.grace_period_seconds),
        );
        // The drain runs in order: the facade stops taking connections and
        // finishes the requests it has — relayed ones need the agents'
        // streams — and only then do the streams end and the leases go, so
        // no request in flight is cut and the account moves once.
        let streams = CancellationToken::new();
        let registered = ownership.register().await;
        let owning = tokio::spawn(ownership.clone().run(
            self.accounts.clone(),
            registered,
            streams.clone(),
        ));
        let service =
            tunnel::TunnelService::new(self.accounts.clone(), self.store.clone(), streams.clone())
                .with_ownership(ownership.clone());
        let tunnel = tokio::spawn(tunnel::serve(
            self.tunnel,
            self.security,
            service,
            streams.clone(),
        ));
        let metrics = metrics::Metrics::default();
        let registrar = self.config.clouddriver.clone().map(|cd| {
            clouddriver::Registrar::start(cd, &facade_url(self.facade_addr), metrics.clone())
        });
        let lifecycle = tokio::spawn(
            accounts::lifecycle::Lifecycle::new(
                self.accounts.clone(),
                Duration::from_secs(self.config.accounts.grace_period_seconds),
                registrar,
            )
            .run(shutdown.clone()),
        );
        let facade_impl = facade::Facade::new(
            self.accounts.clone(),
            Duration::from_secs(self.config.facade.relay_timeout_seconds),
        )
        .with_metrics(metrics)
        .with_ownership(ownership)
        .with_shutdown(shutdown.clone());
        let facade = tokio::spawn({
            let serve = facade::serve(self.facade, facade_impl, shutdown.clone());
            let streams = streams.clone();
            async move {
                serve.await;
                streams.cancel();
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
        let lifecycle_result = lifecycle.await;
        // Leases are released before the store closes.
        let owning_result = owning.await;
        self.store.close().await;
        owning_result.map_err(|e| Error::Task("ownership", e))?;
        lifecycle_result.map_err(|e| Error::Task("lifecycle", e))?;
        facade_result.map_err(|e| Error::Task("facade", e))?;
        if let Some(r) = tunnel_result {
            r.map_err(|e| Error::Task("tunnel", e))??;
        }
        tracing::info!("sidecar stopped");
        Ok(())
    }
}
