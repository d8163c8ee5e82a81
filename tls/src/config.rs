//! rustls configurations for spinlink's listeners and clients, all built on
//! the one crypto provider ([`provider`]) so the dependency graph holds one.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::Result;
use crate::pem::{load_certs, load_key, load_key_with_password};

/// ALPN protocol id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN protocol id of HTTP/1.1.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The crypto provider every spinlink TLS configuration uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a server asks of its clients' certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    Off,
    /// A certificate is verified when presented, but not required.
    Optional,
    /// A certificate signed by the client CA bundle is required.
    Required,
}

/// Files a TLS server is built from.
#[derive(Debug, Clone, Copy)]
pub struct ServerFiles<'a> {
    /// PEM certificate chain, leaf first.
    pub cert: &'a Path,
    /// PEM private key.
    pub key: &'a Path,
    /// PEM bundle of CAs that sign client certificates.
    pub client_ca: Option<&'a Path>,
}

/// Builds a server configuration: the certificate and key from `files`, client
/// certificates checked against `files.client_ca` as `auth` says, and the
/// given ALPN protocols in order of preference.
pub fn server_config(
    files: ServerFiles<'_>,
    auth: ClientAuth,
    alpn: &[&[u8]],
) -> Result<ServerConfig> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (auth, files.client_ca) {
        (ClientAuth::Off, _) | (_, None) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let roots = Arc::new(root_store(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let verifier = if auth == ClientAuth::Optional {
                verifier.allow_unauthenticated().build()?
            } else {
                verifier.build()?
            };
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(load_certs(files.cert)?, load_key(files.key)?)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Files a TLS client is built from.
#[derive(Debug, Clone, Copy)]
pub struct ClientFiles<'a> {
    /// PEM bundle of CAs that sign the server's certificate.
    pub ca: &'a Path,
    /// The client's own certificate and key, when it presents one.
    pub identity: Option<(&'a Path, &'a Path)>,
}

/// Builds a client configuration that trusts `files.ca`, presents
/// `files.identity` when given, and offers the given ALPN protocols.
pub fn client_config(files: ClientFiles<'_>, alpn: &[&[u8]]) -> Result<ClientConfig> {
    client_config_with_key_password(files, None, alpn)
}

/// As [`client_config`], the identity's key being an encrypted PKCS#8 key
/// when `key_password` is given (see [`load_key_with_password`]).
pub fn client_config_with_key_password(
    files: ClientFiles<'_>,
    key_password: Option<&str>,
    alpn: &[&[u8]],
) -> Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(root_store(files.ca)?);
    let mut config = match files.identity {
        Some((cert, key)) => builder.with_client_auth_cert(
            load_certs(cert)?,
            load_key_with_password(key, key_password)?,
        )?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Reads a CA bundle into a root store.
pub fn root_store(path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert)?;
    }
    Ok(roots)
}
