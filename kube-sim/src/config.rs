//! Settings of the simulator ([`SimConfig`]) and of its churn generator ([`ChurnConfig`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default number of write events retained for watch replay.
pub const DEFAULT_HISTORY: usize = 1000;
/// Default interval between watch bookmarks.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);
/// Default cap on a page size a client may ask for (larger `limit`s are clamped).
pub const DEFAULT_MAX_PAGE: usize = 5000;
/// Default Kubernetes minor version reported by `/version`.
///
/// The recorded fixture says 1.36, but the Google Cloud SDK `kubectl` dispatcher picks a
/// client matching the server's minor version and only ships 1.27–1.33; reporting
/// 1.33 keeps it on a shipped binary (see the crate docs).
pub const DEFAULT_REPORTED_MINOR: u32 = 33;
/// Default time the simulated kubelet takes to stop a pod deleted with a grace
/// period (at most the grace period itself): long enough that clients see the pod
/// terminating and wait for it, short enough for tests.
pub const DEFAULT_POD_TERMINATION: Duration = Duration::from_secs(1);
/// Default churn interval.
pub const DEFAULT_CHURN_INTERVAL: Duration = Duration::from_millis(200);
/// Default bound on the number of configmaps churn keeps alive.
pub const DEFAULT_CHURN_MAX_OBJECTS: usize = 50;

/// Settings of a [`Sim`](crate::Sim).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Write events retained for watch replay and consistent pagination; older
    /// resourceVersions get 410 Expired.
    pub history: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    #[serde(with = "duration_ms")]
    pub bookmark_interval: Duration,
    /// Largest page a LIST returns, whatever `limit` asks.
    pub max_page: usize,
    /// Minor version reported by `/version` (`None`: the fixture's 1.36 as recorded).
    pub reported_minor: Option<u32>,
    /// How long a pod deleted with a grace period stays terminating before the
    /// simulated kubelet removes it (at most its grace period).
    #[serde(with = "duration_ms")]
    pub pod_termination: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            history: DEFAULT_HISTORY,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            max_page: DEFAULT_MAX_PAGE,
            reported_minor: Some(DEFAULT_REPORTED_MINOR),
            pod_termination: DEFAULT_POD_TERMINATION,
        }
    }
}

impl SimConfig {
    /// Sets the retained history size.
    #[must_use]
    pub fn history(mut self, history: usize) -> Self {
        self.history = history;
        self
    }

    /// Sets how long a gracefully deleted pod stays terminating.
    #[must_use]
    pub fn pod_termination(mut self, termination: Duration) -> Self {
        self.pod_termination = termination;
        self
    }

    /// Sets the bookmark interval.
    #[must_use]
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// Sets the reported minor version (`None`: as recorded, 1.36).
    #[must_use]
    pub fn reported_minor(mut self, minor: Option<u32>) -> Self {
        self.reported_minor = minor;
        self
    }
}

/// Settings of [`Sim::spawn_churn`](crate::Sim::spawn_churn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChurnConfig {
    /// Namespace the churned configmaps live in (created if missing).
    pub namespace: String,
    /// Time between two writes.
    #[serde(with = "duration_ms")]
    pub interval: Duration,
    /// Seed of the random choices, for reproducible runs.
    pub seed: u64,
    /// At most this many churned configmaps exist at once.
    pub max_objects: usize,
    /// Stop after this many writes (`None`: until shut down).
    pub max_writes: Option<u64>,
}

impl Default for ChurnConfig {
    fn default() -> Self {
        ChurnConfig {
            namespace: "churn".into(),
            interval: DEFAULT_CHURN_INTERVAL,
            seed: 1,
            max_objects: DEFAULT_CHURN_MAX_OBJECTS,
            max_writes: None,
        }
    }
}

mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}
