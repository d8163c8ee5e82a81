//! spinlink gateway: the mTLS edge that agents dial.
//!
//! A request's path through the crate follows the folders:
//! [`listener`] accepts TCP, terminates mTLS ([`tls`]) and names the peer
//! ([`identity`]) and the connection (its TLS binding); [`tunnel`] serves
//! the agent's connection on the HTTP/2 [`engine`] and routes each stream by
//! gRPC path — `Hello` is answered with channel tokens ([`token`]) for the
//! accounts the [`identity::Policy`] allows, `Cache` and `Relay` streams are
//! checked against their token and carried frame by frame to the sidecar
//! [`route`] picks, over the pooled HTTP/2 connections of [`upstream`].
//! [`ingress`] serves Spinnaker's UI/API (and gRPC) routes from an
//! nginx-style model on the same listener. Each connection lives on one of
//! the [`workers`], with that worker's own upstream connections. [`admin`]
//! serves the counters of [`stats`], with `/healthz` and `/readyz`, on the
//! admin port. [`fuzz`] holds the bodies of the fuzz targets.
//!
//! Layers, each naming only those below it: the leaves [`cidr`], [`stats`],
//! [`limits`], [`reload`], [`route`] and [`token`], [`config`] (plain data
//! over [`cidr`]) and [`workers`] (over [`limits`]); the [`engine`]; [`tls`], [`identity`], [`ingress`]
//! and [`upstream`]; [`tunnel`]; [`listener`]; [`admin`]; and the
//! [`Gateway`] that builds them all (`scripts/module-cycles.py` checks that
//! no modules name each other in a circle).
//!
//! Start with [`Gateway::bind`] and [`Config`].
#![forbid(unsafe_code)]

pub mod admin;
pub mod cidr;
pub mod config;
pub mod engine;
pub mod fuzz;
mod gateway;
pub mod identity;
pub mod ingress;
pub mod limits;
pub mod listener;
pub mod reload;
pub mod route;
pub mod stats;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod tls;
pub mod token;
pub mod tunnel;
pub mod upstream;
pub mod workers;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use config::Config;
pub use gateway::Gateway;

/// Why the gateway could not be configured, started or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file could not be read.
    #[error("reading config {path}: {source}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is not valid YAML of the expected shape (the message
    /// names the offending key and its line).
    #[error("config {origin}: {source}")]
    ParseConfig {
        /// The file (or other origin) the YAML came from.
        origin: String,
        /// The parser's error.
        #[source]
        source: serde_norway::Error,
    },
    /// A configuration value is not acceptable.
    #[error("config {origin}: `{key}`: {message}")]
    InvalidConfig {
        /// The file (or other origin) the YAML came from.
        origin: String,
        /// The key, as written in YAML (e.g. `policy[0].identities[1]`).
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A TLS certificate, key or bundle could not be loaded.
    #[error("TLS setup for {what}: {source}")]
    Tls {
        /// Which TLS configuration failed (`upstreamTls`; the listener's
        /// `tls` files are reported as [`Error::InvalidConfig`] naming the file).
        what: &'static str,
        /// The TLS error.
        #[source]
        source: spinlink_tls::Error,
    },
    /// The channel token key could not be generated.
    #[error(transparent)]
    Token(#[from] token::Error),
    /// The listen address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The worker threads could not be started.
    #[error("starting {count} worker threads: {source}")]
    Workers {
        /// How many were asked for.
        count: usize,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
