//! Hot reload of the configuration file. [`ConfigWatcher`] reads the file
//! every `reloadIntervalSeconds` and hashes its content — through the path,
//! so the atomic `..data` symlink swap of a mounted ConfigMap is seen like
//! any other change. New content that parses and validates is handed to the
//! agent, which applies the account changes (see `Agent::apply`); a bad file
//! is refused with one log line and the running configuration stays.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::config::Config;
use crate::metrics::Metrics;

/// New configurations queued for the agent; the watcher waits when full.
pub const RELOAD_QUEUE: usize = 1;

/// Watches one configuration file.
#[derive(Debug)]
pub struct ConfigWatcher {
    path: PathBuf,
    interval: Duration,
    metrics: Metrics,
    /// Hash of the content last seen (applied or refused).
    last: Option<Vec<u8>>,
}

impl ConfigWatcher {
    /// A watcher of `path`, whose current content is the running
    /// configuration.
    pub fn new(path: PathBuf, interval: Duration, metrics: Metrics) -> Self {
        let last = read_hash(&path).map(|(_, h)| h);
        Self {
            path,
            interval,
            metrics,
            last,
        }
    }

    /// Polls until `shutdown`, sending each new valid configuration.
    pub async fn run(mut self, tx: mpsc::Sender<Config>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if let Some(config) = self.check()
                && tx.send(config).await.is_err()
            {
                return;
            }
        }
    }

    /// The new configuration, if the file changed and is valid.
    fn check(&mut self) -> Option<Config> {
        let Some((text, hash)) = read_hash(&self.path) else {
            // Mid-swap or removed: the running configuration stays.
            debug!(file = %self.path.display(), "configuration file unreadable; keeping the running one");
            return None;
        };
        if self.last.as_ref() == Some(&hash) {
            return None;
        }
        self.last = Some(hash);
        let origin = self.path.display().to_string();
        match Config::from_yaml_str(&text, &origin) {
            Ok(mut config) => {
                config.file = Some(self.path.clone());
                Some(config)
            }
            Err(e) => {
                warn!(file = %origin, error = %e, "configuration change refused; the running configuration stays");
                self.metrics.reload("refused");
                None
            }
        }
    }
}

fn read_hash(path: &std::path::Path) -> Option<(String, Vec<u8>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let hash = ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .to_vec();
    Some((text, hash))
}
