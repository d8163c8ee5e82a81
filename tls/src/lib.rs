//! TLS plumbing shared by spinlink's components: loading certificates and keys
//! from PEM files ([`pem`]), building rustls configurations with the one crypto
//! provider spinlink uses ([`config`]), naming the peer of a connection
//! ([`identity`]), binding tokens to a connection ([`binding`]), and the
//! development PKI that `spinlink dev` and the tests generate ([`dev`]).
//!
//! Start with [`config::server_config`] and [`config::client_config`].
#![forbid(unsafe_code)]

pub mod binding;
pub mod config;
pub mod dev;
pub mod identity;
pub mod pem;
pub mod reload;

use std::path::PathBuf;

/// Why a TLS file or configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A PEM file could not be read.
    #[error("reading {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A PEM file held no certificate.
    #[error("{0}: no certificate found")]
    NoCertificate(PathBuf),
    /// A PEM file held no private key.
    #[error("{0}: no private key found")]
    NoPrivateKey(PathBuf),
    /// A PEM file could not be parsed.
    #[error("{path}: invalid PEM: {message}")]
    InvalidPem {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// rustls refused the certificates, key or settings.
    #[error("TLS configuration refused: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client CA bundle could not be turned into a verifier.
    #[error("client CA bundle refused: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// An encrypted PKCS#8 key could not be decrypted (wrong password,
    /// unsupported scheme) or a password was given for a key that is not
    /// encrypted. Never holds the password.
    #[error("{path}: {message}")]
    KeyDecrypt {
        /// The key file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A certificate could not be parsed as X.509.
    #[error("certificate not parseable: {0}")]
    X509(String),
    /// A development certificate could not be generated.
    #[error("generating development certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A development PKI file could not be written.
    #[error("writing {path}: {source}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
