//! Taking sidecar instances out of rotation and back: the active
//! [`HealthChecker`] (every `intervalSeconds` each instance gets a connection,
//! dialled if needed, and one cheap gRPC request; any HTTP/2 answer with
//! status 200, whatever its `grpc-status`, proves the sidecar's server is
//! up), and passive outlier ejection (`consecutiveErrors` streams in a row
//! that could not be opened eject the instance for `ejectionSeconds`, longer
//! each time). The state lives in each [`Instance`]; this module decides.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio_util::sync::CancellationToken;

use super::{Instance, UpstreamSet};
use crate::config::upstreams::HealthCheckConfig;
use crate::engine::link::Fields;

/// Checks every instance of a set, round after round, until shut down.
#[derive(Debug)]
pub struct HealthChecker {
    set: Arc<UpstreamSet>,
    config: HealthCheckConfig,
}

impl HealthChecker {
    /// A checker of `set`'s instances.
    pub fn new(set: Arc<UpstreamSet>, config: HealthCheckConfig) -> Self {
        Self { set, config }
    }

    /// Checks every instance once, all at once; the results are recorded in
    /// the instances (and published by the set).
    pub async fn check_all(&self) {
        let instances = self.set.instances();
        let checks = instances.iter().map(|i| async move {
            let ok = self.check(i).await;
            self.set.record_check(i, ok, &self.config);
        });
        futures::future::join_all(checks).await;
        self.set.refresh();
    }

    /// Runs rounds every `intervalSeconds` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        if self.config.interval_seconds == 0 {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(self.config.interval_seconds));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => self.check_all().await,
            }
        }
    }

    async fn check(&self, instance: &Instance) -> bool {
        let upstream = instance.upstream();
        let target = upstream.target();
        let (scheme, authority) = target.pseudo_fields();
        let fields: Fields = vec![
            (Bytes::from_static(b":method"), Bytes::from_static(b"POST")),
            (Bytes::from_static(b":scheme"), scheme.clone()),
            (Bytes::from_static(b":authority"), authority.clone()),
            (
                Bytes::from_static(b":path"),
                Bytes::copy_from_slice(self.config.path.as_bytes()),
            ),
            (
                Bytes::from_static(b"content-type"),
                Bytes::from_static(b"application/grpc"),
            ),
            (Bytes::from_static(b"te"), Bytes::from_static(b"trailers")),
        ];
        // An empty gRPC message: no compression flag, length 0.
        let body = Full::new(Bytes::from_static(&[0, 0, 0, 0, 0]));
        let timeout = Duration::from_secs(self.config.timeout_seconds.max(1));
        // One bound over the head and the body: a sidecar that answers and
        // never ends the stream fails its check instead of stalling the round.
        let checked = tokio::time::timeout(timeout, async {
            let response = upstream.send(fields, body).await?;
            let status = response.status();
            // Read to the end, so the stream closes cleanly.
            let _ = response.into_body().collect().await;
            Ok::<_, super::Error>(status)
        });
        match checked.await {
            Ok(Ok(status)) => {
                let ok = status == http::StatusCode::OK;
                if !ok {
                    tracing::debug!(upstream = target.url(), %status, "health check failed");
                }
                ok
            }
            Ok(Err(e)) => {
                tracing::debug!(upstream = target.url(), error = %e, "health check failed");
                false
            }
            Err(_) => {
                tracing::debug!(upstream = target.url(), "health check timed out");
                false
            }
        }
    }
}
