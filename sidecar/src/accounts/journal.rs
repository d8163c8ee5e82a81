//! The relayed-operation journal: every request the facade relays to an
//! agent, or refuses for want of one, with the time of each hop and the
//! outcome, kept in the store ([`crate::store::Store::journal`]) — so the
//! accounts API of any sidecar sharing the store shows an account's history,
//! the owner's or not, and it survives the owner's death. Only what the API
//! shows is kept: method, path, query string, kubectl's command, status,
//! outcome and our own failure message, each cut at [`MAX_FIELD`] bytes;
//! never a body, a header value or a credential. The times are kept to the
//! millisecond; the agent's two are already placed on the relaying
//! sidecar's clock ([`Operation::place_agent_part`]), so every sidecar
//! shows them in hop order.
//!
//! Recording never holds a request up: [`Journal::record`] queues the entry
//! (a bounded queue; a full one drops it and counts
//! `spinlink_sidecar_journal_dropped`) and [`Writer::run`] appends whatever
//! is queued in one transaction, and prunes an account to its newest
//! `accounts.operationHistory` entries once a quarter of that many more
//! were written to it (reads take only the newest, so the few extra rows
//! never show). [`Journal::operations`]
//! first waits for what this sidecar queued, so a client reading the
//! history after its own request sees it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Operation, Outcome};
use crate::store::{self, JournalEntry, Store};

/// Entries queued for the writer; past it they are dropped (and counted).
pub const DEFAULT_QUEUE: usize = 4096;
/// Entries appended in one transaction at most.
pub const DEFAULT_BATCH: usize = 256;
/// The longest path, query string, command or message kept, in bytes.
pub const MAX_FIELD: usize = 2048;
/// How long a read of the history waits for this sidecar's queued entries
/// to be written before it reads what the store has.
pub const FLUSH_WAIT: Duration = Duration::from_secs(2);

enum Msg {
    Entry(Box<JournalEntry>),
    Flush(oneshot::Sender<()>),
}

/// Records operations; cheap to clone.
#[derive(Debug, Clone)]
pub struct Journal {
    tx: mpsc::Sender<Msg>,
    store: Store,
    instance: String,
    keep: usize,
    dropped: Counter,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Entry(e) => f.debug_tuple("Entry").field(&e.request_id).finish(),
            Self::Flush(_) => f.write_str("Flush"),
        }
    }
}

/// Appends queued entries to the store; run it with [`Writer::run`].
#[derive(Debug)]
pub struct Writer {
    rx: mpsc::Receiver<Msg>,
    store: Store,
    keep: i64,
    /// Entries written per account since its last prune; an account not
    /// here is pruned at its first write (after a restart too).
    unpruned: HashMap<String, i64>,
}

