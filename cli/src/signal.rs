//! The process's one drain signal: SIGTERM or Ctrl-C cancels the token every
//! server and background task holds.

use tokio_util::sync::CancellationToken;

/// Cancels `shutdown` on the first SIGTERM or SIGINT. A second signal exits
/// at once, for operators who do not want to wait for the drain.
pub fn cancel_on_signal(shutdown: CancellationToken) {
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received, draining");
        shutdown.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal received, exiting without draining");
        std::process::exit(130);
    });
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; only process exit stops spinlink");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
