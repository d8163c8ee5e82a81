//! The REST APIs on the facade port, beside the Kubernetes API the facade
//! serves: the accounts and agents API ([`accounts`], `/v1/accounts`,
//! `/v1/agents`), the dynamic accounts API ([`dynamic`],
//! `/v1/dynamic-accounts` and the writes under `/v1/accounts`) and Armory's
//! accounts API over the same dynamic accounts ([`armory`], `/armory/…`).
//! Each answers from the module it serves ([`crate::accounts`],
//! [`crate::dynamic`]); the facade routes requests here
//! ([`crate::facade::Facade::handle`]).

pub mod accounts;
pub mod armory;
pub mod dynamic;