/// `s` cut to at most [`MAX_FIELD`] bytes, on a character boundary.
fn bounded(s: &str) -> String {
    if s.len() <= MAX_FIELD {
        return s.to_owned();
    }
    let mut end = MAX_FIELD;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn millis(t: Option<DateTime<Utc>>) -> i64 {
    t.map_or(0, |t| t.timestamp_millis())
}

fn time(ms: i64) -> Option<DateTime<Utc>> {
    (ms > 0)
        .then(|| DateTime::from_timestamp_millis(ms))
        .flatten()
}

impl Journal {
    /// A journal in `store` for sidecar `instance`, keeping the newest
    /// `keep` operations per account, and the writer that fills it;
    /// `dropped` counts entries a full queue refused.
    pub fn new(store: Store, instance: &str, keep: usize, dropped: Counter) -> (Journal, Writer) {
        let (tx, rx) = mpsc::channel(DEFAULT_QUEUE);
        let keep = keep.max(1);
        let writer = Writer {
            rx,
            store: store.clone(),
            keep: i64::try_from(keep).unwrap_or(i64::MAX),
            unpruned: HashMap::new(),
        };
        let journal = Journal {
            tx,
            store,
            instance: instance.to_owned(),
            keep,
            dropped,
        };
        (journal, writer)
    }

    /// Queues `op` of `account` for the store.
    pub fn record(&self, account: &str, op: &Operation) {
        let entry = JournalEntry {
            account: account.to_owned(),
            instance: self.instance.clone(),
            request_id: i64::try_from(op.id).unwrap_or(i64::MAX),
            method: bounded(&op.method),
            path: bounded(&op.path),
            query: bounded(&op.query),
            kubectl_command: bounded(op.kubectl_command.as_deref().unwrap_or_default()),
            status: i64::from(op.status),
            outcome: op.outcome.as_str().to_owned(),
            message: bounded(op.message.as_deref().unwrap_or_default()),
            received_at: op.received.timestamp_millis(),
            sent_at: millis(op.sent_to_agent),
            agent_started_at: op.agent_started.map(|t| t.timestamp_millis()),
            agent_finished_at: op.agent_finished.map(|t| t.timestamp_millis()),
            answered_at: millis(op.answered),
        };
        if self.tx.try_send(Msg::Entry(Box::new(entry))).is_err() {
            self.dropped.inc();
            tracing::debug!(%account, "journal queue full; operation not recorded");
        }
    }

    /// The newest operations of `account` in the store (this sidecar's
    /// queued ones written first), oldest first.
    pub async fn operations(&self, account: &str) -> store::Result<Vec<Operation>> {
        let (done, flushed) = oneshot::channel();
        let wait = async {
            if self.tx.send(Msg::Flush(done)).await.is_ok() {
                let _ = flushed.await;
            }
        };
        if tokio::time::timeout(FLUSH_WAIT, wait).await.is_err() {
            tracing::debug!(%account, "journal not flushed in time; reading what is stored");
        }
        let limit = i64::try_from(self.keep).unwrap_or(i64::MAX);
        let entries = self.store.journaled(account, limit).await?;
        Ok(entries.into_iter().map(operation).collect())
    }

    /// Whether the store knows `account` (some sidecar served it).
    pub async fn known(&self, account: &str) -> store::Result<bool> {
        Ok(self.store.account(account).await?.is_some())
    }
}

/// The API's view of a stored entry.
fn operation(e: JournalEntry) -> Operation {
    Operation {
        id: u64::try_from(e.request_id).unwrap_or_default(),
        instance: e.instance,
        method: e.method,
        path: e.path,
        query: e.query,
        kubectl_command: Some(e.kubectl_command).filter(|c| !c.is_empty()),
        received: time(e.received_at).unwrap_or_default(),
        sent_to_agent: time(e.sent_at),
        agent_started: e.agent_started_at.and_then(time),
        agent_finished: e.agent_finished_at.and_then(time),
        answered: time(e.answered_at),
        status: u16::try_from(e.status).unwrap_or_default(),
        outcome: Outcome::parse(&e.outcome),
        message: Some(e.message).filter(|m| !m.is_empty()),
    }
}

impl Writer {
    /// Appends queued entries until `shutdown`, then what is still queued.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let first = tokio::select! {
                () = shutdown.cancelled() => break,
                msg = self.rx.recv() => match msg {
                    Some(msg) => msg,
                    None => return,
                },
            };
            self.write(first).await;
        }
        self.rx.close();
        while let Some(msg) = self.rx.recv().await {
            self.write(msg).await;
        }
    }

    /// Writes `first` and whatever else is queued now, up to a batch.
    async fn write(&mut self, first: Msg) {
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Entry(e) => batch.push(*e),
                Msg::Flush(done) => flushes.push(done),
            }
            if batch.len() < DEFAULT_BATCH {
                next = self.rx.try_recv().ok();
            }
        }
        if let Err(e) = self.store.journal(&batch).await {
            tracing::warn!(entries = batch.len(), error = %e, "journaling relayed operations failed");
        }
        let mut written: BTreeMap<&str, i64> = BTreeMap::new();
        for e in &batch {
            *written.entry(e.account.as_str()).or_default() += 1;
        }
        let every = (self.keep / 4).max(1);
        for (account, n) in written {
            let due = match self.unpruned.get_mut(account) {
                Some(count) => {
                    *count += n;
                    *count >= every
                }
                None => true,
            };
            if !due {
                continue;
            }
            match self.store.prune_journal(account, self.keep).await {
                Ok(_) => {
                    self.unpruned.insert(account.to_owned(), 0);
                }
                Err(e) => {
                    tracing::warn!(%account, error = %e, "pruning the journal failed");
                }
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: u64, outcome: Outcome) -> Operation {
        Operation {
            id,
            instance: String::new(),
            method: "GET".into(),
            path: format!("/api/v1/namespaces/demo/pods/web-{id}/log"),
            query: "follow=true".into(),
            kubectl_command: Some("kubectl logs".into()),
            received: DateTime::from_timestamp_millis(1_000 + id as i64).unwrap(),
            sent_to_agent: DateTime::from_timestamp_millis(1_100 + id as i64),
            agent_started: DateTime::from_timestamp_millis(1_120 + id as i64),
            agent_finished: DateTime::from_timestamp_millis(1_180 + id as i64),
            answered: DateTime::from_timestamp_millis(1_200 + id as i64),
            status: 200,
            outcome,
            message: None,
        }
    }

    #[tokio::test]
    async fn operations_round_trip_through_the_store_and_are_bounded() {
        let store = Store::open("sqlite::memory:").await.unwrap();
        store
            .upsert_account("prod", "agent", store::AccountState::Online)
            .await
            .unwrap();
        let (journal, writer) = Journal::new(store.clone(), "s1", 3, Counter::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(writer.run(stop.clone()));
        for id in 1..=5 {
            journal.record("prod", &op(id, Outcome::Answered));
        }
        let mut refused = op(6, Outcome::Refused);
        refused.sent_to_agent = None;
        refused.agent_started = None;
        refused.agent_finished = None;
        refused.status = 503;
        refused.message = Some("x".repeat(MAX_FIELD + 10));
        journal.record("prod", &refused);
        // Read right after recording: this sidecar's entries are in.
        let ops = journal.operations("prod").await.unwrap();
        let ids: Vec<u64> = ops.iter().map(|o| o.id).collect();
        assert_eq!(ids, [4, 5, 6], "the newest 3 are kept, oldest first");
        // Every hop, the agent's two included, comes back as recorded.
        assert_eq!(ops[0], {
            let mut o = op(4, Outcome::Answered);
            o.instance = "s1".into();
            o
        });
        assert_eq!(ops[2].outcome, Outcome::Refused);
        assert_eq!(ops[2].sent_to_agent, None);
        assert_eq!((ops[2].agent_started, ops[2].agent_finished), (None, None));
        assert_eq!(ops[2].message.as_ref().unwrap().len(), MAX_FIELD);
        assert!(journal.known("prod").await.unwrap());
        assert!(!journal.known("ghost").await.unwrap());
        // What is still queued at shutdown is written before the writer ends.
        journal.record("prod", &op(7, Outcome::Timeout));
        stop.cancel();
        task.await.unwrap();
        let last = store.journaled("prod", 1).await.unwrap();
        assert_eq!(last[0].request_id, 7);
        assert_eq!(last[0].outcome, "timeout");
    }

    #[test]
    fn fields_are_cut_on_a_character_boundary() {
        let s = "é".repeat(MAX_FIELD);
        let cut = bounded(&s);
        assert!(cut.len() <= MAX_FIELD && cut.len() >= MAX_FIELD - 1);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(bounded("short"), "short");
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts() {
        let store = Store::open("sqlite::memory:").await.unwrap();
        let dropped = Counter::default();
        // No writer runs: the queue fills.
        let (journal, _writer) = Journal::new(store, "s1", 10, dropped.clone());
        for id in 0..(DEFAULT_QUEUE as u64 + 5) {
            journal.record("prod", &op(id, Outcome::Answered));
        }
        assert_eq!(dropped.get(), 5);
    }
}
