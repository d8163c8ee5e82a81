//! The `spinlink.v1` protocol as last released, generated from its descriptor
//! set (`proto/released/spinlink.v1.binpb`, see the README beside it): the
//! messages and the `Tunnel` client an agent of that release has. Fields and
//! messages added since (`CacheOpen.reports_synced`, `CacheSynced`) are not
//! here, by construction. The test kit's released agent
//! (`tests/support/released_agent.rs`) speaks it to today's gateway and
//! sidecar, in `tests/e2e_released_agent.rs` and `tests/e2e_rolling.rs`.
#![forbid(unsafe_code)]

/// Generated code for package `spinlink.v1`, as released.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("spinlink.v1");
}
