//! The admin HTTP port ([`server::AdminServer`]): `/healthz`, `/readyz` and
//! `/metrics`, serving the counters of [`crate::stats`].

pub mod server;
