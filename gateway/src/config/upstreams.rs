//! The sidecar side of the configuration: how each `upstreams[]` URL
//! becomes instances ([`Discovery`]) and `upstreamPool` (bounded load, DNS
//! refresh, [`HealthCheckConfig`], [`OutlierConfig`]).

use std::time::Duration;

use serde::Deserialize;

/// Default load factor c: no instance takes more than 1.25 times the mean.
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;
/// Default seconds between DNS re-resolutions.
pub const DEFAULT_DNS_REFRESH_SECONDS: u64 = 30;

/// `upstreamPool` in the gateway configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamPoolConfig {
    /// Bounded-load factor c (at least 1): no instance holds more than
    /// `ceil(c · mean)` accounts.
    pub load_factor: f64,
    /// Seconds between re-resolutions of `discovery: dns` upstreams.
    pub dns_refresh_seconds: u64,
    /// Active health checks.
    pub health_check: HealthCheckConfig,
    /// Passive outlier ejection.
    pub outlier: OutlierConfig,
}

impl Default for UpstreamPoolConfig {
    fn default() -> Self {
        Self {
            load_factor: DEFAULT_LOAD_FACTOR,
            dns_refresh_seconds: DEFAULT_DNS_REFRESH_SECONDS,
            health_check: HealthCheckConfig::default(),
            outlier: OutlierConfig::default(),
        }
    }
}

impl UpstreamPoolConfig {
    /// Checks the values serde cannot; `Err((key, message))`.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if !(self.load_factor.is_finite() && self.load_factor >= 1.0) {
            return Err(("loadFactor", "must be a number of at least 1"));
        }
        if self.dns_refresh_seconds == 0 {
            return Err(("dnsRefreshSeconds", "must be at least 1"));
        }
        let h = &self.health_check;
        if h.timeout_seconds == 0 {
            return Err(("healthCheck.timeoutSeconds", "must be at least 1"));
        }
        if h.unhealthy_threshold == 0 {
            return Err(("healthCheck.unhealthyThreshold", "must be at least 1"));
        }
        if h.healthy_threshold == 0 {
            return Err(("healthCheck.healthyThreshold", "must be at least 1"));
        }
        if !h.path.starts_with('/') || h.path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(("healthCheck.path", "must be a path starting with `/`"));
        }
        if self.outlier.consecutive_errors > 0 && self.outlier.ejection_seconds == 0 {
            return Err(("outlier.ejectionSeconds", "must be at least 1"));
        }
        Ok(())
    }
}

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

/// How a configured upstream URL becomes instances (`upstreams[].discovery`):
/// `static`, `dns`, or `{endpointSlices: {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Discovery {
    /// The URL is one instance.
    #[default]
    Static,
    /// Every address the URL's host resolves to is an instance; resolved
    /// again every `upstreamPool.dnsRefreshSeconds`.
    Dns,
    /// Every ready endpoint of a Service's EndpointSlices is an instance
    /// (watched); the URL gives the scheme, the TLS name and the port used
    /// when the slices name none.
    EndpointSlices(EndpointSliceConfig),
}

// By hand: serde's externally tagged enums are YAML tags (`!dns`) in
// serde_norway; plain `dns` and a one-key map read better.
impl<'de> Deserialize<'de> for Discovery {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        const NAMES: &[&str] = &["static", "dns", "endpointSlices"];
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Discovery;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`static`, `dns` or `{endpointSlices: {...}}`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Discovery, E> {
                match v {
                    "static" => Ok(Discovery::Static),
                    "dns" => Ok(Discovery::Dns),
                    other => Err(E::unknown_variant(other, NAMES)),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Discovery, A::Error> {
                use serde::de::Error as _;
                let Some(key) = map.next_key::<String>()? else {
                    return Err(A::Error::custom("expected `endpointSlices: {...}`"));
                };
                if key != "endpointSlices" {
                    return Err(A::Error::unknown_field(&key, &["endpointSlices"]));
                }
                let config = map.next_value::<EndpointSliceConfig>()?;
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(A::Error::unknown_field(&extra, &[]));
                }
                Ok(Discovery::EndpointSlices(config))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `discovery: {endpointSlices: {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointSliceConfig {
    /// The Service whose slices are watched (label
    /// `kubernetes.io/service-name`). Required.
    pub service: String,
    /// Its namespace; the client's default namespace when absent.
    pub namespace: Option<String>,
    /// The slice port to dial, by name; the only port when absent.
    pub port_name: Option<String>,
    /// Kubeconfig file of the cluster; in-cluster (or `KUBECONFIG`) when absent.
    pub kubeconfig: Option<std::path::PathBuf>,
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
