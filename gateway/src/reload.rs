//! Polling of files that are reloaded when their content changes (the
//! listener's certificate, ingress certificates, the JWKS): [`poll_blocking`]
//! runs a check on an interval off the runtime's workers, [`Seen`] remembers
//! which content is in service and which was refused. A leaf: it names no
//! other module of the crate.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Hashes of a reloadable file set: the content in service and the content
/// last refused (so a bad file is refused, and logged, once).
#[derive(Debug)]
pub(crate) struct Seen {
    current: Vec<u8>,
    refused: Option<Vec<u8>>,
}

impl Seen {
    /// Content `current` is in service.
    pub(crate) fn new(current: Vec<u8>) -> Self {
        Self {
            current,
            refused: None,
        }
    }

    /// Whether `hash` is neither in service nor already refused.
    pub(crate) fn is_new(&self, hash: &[u8]) -> bool {
        self.current != hash && self.refused.as_deref() != Some(hash)
    }

    /// `hash` is now in service.
    pub(crate) fn accept(&mut self, hash: Vec<u8>) {
        *self = Self::new(hash);
    }

    /// `hash` did not load.
    pub(crate) fn refuse(&mut self, hash: Vec<u8>) {
        self.refused = Some(hash);
    }
}

/// Runs `check` every `interval` until `shutdown`, on the blocking pool:
/// file reads and certificate or key parsing block, so they stay off the
/// runtime's worker threads.
pub(crate) async fn poll_blocking<F>(
    interval: Duration,
    shutdown: CancellationToken,
    what: &'static str,
    check: F,
) where
    F: Fn() + Clone + Send + 'static,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if tokio::task::spawn_blocking(check.clone()).await.is_err() {
            tracing::warn!(what, "reload check panicked");
        }
    }
}
