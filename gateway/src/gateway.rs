//! [`Gateway`]: the component the CLI builds from a [`Config`], binds and runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::admin::Stats;
use crate::config::Config;
use crate::identity::Policy;
use crate::listener::Listener;
use crate::token::TokenKey;
use crate::tunnel::Shared;
use crate::upstream::{Target, Upstream, UpstreamTls};
use crate::{Error, Result};

/// A bound gateway, ready to [`run`](Gateway::run).
#[derive(Debug)]
pub struct Gateway {
    listener: Listener,
    local_addr: SocketAddr,
    grace: Duration,
    stats: Arc<Stats>,
}

impl Gateway {
    /// Validates `config`, loads its certificates and binds the listener.
    pub async fn bind(config: Config) -> Result<Gateway> {
        config.validate()?;
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
            let server = spinlink_tls::config::server_config(
                spinlink_tls::config::ServerFiles {
                    cert: &files.cert_file,
                    key: &files.key_file,
                    client_ca: Some(&files.client_ca_file),
                },
                spinlink_tls::config::ClientAuth::Required,
                &[spinlink_tls::config::ALPN_H2],
            )
            .map_err(|source| Error::Tls {
                what: "tls",
                source,
            })?;
            Some(TlsAcceptor::from(Arc::new(server)))
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
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            gateway_id: config.gateway_id.clone(),
            policy,
            tokens: TokenKey::generate()?,
            token_ttl: config.token_ttl(),
            upstreams,
            stats: stats.clone(),
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
        tracing::info!(
            gateway_id = %config.gateway_id,
            %local_addr,
            upstreams = config.upstreams.len(),
            policy_rules = config.policy.len(),
            insecure = config.insecure,
            "gateway bound"
        );
        Ok(Gateway {
            listener: Listener::new(tcp, tls, config.identity.sources(), shared),
            local_addr,
            grace: config.shutdown_grace(),
            stats,
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

    /// Serves agents until `shutdown` is cancelled, then lets open
    /// connections finish within the configured grace period.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        self.listener.run(shutdown, self.grace).await;
        tracing::info!("gateway stopped");
        Ok(())
    }
}
