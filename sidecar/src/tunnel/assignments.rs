//! `Assignments` streams: the sidecar's side of dynamic accounts. The agent
//! (through the gateway, which verified its identity and that the agent id
//! is its `Hello`'s) names its id and zone in `open`; the stream claims the
//! zone's free dynamic accounts for it in the store, sends every account it
//! holds among those its identity may serve ([`allowed_accounts`]; the
//! gateway names them) (`AccountAssigned`, the kubeconfig opened from its
//! seal), then
//! `Synced`, then the changes: found by polling the store every
//! [`DEFAULT_POLL_INTERVAL`](crate::dynamic::DEFAULT_POLL_INTERVAL), at once
//! for changes made on this sidecar. Each poll renews the agent's claims, so
//! an agent keeps its accounts while it has a stream and loses them to
//! another agent of its zone [`DEFAULT_ASSIGNMENT_TTL`]
//! (crate::dynamic::DEFAULT_ASSIGNMENT_TTL) after its last one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use spinlink_proto::v1::{
    AccountAssigned, AccountWithdrawn, AssignmentsDown, AssignmentsSynced, AssignmentsUp,
    Heartbeat, assignments_down,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use crate::dynamic::Dynamic;

/// Messages queued towards the agent.
pub const DEFAULT_DOWN_CAPACITY: usize = 64;
/// Interval of heartbeats towards the agent.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);

fn down(msg: assignments_down::Msg) -> Result<AssignmentsDown, Status> {
    Ok(AssignmentsDown { msg: Some(msg) })
}

/// The accounts the gateway says the agent's identity may serve: its
/// `spinlink-verified-accounts` header, a JSON array of globs in which `*`
/// does not cross `/` (as in the gateway's policy). No other account's
/// kubeconfig is assigned to it.
pub fn allowed_accounts(header: &str) -> Result<globset::GlobSet, Status> {
    let bad = || Status::invalid_argument("spinlink-verified-accounts is not a list of globs");
    let patterns: Vec<String> = serde_json::from_str(header).map_err(|_| bad())?;
    let mut set = globset::GlobSetBuilder::new();
    for pattern in &patterns {
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|_| bad())?;
        set.add(glob);
    }
    set.build().map_err(|_| bad())
}

/// Serves one stream until the agent goes, the sender fails or `stop`.
pub async fn run(
    dynamic: Arc<Dynamic>,
    agent_id: String,
    zone: String,
    allowed: globset::GlobSet,
    mut inbound: Streaming<AssignmentsUp>,
    tx: mpsc::Sender<Result<AssignmentsDown, Status>>,
    stop: CancellationToken,
) {
    let mut changes = dynamic.subscribe();
    let mut poll = tokio::time::interval(dynamic.poll_interval());
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heartbeat = tokio::time::interval(DEFAULT_HEARTBEAT);
    heartbeat.tick().await;
    // Sent accounts and the `updated_at` they were sent with.
    let mut sent: BTreeMap<String, i64> = BTreeMap::new();
    let mut synced = false;
    // Accounts whose kubeconfig did not open, at that `updated_at`: logged
    // once, tried again when they change.
    let mut unopened: BTreeMap<String, i64> = BTreeMap::new();
    loop {
        changes.borrow_and_update();
        match dynamic
            .store()
            .claim_dynamic(&agent_id, &zone, dynamic.ttl(), |name| {
                allowed.is_match(name)
            })
            .await
        {
            Ok(rows) => {
                let mut now: BTreeMap<String, i64> = BTreeMap::new();
                for row in &rows {
                    now.insert(row.name.clone(), row.updated_at);
                    if sent.get(&row.name) == Some(&row.updated_at)
                        || unopened.get(&row.name) == Some(&row.updated_at)
                    {
                        if unopened.contains_key(&row.name) {
                            now.remove(&row.name);
                        }
                        continue;
                    }
                    let kubeconfig = match dynamic.kubeconfig(row) {
                        Ok(k) => k,
                        Err(e) => {
                            // Sealed with another key: never sent, loudly.
                            tracing::error!(account = %row.name, agent = %agent_id, error = %e,
                                "dynamic account not assigned: its kubeconfig does not open");
                            unopened.insert(row.name.clone(), row.updated_at);
                            now.remove(&row.name);
                            continue;
                        }
                    };
                    let assigned = AccountAssigned {
                        name: row.name.clone(),
                        kubeconfig,
                        context: row.context.clone(),
                        namespaces: row.namespaces.clone(),
                    };
                    tracing::info!(account = %row.name, agent = %agent_id, zone = %zone,
                        "dynamic account assigned");
                    if tx
                        .send(down(assignments_down::Msg::Assigned(assigned)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                for name in sent.keys().filter(|n| !now.contains_key(*n)) {
                    tracing::info!(account = %name, agent = %agent_id, "dynamic account withdrawn");
                    let withdrawn = AccountWithdrawn { name: name.clone() };
                    if tx
                        .send(down(assignments_down::Msg::Withdrawn(withdrawn)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                sent = now;
                if !synced {
                    synced = true;
                    if tx
                        .send(down(assignments_down::Msg::Synced(AssignmentsSynced {})))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            // The next poll tries again; the agent keeps what it has.
            Err(e) => tracing::warn!(agent = %agent_id, error = %e, "dynamic accounts not read"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            _ = poll.tick() => {}
            r = changes.changed() => if r.is_err() { return },
            _ = heartbeat.tick() => {
                let beat = Heartbeat {
                unix_millis: chrono::Utc::now().timestamp_millis(),
                ..Default::default()
            };
                if tx.send(down(assignments_down::Msg::Heartbeat(beat))).await.is_err() {
                    return;
                }
            }
            up = inbound.message() => match up {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    tracing::info!(agent = %agent_id, "assignments stream closed");
                    return;
                }
            },
        }
    }
}
