//! The `Cache` stream: the agent's listings, watch events and discovery
//! snapshots come up and are applied to the account's cache; acknowledgements
//! (highest contiguous `seq` held), resume points and resync requests go down.
//!
//! Acks are batched: one per [`DEFAULT_ACK_INTERVAL`] or per
//! [`DEFAULT_ACK_EVERY`] messages, whichever comes first.

use std::sync::Arc;
use std::time::Duration;

use spinlink_proto::v1::{self, cache_down, cache_up};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use crate::accounts::Account;
use crate::cache::Applied;
use crate::handover::Handover;
use crate::ownership::PreviousOwner;
use crate::store::{AccountState, Store};

/// Longest time between receiving a message and acknowledging it.
pub const DEFAULT_ACK_INTERVAL: Duration = Duration::from_millis(100);
/// Messages after which an ack is sent without waiting for the interval.
pub const DEFAULT_ACK_EVERY: u64 = 256;
/// Messages queued towards the agent per cache stream.
pub const DEFAULT_DOWN_CAPACITY: usize = 16;

/// The sending half of a cache stream's responses.
pub type Down = mpsc::Sender<Result<v1::CacheDown, Status>>;

async fn send(down: &Down, msg: cache_down::Msg) -> bool {
    down.send(Ok(v1::CacheDown { msg: Some(msg) }))
        .await
        .is_ok()
}

/// The `ResumeFrom` message for what the cache holds: every completed kind
/// with its resourceVersion. Sent at the start of every stream, empty when
/// nothing is held, so the agent knows at once whether to list or resume.
pub fn resume_from(account: &Account) -> v1::ResumeFrom {
    let cache = account.read_cache();
    let kinds: Vec<v1::KindVersion> = cache
        .kinds()
        .filter(|k| k.resumable())
        .map(|k| v1::KindVersion {
            kind: Some(k.info.clone()),
            resource_version: k.resource_version.clone(),
        })
        .collect();
    v1::ResumeFrom { kinds }
}

/// Applies one message to the account's cache.
pub fn apply(account: &Account, msg: cache_up::Msg) {
    match msg {
        cache_up::Msg::Open(_) | cache_up::Msg::Heartbeat(_) => {}
        cache_up::Msg::SyncStart(s) => {
            if let Some(kind) = s.kind {
                account.write_cache().sync_start(&kind);
            }
        }
        cache_up::Msg::SyncEnd(e) => {
            if let Some(kind) = e.kind {
                let dropped = account.write_cache().sync_end(&kind, &e.resource_version);
                tracing::debug!(account = account.name(), resource = %kind.resource, dropped, "kind synced");
            }
        }
        cache_up::Msg::Event(ev) => match account.write_cache().apply(&ev) {
            Ok(Applied::Upserted | Applied::Deleted | Applied::Unchanged) => {
                account.event_applied()
            }
            Ok(Applied::Bookmark) => {}
            Err(e) => {
                tracing::warn!(account = account.name(), error = %e, "watch event ignored");
            }
        },
        cache_up::Msg::Discovery(d) => account.write_cache().set_discovery(d.documents),
        cache_up::Msg::Synced(_) => account.agent_synced(),
    }
}

/// Serves one cache stream whose `open` (sequence `first_seq`) was checked:
/// when it is the account's first stream here, decides what its cache
/// starts from (`takeover`: the previous owner's snapshot, the cache held
/// here or nothing, see [`crate::handover`]) before telling the agent where
/// to resume, applies
/// every message, acknowledges, and marks the account offline when the last
/// stream ends.
pub async fn run(
    account: Arc<Account>,
    store: Store,
    first_seq: u64,
    takeover: Option<(Arc<Handover>, Option<PreviousOwner>)>,
    mut inbound: Streaming<v1::CacheUp>,
    down: Down,
    shutdown: CancellationToken,
) {
    // Before the numbering starts: a loaded snapshot continues the old
    // owner's, so the agent's replay of what it holds is skipped and what
    // follows is applied.
    if let Some((handover, from)) = &takeover {
        handover.take_over(&account, from.as_ref(), &store).await;
    }
    let (mut highest, _) = account.record_seq(first_seq);
    let mut acked = 0u64;
    let mut since_ack = 1u64;
    if !send(&down, cache_down::Msg::Resume(resume_from(&account))).await {
        return finish(&account, &store).await;
    }
    let mut tick = tokio::time::interval(DEFAULT_ACK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let msg = tokio::select! {
            () = shutdown.cancelled() => {
                if highest > acked {
                    send(&down, cache_down::Msg::Ack(v1::Ack { seq: highest })).await;
                }
                break;
            }
            _ = tick.tick() => {
                if highest > acked || (since_ack > 0 && acked == 0) {
                    if !send(&down, cache_down::Msg::Ack(v1::Ack { seq: highest })).await {
                        break;
                    }
                    acked = highest;
                    since_ack = 0;
                }
                continue;
            }
            msg = inbound.message() => msg,
        };
        let up = match msg {
            Ok(Some(up)) => up,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(account = account.name(), %status, "cache stream ended with an error");
                break;
            }
        };
        let (h, gap) = account.record_seq(up.seq);
        // A message at or below what is already held is the agent replaying
        // its unacked window after a reconnect: it was applied already.
        let duplicate = up.seq <= highest && !gap;
        highest = h;
        if gap {
            // Messages the agent thinks we hold are missing: list again.
            tracing::warn!(
                account = account.name(),
                seq = up.seq,
                "sequence gap; asking for a resync"
            );
            if !send(
                &down,
                cache_down::Msg::Resync(v1::Resync { kinds: Vec::new() }),
            )
            .await
            {
                break;
            }
        }
        if let Some(msg) = up.msg.filter(|_| !duplicate) {
            if let cache_up::Msg::Heartbeat(h) = &msg {
                account.set_api_health(h.api_unreachable_since_unix_millis, &h.api_error);
                let now = chrono::Utc::now().timestamp_millis();
                let beat = v1::Heartbeat {
                    unix_millis: now,
                    ..Default::default()
                };
                if !send(&down, cache_down::Msg::Heartbeat(beat)).await {
                    break;
                }
            }
            apply(&account, msg);
        }
        since_ack += 1;
        if since_ack >= DEFAULT_ACK_EVERY {
            if !send(&down, cache_down::Msg::Ack(v1::Ack { seq: highest })).await {
                break;
            }
            acked = highest;
            since_ack = 0;
        }
    }
    finish(&account, &store).await;
}

async fn finish(account: &Account, store: &Store) {
    if account.cache_closed() {
        tracing::info!(account = account.name(), "account offline (cache kept)");
        if let Err(e) = store
            .set_account_state(account.name(), AccountState::Offline)
            .await
        {
            tracing::warn!(account = account.name(), error = %e, "recording offline state failed");
        }
    }
}
