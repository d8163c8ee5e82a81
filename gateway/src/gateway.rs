//! [`Gateway`]: the component the CLI builds from a [`Config`], binds and runs.
//!
//! [`Gateway::bind`] loads the TLS files, binds the agent listener and the
//! admin port; [`Gateway::run`] serves both, reloads the TLS files in the
//! background, turns `/readyz` to 503 the moment shutdown is signalled, and
//! keeps the admin port up until the listener has drained.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::admin::Stats;
use crate::admin::server::AdminServer;
use crate::config::Config;
use crate::identity::Policy;
use crate::listener::{Listener, Settings};
use crate::tls::{ServerTls, TlsReloader};
use crate::token::TokenKey;
use crate::tunnel::{Shared, TunnelLimits};
use crate::upstream::{Target, Upstream, UpstreamTls};
use crate::{Error, Result};

/// A bound gateway, ready to [`run`](Gateway::run).
#[derive(Debug)]
pub struct Gateway {
    listener: Listener,
    local_addr: SocketAddr,
    grace: Duration,
    stats: Arc<Stats>,
    admin: Option<AdminServer>,
    reloader: Option<TlsReloader>,
}

/// A readiness receiver that says "not ready" until [`Gateway::run`]
/// replaces it.
fn ready_rx() -> watch::Receiver<bool> {
    watch::channel(false).1
}

impl Gateway {
    /// Validates `config`, loads its certificates and binds the listener.
    pub async fn bind(config: Config) -> Result<Gateway> {
        config.validate()?;
        let stats = Arc::new(Stats::default());
        let invalid = |key: String, message: String| Error::InvalidConfig {
            origin: config.origin.clone(),
            key,
            message,
        };
        let tls = if config.insecure {
            tracing::warn!(
                "INSECURE GATEWAY: plaintext listener, agent identity taken from the \
                 `spinlink-dev-identity` header without proof. Local development only."
            );
            if config.tls.is_some() {
                tracing::warn!("`tls` is ignored because `insecure: true`");
            }
            None
        } else {
            let files = config
                .tls
                .as_ref()
                .ok_or_else(|| invalid("tls".into(), "required unless `insecure: true`".into()))?;
            let tls = ServerTls::load(files, &[spinlink_tls::config::ALPN_H2], stats.clone())
                .map_err(|e| invalid("tls".into(), e.to_string()))?;
            Some(Arc::new(tls))
        };
        let policy =
            Policy::compile(&config.policy).map_err(|e| invalid(e.key(), e.to_string()))?;
        let upstream_tls = config
            .upstream_tls
            .as_ref()
            .map(UpstreamTls::from_config)
            .transpose()?;
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for (i, u) in config.upstreams.iter().enumerate() {
            let upstream = Target::parse(&u.url)
                .and_then(|t| Upstream::new(t, upstream_tls.as_ref(), config.upstream_connections))
                .map_err(|e| invalid(format!("upstreams[{i}].url"), e.to_string()))?;
            upstreams.push(upstream);
        }
        let shared = Arc::new(Shared {
            gateway_id: config.gateway_id.clone(),
            policy,
            tokens: TokenKey::generate()?,
            token_ttl: config.token_ttl(),
            upstreams,
            stats: stats.clone(),
            limits: TunnelLimits::from_config(&config.listener),
        });
        let tcp = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let local_addr = tcp.local_addr().map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;

        let admin = match &config.admin {
            None => None,
            Some(admin) => {
                let tcp = TcpListener::bind(admin.listen)
                    .await
                    .map_err(|source| Error::Bind {
                        addr: admin.listen,
                        source,
                    })?;
                Some(AdminServer::new(tcp, stats.clone(), ready_rx()))
            }
        };
        tracing::info!(
            gateway_id = %config.gateway_id,
            %local_addr,
            upstreams = config.upstreams.len(),
            policy_rules = config.policy.len(),
            insecure = config.insecure,
            admin = ?admin.as_ref().and_then(|a| a.local_addr().ok()),
            "gateway bound"
        );
        let reloader = match (&tls, &config.tls) {
            (Some(tls), Some(files)) if files.reload_interval_seconds > 0 => {
                Some(TlsReloader::new(
                    tls.clone(),
                    Duration::from_secs(files.reload_interval_seconds),
                ))
            }
            _ => None,
        };
        let settings = Settings::from_config(&config.listener, config.shutdown_grace());
        Ok(Gateway {
            listener: Listener::new(tcp, tls, config.identity.sources(), shared, settings),
            local_addr,
            grace: config.shutdown_grace(),
            stats,
            admin,
            reloader,
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The gateway's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The address the admin port is bound to, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|a| a.local_addr().ok())
    }

    /// Serves agents until `shutdown` is cancelled, then lets open
    /// connections finish within the configured grace period. The admin port
    /// answers `/readyz` 200 from now until shutdown, 503 while draining.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        // Background tasks (reloader, admin port) stop after the drain.
        let stopped = CancellationToken::new();
        let mut tasks = Vec::new();
        if let Some(reloader) = self.reloader {
            tasks.push(tokio::spawn(reloader.run(stopped.clone())));
        }
        let (ready, ready_rx) = watch::channel(false);
        if let Some(admin) = self.admin {
            let admin = admin.with_ready(ready_rx);
            tasks.push(tokio::spawn(admin.run(stopped.clone())));
        }
        // The listener is bound (in `bind`) and accepts from here on.
        ready.send_replace(true);
        let metrics_stats = self.stats.clone();
        let on_shutdown = {
            let shutdown = shutdown.clone();
            async move {
                shutdown.cancelled().await;
                ready.send_replace(false);
                metrics_stats.metrics().draining.set(1);
                tracing::info!("draining");
                ready
            }
        };
        let (_, ready) = tokio::join!(self.listener.run(shutdown, self.grace), on_shutdown);
        drop(ready);
        stopped.cancel();
        for task in tasks {
            let _ = task.await;
        }
        tracing::info!("gateway stopped");
        Ok(())
    }
}
