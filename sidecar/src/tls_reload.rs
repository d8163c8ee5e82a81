//! The sidecar's certificates, reloaded from their files while it runs: the
//! tunnel's server certificate (what gateways verify), the peer port's, and
//! the client certificate it presents to other sidecars. Every
//! [`RELOAD_INTERVAL`] each is checked ([`spinlink_tls::reload`]); new
//! material serves new handshakes, refused files leave the old material in
//! service with one warning, and the expiry gauge follows what is served.

use std::sync::Arc;
use std::time::Duration;

use spinlink_tls::reload::{Reload, ReloadingClientCert, ReloadingServer};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How often the files are read: cert-manager renews well ahead of expiry,
/// so seconds are plenty, and reading three small files costs nothing.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Material that reloads.
#[derive(Debug, Clone)]
pub enum Reloading {
    /// A listener's server configuration.
    Server(Arc<ReloadingServer>),
    /// A client certificate presented.
    Client(Arc<ReloadingClientCert>),
}

impl Reloading {
    fn check(&self) -> Reload {
        match self {
            Self::Server(s) => s.check(),
            Self::Client(c) => c.check(),
        }
    }
}

/// Checks every item (named by the `listener` label of
/// `spinlink_sidecar_certificate_not_after_seconds`) until `stop`.
pub async fn run(items: Vec<(&'static str, Reloading)>, metrics: Metrics, stop: CancellationToken) {
    if items.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate: the files were just loaded
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        check_all(&items, &metrics);
    }
}

/// One round of checks.
pub fn check_all(items: &[(&'static str, Reloading)], metrics: &Metrics) {
    for (what, item) in items {
        match item.check() {
            Reload::Unchanged => {}
            Reload::Reloaded { not_after } => {
                tracing::info!(certificate = what, not_after, "certificate reloaded");
                if matches!(item, Reloading::Server(_)) {
                    metrics.certificate(what, not_after);
                }
            }
            Reload::Refused(e) => {
                tracing::warn!(certificate = what, error = %e,
                    "new certificate files refused; the current ones stay in service");
            }
        }
    }
}
