//! The spinlink agent: watches Kubernetes clusters with kube-rs and carries
//! them to the gateway over one outbound mTLS HTTP/2 connection.
//!
//! Start reading at [`Agent::run`]: it connects ([`connection`]), says
//! `Hello`, and per granted account runs a `Cache` stream ([`cache`]: kinds
//! from discovery ([`kinds`]), paginated lists and watches, the acked outbox)
//! and a `Relay` stream ([`relay`]: API requests from the sidecar, checked
//! against the account's relay policy), reconnecting with
//! [`backoff::Backoff`] when anything breaks. Secret values are skipped by
//! [`scrub`] while parsing, so they never leave; [`metrics`] counts it all.
#![forbid(unsafe_code)]

pub mod activity;
pub mod admin;
mod agent;
pub mod apiserver;
pub mod assignments;
pub mod backoff;
pub mod cache;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod incluster;
pub mod kinds;
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod relay;
pub mod reload;
pub mod scrub;
pub mod state;

pub use agent::Agent;
pub use config::{AccountConfig, Config, GatewayConfig};
pub use connection::connect;
pub use state::{AccountState, AgentState};

/// Why the agent, or one of its connections, stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is not usable.
    #[error(transparent)]
    Config(#[from] config::Error),
    /// The gateway URL cannot be dialled.
    #[error("gateway.url {url:?}: {message}")]
    GatewayUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// TLS material could not be loaded.
    #[error("gateway TLS configuration: {0}")]
    Tls(#[from] spinlink_tls::Error),
    /// The connection to the gateway could not be made.
    #[error("connecting to the gateway: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// `Hello` failed.
    #[error("Hello failed: {0}")]
    Hello(#[source] tonic::Status),
    /// The gateway refused an account when its token was renewed.
    #[error("account {account}: refused: {reason}")]
    Refused {
        /// The account.
        account: String,
        /// The gateway's reason.
        reason: String,
    },
    /// A stream could not be opened.
    #[error("account {account}: opening {stream} stream: {source}")]
    OpenStream {
        /// The account.
        account: String,
        /// `cache` or `relay`.
        stream: &'static str,
        /// The gateway's (or sidecar's) answer.
        #[source]
        source: tonic::Status,
    },
    /// An open stream failed.
    #[error("account {account}: {stream} stream failed: {source}")]
    StreamFailed {
        /// The account.
        account: String,
        /// `cache` or `relay`.
        stream: &'static str,
        /// The error.
        #[source]
        source: tonic::Status,
    },
    /// The other side ended a stream.
    #[error("account {account}: {stream} stream closed by the gateway")]
    StreamClosed {
        /// The account.
        account: String,
        /// `cache` or `relay`.
        stream: &'static str,
    },
    /// A token could not be put into stream metadata.
    #[error("account {account}: token or name not valid as metadata")]
    Metadata {
        /// The account.
        account: String,
    },
    /// An account's kubeconfig or in-cluster configuration is not usable.
    #[error("account {account}: {message}")]
    KubeConfig {
        /// The account.
        account: String,
        /// What failed.
        message: String,
    },
    /// A request to the cluster failed.
    #[error("account {account}: Kubernetes API: {source}")]
    Kube {
        /// The account.
        account: String,
        /// The kube-rs error.
        #[source]
        source: kube::Error,
    },
    /// Discovery documents could not be fetched.
    #[error("account {account}: discovery: {message}")]
    Discovery {
        /// The account.
        account: String,
        /// What failed.
        message: String,
    },
    /// The admin port could not be bound.
    #[error("admin.listen {addr}: {source}")]
    AdminBind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A background task panicked or was cancelled.
    #[error("task failed: {0}")]
    Task(String),
}

impl Error {
    /// The gateway answered a `Hello` with "retry later"
    /// (`RESOURCE_EXHAUSTED`: the identity's Hello rate, which every
    /// connection of the identity shares). The connection it came on is
    /// sound: only that Hello is to be asked again, later.
    pub fn is_hello_rate_refusal(&self) -> bool {
        matches!(self, Error::Hello(s) if s.code() == tonic::Code::ResourceExhausted)
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
