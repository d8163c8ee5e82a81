//! Background churn: creates, updates and deletes configmaps at a steady rate, bounded
//! in the number of objects, so watches, caches and pagination see constant change.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::ChurnConfig;
use crate::store::Sim;

impl Sim {
    /// Spawns the churn task; it stops when `shutdown` is cancelled or after
    /// `config.max_writes` writes.
    pub fn spawn_churn(
        &self,
        config: ChurnConfig,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let sim = self.clone();
        tokio::spawn(async move { sim.churn(config, shutdown).await })
    }

    async fn churn(&self, config: ChurnConfig, shutdown: CancellationToken) {
        let ns = config.namespace.as_str();
        if !self.namespace_exists(ns) {
            let _ = self
                .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        }
        let mut rng = StdRng::seed_from_u64(config.seed);
        let mut ticker =
            tokio::time::interval(config.interval.max(std::time::Duration::from_millis(1)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut writes = 0u64;
        let slots = config.max_objects.max(1);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if config.max_writes.is_some_and(|max| writes >= max) {
                return;
            }
            let name = format!("churn{}", rng.random_range(0..slots));
            let exists = self.get("configmaps", Some(ns), &name).is_some();
            let result = if !exists {
                self.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns, "labels": {"churn": "true"}},
                    "data": {"i": writes.to_string()}}))
            } else if rng.random_bool(0.75) {
                self.upsert(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns, "labels": {"churn": "true"}},
                    "data": {"i": writes.to_string()}}))
            } else {
                self.delete("configmaps", Some(ns), &name)
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "churn write refused");
            }
            writes += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn churn_is_bounded_and_stops() {
        let sim = Sim::new();
        let before = sim.resource_version();
        let config = ChurnConfig {
            namespace: "c".into(),
            interval: Duration::from_millis(10),
            max_objects: 5,
            max_writes: Some(200),
            ..Default::default()
        };
        sim.spawn_churn(config, CancellationToken::new())
            .await
            .unwrap();
        // One namespace plus 200 writes, each a new resourceVersion.
        assert_eq!(sim.resource_version(), before + 201);
        assert!(sim.list("configmaps", Some("c")).len() <= 5);
    }
}
