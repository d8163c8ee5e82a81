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

use crate::admin::server::AdminServer;
use crate::config::Config;
use crate::config::upstreams::Discovery;
use crate::identity::Policy;
use crate::identity::jwt::JwtVerifier;
use crate::listener::{Listener, Settings};
use crate::stats::Stats;
use crate::tls::{ServerTls, TlsReloader};
use crate::token::TokenKey;
use crate::tunnel::{Shared, TunnelLimits};
use crate::upstream::discovery::{DnsDiscovery, EndpointSliceDiscovery};
use crate::upstream::health::HealthChecker;
use crate::upstream::{Target, Upstream, UpstreamSet, UpstreamTls};
use crate::workers::Workers;
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
    /// The ingress whose servers' certificates reload, and how often.
    ingress_reload: Option<(Arc<crate::ingress::Ingress>, Duration)>,
    /// The bootstrap JWKS file's reloader, and how often.
    jwks_reload: Option<(crate::identity::jwt::JwksReloader, Duration)>,
    dns: Vec<DnsDiscovery>,
    watches: Vec<EndpointSliceDiscovery>,
    health: HealthChecker,
    upstreams: Arc<UpstreamSet>,
    /// What agent connections may hold together (`listener.maxBufferedBytes`).
    buffers: Arc<crate::engine::budget::Budget>,
}

/// A readiness receiver that says "not ready" until [`Gateway::run`]
/// replaces it.
fn ready_rx() -> watch::Receiver<bool> {
    watch::channel(false).1
}

/// What [`Gateway::check`] compiled from a configuration.
#[derive(Debug)]
pub struct Checked {
    /// `policy`, compiled.
    pub policy: Policy,
    /// `ingress`, compiled (its servers' certificates loaded).
    pub ingress: Option<crate::ingress::Ingress>,
    /// `upstreams[].url`, parsed, in order.
    pub targets: Vec<Target>,
    /// How many worker threads `workers` asks for (0 read as one per CPU).
    pub workers: usize,
}

impl Gateway {
    /// Checks `config` as a whole: its own values ([`Config::validate`]),
    /// then what only the modules that use them can check — the policy's
    /// globs, the upstream URLs, the ingress model. Errors name the key and
    /// the file, as [`Config::from_file`]'s do. What it compiles is handed
    /// back, so [`Gateway::bind`] builds from it rather than again.
    pub fn check(config: &Config) -> Result<Checked> {
        config.validate()?;
        let invalid = |key: String, message: String| Error::InvalidConfig {
            origin: config.origin.clone(),
            key,
            message,
        };
        let policy =
            Policy::compile(&config.policy).map_err(|e| invalid(e.key(), e.to_string()))?;
        let workers = crate::workers::count(config.workers);
        let ingress = match &config.ingress {
            Some(model) => Some(
                crate::ingress::Ingress::compile_for(model, workers)
                    .map_err(|e| invalid(format!("ingress.{}", e.key), e.message))?,
            ),
            None => None,
        };
        let mut targets = Vec::with_capacity(config.upstreams.len());
        for (i, upstream) in config.upstreams.iter().enumerate() {
            let target = Target::parse(&upstream.url)
                .map_err(|e| invalid(format!("upstreams[{i}].url"), e.to_string()))?;
            if target.is_tls() && config.upstream_tls.is_none() {
                return Err(invalid(
                    format!("upstreams[{i}].url"),
                    "https upstreams need `upstreamTls`".into(),
                ));
            }
            targets.push(target);
        }
        Ok(Checked {
            policy,
            ingress,
            targets,
            workers,
        })
    }

