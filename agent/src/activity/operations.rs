//! The relayed requests executing right now, one row each, for the admin
//! port's `/operations` (Armory's "currently executing operations"). The
//! relay loop registers a row when it hands a request to its task; the
//! [`OperationRow`] lives in that task, so the row goes when the request
//! finishes, is cancelled by the sidecar, or its stream ends. The table
//! lives in [`crate::metrics::Metrics`], beside the watches'.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// One executing request, as `/operations` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// `{account}:{id}`, the id the sidecar gave the request; unique while
    /// it runs (the sidecar's journal names it the same way, after its
    /// instance).
    pub id: String,
    /// The account.
    pub account: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`…).
    pub verb: String,
    /// The HTTP method.
    pub method: String,
    /// The request path (the query is left out: it can be long).
    pub path: String,
    /// When the agent took it, Unix milliseconds.
    pub started_unix_millis: i64,
}

/// The table of executing requests. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct OperationTable {
    rows: Arc<Mutex<BTreeMap<u64, Operation>>>,
    next: Arc<AtomicU64>,
}

impl OperationTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Operation>> {
        self.rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `operation`; it goes when the handle drops.
    pub fn register(&self, operation: Operation) -> OperationRow {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, operation);
        OperationRow {
            table: self.clone(),
            key,
        }
    }

    /// Every executing request, oldest first.
    pub fn snapshot(&self) -> Vec<Operation> {
        // Keys grow with registration, so the map's order is the age order.
        self.lock().values().cloned().collect()
    }
}

/// One executing request's row; removed from the table on drop.
#[derive(Debug)]
pub struct OperationRow {
    table: OperationTable,
    key: u64,
}

impl Drop for OperationRow {
    fn drop(&mut self) {
        self.table.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(account: &str, id: u64) -> Operation {
        Operation {
            id: format!("{account}:{id}"),
            account: account.into(),
            verb: "watch".into(),
            method: "GET".into(),
            path: "/api/v1/pods".into(),
            started_unix_millis: 1,
        }
    }

    #[test]
    fn rows_live_as_long_as_their_handles_oldest_first() {
        let table = OperationTable::default();
        let a = table.register(op("dev", 7));
        let b = table.register(op("prod", 1));
        let ids: Vec<String> = table.snapshot().into_iter().map(|o| o.id).collect();
        assert_eq!(ids, ["dev:7", "prod:1"]);
        drop(a);
        assert_eq!(table.snapshot(), [op("prod", 1)]);
        drop(b);
        assert!(table.snapshot().is_empty());
    }
}
