//! Hot reload of the configuration file. [`ConfigWatcher`] reads the file
//! every `reloadIntervalSeconds` and hashes its content and that of every
//! `kubeconfigFile` it names — through the paths, so the atomic `..data`
//! symlink swap of a mounted ConfigMap or Secret is seen like any other
//! change, and a kubeconfig rewritten in place (rotated credentials)
//! restarts its account. New content that parses and validates is handed to the
//! agent, which applies the account changes (see `Agent::apply`); a bad file
//! is refused with one log line and the running configuration stays. An
//! Armory agent's file is watched with its `armory-agent-local.yaml`
//! override.

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
        let last = read(&path).map(|r| r.hash);
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

    /// The new configuration, if the file or a kubeconfig file it names
    /// changed and it is valid.
    fn check(&mut self) -> Option<Config> {
        let Some(Read { config, hash }) = read(&self.path) else {
            // Mid-swap or removed: the running configuration stays.
            debug!(file = %self.path.display(), "configuration file unreadable; keeping the running one");
            return None;
        };
        if self.last.as_ref() == Some(&hash) {
            return None;
        }
        self.last = Some(hash);
        match config {
            Ok(config) => Some(config),
            Err(e) => {
                warn!(file = %self.path.display(), error = %e, "configuration change refused; the running configuration stays");
                self.metrics.reload("refused");
                None
            }
        }
    }
}

/// The configuration file as read now.
struct Read {
    config: crate::config::Result<Config>,
    /// SHA-256 of the file's text, then of each kubeconfig file it names.
    hash: Vec<u8>,
}

fn read(path: &std::path::Path) -> Option<Read> {
    // An Armory file's override is read with it, and is part of the hash.
    let sources = crate::config::Sources::read(path).ok()?;
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    digest.update(sources.text.as_bytes());
    if let Some((_, local)) = &sources.local {
        digest.update(b"\0");
        digest.update(local.as_bytes());
    }
    let mut hash = digest.finish().as_ref().to_vec();
    // Warnings were logged when the agent started.
    let config = sources.load().map(|loaded| {
        let mut config = loaded.config;
        config.read_kubeconfig_digests();
        for account in &config.kubernetes.accounts {
            // A kubeconfig that cannot be read counts as a change too.
            hash.extend(account.kubeconfig_digest.as_deref().unwrap_or(b"-"));
        }
        config
    });
    Some(Read { config, hash })
}

#[cfg(test)]
mod tests;
