//! Reading an account's `Relay` stream: every message the agent sends up
//! goes to the [`RelayHandle`] of the requests it answers; when the stream
//! ends the handle is detached from the account and what still waits fails.

use std::sync::Arc;

use spinlink_proto::v1;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use crate::accounts::Account;
use crate::relay::RelayHandle;

/// Serves one relay stream until it ends or `shutdown`: routes the agent's
/// messages to the waiting requests, then detaches and fails what is left.
pub async fn run(
    account: Arc<Account>,
    handle: RelayHandle,
    mut inbound: Streaming<v1::RelayUp>,
    shutdown: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            () = shutdown.cancelled() => break,
            msg = inbound.message() => msg,
        };
        let up = match msg {
            Ok(Some(up)) => up,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(account = account.name(), %status, "relay stream ended with an error");
                break;
            }
        };
        if let Some(msg) = up.msg {
            let drain = matches!(msg, v1::relay_up::Msg::Drain(_));
            handle.deliver(msg);
            if drain {
                // New requests go to the account's newest stream; this one
                // ends once it has answered what it carries.
                account.detach_relay(handle.serial());
                tracing::info!(
                    account = account.name(),
                    in_flight = handle.in_flight(),
                    "relay stream draining"
                );
            }
        }
    }
    account.detach_relay(handle.serial());
    handle.fail_all();
    tracing::info!(account = account.name(), "relay stream closed");
}
