//! Errors: the `metav1.Status` every API failure becomes, and the crate's own [`Error`].
//!
//! API operations fail with a [`Status`] (from `spinlink-kube-api`) whose `reason`,
//! `code`, `details` and `message` wording match what a real kube-apiserver answers
//! (see `fixtures/errors/`). Everything that is not an API answer (binding, I/O) is an
//! [`Error`].

/// Errors of the simulator itself (not API answers).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Accepting or serving a connection failed.
    #[error("serving a connection failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The TLS handshake with a client failed.
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] std::io::Error),
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use spinlink_kube_api::status::{Status, StatusCause, StatusDetails};
