//! kube-sim: a simulated Kubernetes API server for spinlink's dev mode, tests and
//! benchmarks.
//!
//! It answers what spinlink's agent (kube-rs `watcher` and raw requests) and real
//! kubectl 1.27–1.33 ask, the way a real kube-apiserver 1.36 answers: discovery and
//! OpenAPI served from documents recorded from a real server (`fixtures/`), CRUD with
//! strategic merge and server-side apply, watches with bookmarks and 410 Expired,
//! selectors, pagination, `Table` output and `metav1.Status` errors.
//!
//! Start reading at [`Sim`] (the state: `store/`) and [`Server`] (HTTP: `server/`).
//! Served kinds are listed in [`resources`].
//!
//! About kubectl versions: `/usr/bin/kubectl` from the Google Cloud SDK is a
//! dispatcher that runs the `kubectl.1.XX` matching the server's minor version.
//! By default kube-sim reports 1.33 (see [`config::DEFAULT_REPORTED_MINOR`]);
//! [`SimConfig::reported_minor`] set to `None` reports the recorded 1.36.

#![forbid(unsafe_code)]
// `Status` (a full `metav1.Status`) is the error of every API operation, as the public
// interface specifies; failures are the cold path, so its size does not matter.
#![allow(clippy::result_large_err)]

mod churn;
pub mod config;
mod demo;
pub mod error;
mod fixtures;
mod kubeconfig;
pub mod patch;
pub mod resources;
pub mod seed;
mod server;
mod store;

pub use config::{ChurnConfig, SimConfig};
pub use error::{Error, Result, Status, StatusCause, StatusDetails};
pub use kubeconfig::write_kubeconfig;
pub use server::{
    ALPN, MAX_STREAMS_PER_CONNECTION, OpenConnections, Server, derived_group_version,
};
/// Selectors, Tables and the protobuf encoding are the shared Kubernetes API semantics of `spinlink-kube-api`.
pub use spinlink_kube_api::{protobuf, selector, table};
pub use store::{EventType, SYSTEM_NAMESPACES, Sim};
