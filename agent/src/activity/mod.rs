//! What the agent is doing right now, for the admin port: the watches
//! running ([`watches`], `/watches`) and the relayed requests executing
//! ([`operations`], `/operations`). Both tables are plain registries the
//! working tasks hold a row of; they live in [`crate::metrics::Metrics`] so
//! every task that counts can reach them, and depend on nothing above.

pub mod operations;
pub mod watches;
