//! Dynamic accounts: the `Assignments` stream an agent with
//! `dynamicAccounts.enabled` opens after `Hello` on every connection. The
//! sidecar sends the accounts assigned to this agent (`AccountAssigned`: a
//! kubeconfig held in memory only), their withdrawal, and `Synced` once it
//! has named every account assigned when the stream opened. The agent adds
//! and removes them through the same path as a reloaded configuration
//! (`Agent::apply`); accounts from the configuration file take precedence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use spinlink_proto::headers;
use spinlink_proto::v1::{
    AccountAssigned, AssignmentsDown, AssignmentsOpen, AssignmentsUp, assignments_down,
    assignments_up,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::config::{AccountConfig, Config, InlineKubeconfig};
use crate::connection::session::Session;

/// Up messages queued; the agent sends only `open`.
const UP_QUEUE: usize = 2;

/// One open `Assignments` stream. Dropping it closes the stream.
pub struct Stream {
    /// Keeps the request side open.
    _up: mpsc::Sender<AssignmentsUp>,
    down: tonic::Streaming<AssignmentsDown>,
    /// Assigned accounts named since the stream opened.
    named: BTreeSet<String>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("named", &self.named)
            .finish_non_exhaustive()
    }
}

/// What the sidecar asked for.
#[derive(Debug)]
pub enum Change {
    /// Serve this account (an assigned source).
    Assigned(Box<AccountConfig>),
    /// Stop serving this account.
    Withdrawn(String),
    /// Every account assigned when the stream opened has been named: the
    /// others were withdrawn meanwhile.
    Synced(BTreeSet<String>),
}

/// Opens `Assignments` on the session's connection for `zone`, the first
/// message (`open`) sent at once.
pub async fn open(session: &Session, zone: &str) -> Result<Stream, tonic::Status> {
    let (tx, rx) = mpsc::channel(UP_QUEUE);
    let open = AssignmentsUp {
        msg: Some(assignments_up::Msg::Open(AssignmentsOpen {
            agent_id: session.agent_id().to_owned(),
            zone: zone.to_owned(),
        })),
    };
    tx.try_send(open)
        .map_err(|_| tonic::Status::internal("assignments queue full"))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let agent_id = session
        .agent_id()
        .parse()
        .map_err(|_| tonic::Status::invalid_argument("agent id is not a header value"))?;
    request.metadata_mut().insert(headers::AGENT_ID, agent_id);
    let down = session.client().assignments(request).await?.into_inner();
    Ok(Stream {
        _up: tx,
        down,
        named: BTreeSet::new(),
    })
}

impl Stream {
    /// The next change; `Err` when the stream ended or failed.
    pub async fn next(&mut self) -> Result<Change, tonic::Status> {
        loop {
            let Some(message) = self.down.message().await? else {
                return Err(tonic::Status::unavailable("assignments stream ended"));
            };
            match message.msg {
                Some(assignments_down::Msg::Assigned(a)) => {
                    self.named.insert(a.name.clone());
                    return Ok(Change::Assigned(Box::new(account_of(a))));
                }
                Some(assignments_down::Msg::Withdrawn(w)) => {
                    self.named.remove(&w.name);
                    return Ok(Change::Withdrawn(w.name));
                }
                Some(assignments_down::Msg::Synced(_)) => {
                    return Ok(Change::Synced(self.named.clone()));
                }
                Some(assignments_down::Msg::Heartbeat(_)) | None => {}
            }
        }
    }
}

/// The account an assignment describes: its kubeconfig in memory, the
/// defaults for everything else (relay policy included).
pub fn account_of(assigned: AccountAssigned) -> AccountConfig {
    AccountConfig {
        name: assigned.name,
        kubeconfig_inline: Some(InlineKubeconfig(Arc::new(assigned.kubeconfig))),
        context: (!assigned.context.is_empty()).then_some(assigned.context),
        namespaces: assigned.namespaces,
        ..AccountConfig::default()
    }
}

/// `file` with the assigned accounts added, except those the file defines
/// itself (returned second: they are refused).
pub fn merged(file: &Config, assigned: &BTreeMap<String, AccountConfig>) -> (Config, Vec<String>) {
    let mut config = file.clone();
    let mut shadowed = Vec::new();
    for (name, account) in assigned {
        if file.kubernetes.accounts.iter().any(|a| &a.name == name) {
            shadowed.push(name.clone());
        } else {
            config.kubernetes.accounts.push(account.clone());
        }
    }
    (config, shadowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_account(name: &str) -> AccountConfig {
        AccountConfig {
            name: name.into(),
            service_account: true,
            ..AccountConfig::default()
        }
    }

    #[test]
    fn file_accounts_take_precedence_over_assigned_ones() {
        let mut file = Config::default();
        file.kubernetes.accounts = vec![file_account("static")];
        let mut assigned = BTreeMap::new();
        for name in ["static", "dynamic"] {
            assigned.insert(
                name.to_owned(),
                account_of(AccountAssigned {
                    name: name.into(),
                    kubeconfig: b"s3cr3t".to_vec(),
                    context: String::new(),
                    namespaces: vec!["ns".into()],
                }),
            );
        }
        let (config, shadowed) = merged(&file, &assigned);
        assert_eq!(shadowed, ["static"]);
        let names: Vec<_> = config.kubernetes.accounts.iter().map(|a| &a.name).collect();
        assert_eq!(names, ["static", "dynamic"]);
        assert!(config.kubernetes.accounts[0].service_account);
        let dynamic = &config.kubernetes.accounts[1];
        assert!(dynamic.kubeconfig_inline.is_some());
        assert_eq!(dynamic.namespaces, ["ns"]);
        assert_eq!(dynamic.context, None);
    }
}