    /// Checks `config` ([`Gateway::check`]), loads its certificates and
    /// binds the listener.
    pub async fn bind(config: Config) -> Result<Gateway> {
        let Checked {
            policy,
            ingress,
            targets,
            workers: count,
        } = Self::check(&config)?;
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
        } else if config.tls.is_none() && config.ingress.is_some() {
            // Ingress servers bring their own certificates.
            None
        } else {
            let mut files = config
                .tls
                .clone()
                .ok_or_else(|| invalid("tls".into(), "required unless `insecure: true`".into()))?;
            files.client_certificate_optional = config.jwt_bootstrap.is_some();
            let tls = ServerTls::load(&files, &[spinlink_tls::config::ALPN_H2], stats.clone())
                .map_err(|e| invalid("tls".into(), e.to_string()))?;
            Some(Arc::new(tls))
        };
        let upstream_tls = config
            .upstream_tls
            .as_ref()
            .map(UpstreamTls::from_config)
            .transpose()?;
        let pool = &config.upstream_pool;
        let workers = Workers::start(count).map_err(|source| Error::Workers { count, source })?;
        let upstreams = Arc::new(
            UpstreamSet::new(
                upstream_tls.clone(),
                config.upstream_connections,
                pool.clone(),
                stats.clone(),
            )
            .with_workers(workers.spawners()),
        );
        let static_source = upstreams.add_source();
        let mut fixed = Vec::new();
        let mut dns = Vec::new();
        let mut watches = Vec::new();
        for (i, (u, target)) in config.upstreams.iter().zip(targets).enumerate() {
            // Checked here so a bad upstream fails start-up, not the first
            // stream.
            Upstream::new(target.clone(), upstream_tls.as_ref(), 1)
                .map_err(|e| invalid(format!("upstreams[{i}].url"), e.to_string()))?;
            match &u.discovery {
                Discovery::Static => fixed.push(target),
                Discovery::EndpointSlices(slices) => {
                    let d = EndpointSliceDiscovery::new(upstreams.clone(), target, slices.clone())
                        .await
                        .map_err(|e| invalid(format!("upstreams[{i}].discovery"), e.to_string()))?;
                    watches.push(d);
                }
                Discovery::Dns => {
                    let d = DnsDiscovery::new(
                        upstreams.clone(),
                        target,
                        Duration::from_secs(pool.dns_refresh_seconds),
                    );
                    // Resolved once before serving; failures are retried.
                    if let Err(e) = d.refresh().await {
                        tracing::warn!(upstream = %u.url, error = %e, "resolving upstream failed; retrying");
                    }
                    dns.push(d);
                }
            }
        }
        upstreams.update(static_source, fixed);
        let health = HealthChecker::new(upstreams.clone(), pool.health_check.clone());
        let jwt = config
            .jwt_bootstrap
            .as_ref()
            .map(JwtVerifier::load)
            .transpose()
            .map_err(|e| invalid(e.key().to_owned(), e.to_string()))?;
        // The JWKS file reloads on the listener's TLS reload interval.
        let jwks_reload = jwt.as_ref().and_then(JwtVerifier::reloader).and_then(|r| {
            let seconds = config
                .tls
                .as_ref()
                .map_or(crate::config::DEFAULT_TLS_RELOAD_INTERVAL_SECONDS, |t| {
                    t.reload_interval_seconds
                });
            (seconds > 0).then(|| (r, Duration::from_secs(seconds)))
        });
        let shared = Arc::new(Shared {
            gateway_id: config.gateway_id.clone(),
            policy,
            tokens: TokenKey::generate()?,
            token_ttl: config.token_ttl(),
            upstreams: upstreams.clone(),
            stats: stats.clone(),
            limits: TunnelLimits::from_config(&config.listener),
            owners: Arc::default(),
            jwt,
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
            workers = workers.len(),
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
        let mut settings = Settings::from_config(&config.listener, config.shutdown_grace());
        let mut ingress_reload = None;
        if let Some(ingress) = ingress {
            let ingress = Arc::new(ingress);
            // Ingress servers' certificates reload like the listener's own,
            // at its `tls.reloadIntervalSeconds` (0 turns both off).
            let seconds = config
                .tls
                .as_ref()
                .map_or(crate::config::DEFAULT_TLS_RELOAD_INTERVAL_SECONDS, |t| {
                    t.reload_interval_seconds
                });
            if ingress.is_tls() && seconds > 0 {
                ingress_reload = Some((ingress.clone(), Duration::from_secs(seconds)));
            }
            settings = settings.with_ingress(ingress);
        }
        Ok(Gateway {
            buffers: shared.limits.buffers.clone(),
            upstreams: upstreams.clone(),
            dns,
            watches,
            health,
            listener: Listener::new(
                tcp,
                tls,
                config.identity.sources(),
                shared,
                settings,
                workers,
            ),
            local_addr,
            grace: config.shutdown_grace(),
            stats,
            admin,
            reloader,
            ingress_reload,
            jwks_reload,
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

    /// The sidecar instances and their account assignments. Source 0 holds
    /// the static `upstreams` entries.
    pub fn upstreams(&self) -> Arc<UpstreamSet> {
        self.upstreams.clone()
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
        if let Some((jwks, interval)) = self.jwks_reload {
            tasks.push(tokio::spawn(jwks.run(interval, stopped.clone())));
        }
        if let Some((ingress, interval)) = self.ingress_reload {
            tasks.push(tokio::spawn(
                ingress.run_tls_reloader(interval, stopped.clone()),
            ));
        }
        for dns in self.dns {
            tasks.push(tokio::spawn(dns.run(stopped.clone())));
        }
        for watch in self.watches {
            tasks.push(tokio::spawn(watch.run(stopped.clone())));
        }
        tasks.push(tokio::spawn(self.health.run(stopped.clone())));
        tasks.push(tokio::spawn(
            self.buffers
                .clone()
                .run(self.stats.clone(), stopped.clone()),
        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_key_and_file() {
        let cases = [
            (
                "insecure: true\nupstreams: [{url: 'https://h:1'}]\n",
                "`upstreams[0].url`",
            ),
            (
                "insecure: true\nupstreams: [{url: 'http://h:1'}, {url: 'h:2'}]\n",
                "`upstreams[1].url`",
            ),
            (
                "insecure: true\nupstreams: [{url: 'http://h:1'}]\npolicy: [{identities: ['a'], accounts: ['[x']}]\n",
                "`policy[0].accounts[0]`",
            ),
        ];
        for (yaml, key) in cases {
            let config = Config::from_yaml_str(yaml, "gw.yaml").unwrap();
            let e = Gateway::check(&config).unwrap_err().to_string();
            assert!(e.contains("gw.yaml") && e.contains(key), "{yaml}: {e}");
        }
    }
}
