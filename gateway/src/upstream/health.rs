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
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{Instance, UpstreamSet};
use crate::relay::link::Fields;

/// Default seconds between health checks of each instance.
pub const DEFAULT_INTERVAL_SECONDS: u64 = 5;
/// Default seconds one check may take.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 2;
/// Default failed checks in a row that take an instance out.
pub const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 2;
/// Default passed checks in a row that bring it back.
pub const DEFAULT_HEALTHY_THRESHOLD: u32 = 1;
/// Default path of the check request: the standard gRPC health service.
pub const DEFAULT_PATH: &str = "/grpc.health.v1.Health/Check";
/// Default failed stream opens in a row that eject an instance.
pub const DEFAULT_CONSECUTIVE_ERRORS: u32 = 5;
/// Default first ejection time; each further ejection adds as much again.
pub const DEFAULT_EJECTION_SECONDS: u64 = 30;
/// Longest ejection.
pub const MAX_EJECTION_SECONDS: u64 = 300;

/// `upstreamPool.healthCheck`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheckConfig {
    /// Seconds between checks of each instance; 0 turns checks off.
    pub interval_seconds: u64,
    /// Seconds one check may take (dial included).
    pub timeout_seconds: u64,
    /// Failed checks in a row that take an instance out of rotation.
    pub unhealthy_threshold: u32,
    /// Passed checks in a row that bring it back.
    pub healthy_threshold: u32,
    /// gRPC path of the check request (an empty message is sent).
    pub path: String,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        Self {
            interval_seconds: DEFAULT_INTERVAL_SECONDS,
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            unhealthy_threshold: DEFAULT_UNHEALTHY_THRESHOLD,
            healthy_threshold: DEFAULT_HEALTHY_THRESHOLD,
            path: DEFAULT_PATH.to_owned(),
        }
    }
}

/// `upstreamPool.outlier`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct OutlierConfig {
    /// Streams in a row that could not be opened on an instance before it
    /// is ejected; 0 turns ejection off.
    pub consecutive_errors: u32,
    /// Seconds of the first ejection; the n-th lasts n times as long (at
    /// most [`MAX_EJECTION_SECONDS`]).
    pub ejection_seconds: u64,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_errors: DEFAULT_CONSECUTIVE_ERRORS,
            ejection_seconds: DEFAULT_EJECTION_SECONDS,
        }
    }
}

impl OutlierConfig {
    /// How long the `n`-th ejection (from 1) lasts.
    pub fn ejection(&self, n: u32) -> Duration {
        Duration::from_secs(
            self.ejection_seconds
                .saturating_mul(u64::from(n.max(1)))
                .min(MAX_EJECTION_SECONDS.max(self.ejection_seconds)),
        )
    }
}

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
        let fields: Fields = vec![
            (Bytes::from_static(b":method"), Bytes::from_static(b"POST")),
            (
                Bytes::from_static(b":scheme"),
                Bytes::copy_from_slice(target.scheme().as_str().as_bytes()),
            ),
            (
                Bytes::from_static(b":authority"),
                Bytes::copy_from_slice(target.authority().as_str().as_bytes()),
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejections_grow_to_a_bound() {
        let c = OutlierConfig::default();
        assert_eq!(c.ejection(1), Duration::from_secs(30));
        assert_eq!(c.ejection(3), Duration::from_secs(90));
        assert_eq!(c.ejection(100), Duration::from_secs(MAX_EJECTION_SECONDS));
    }
}
