//! The listener's TLS material, reloaded from disk while the gateway runs.
//!
//! [`ServerTls`] holds the current `rustls::ServerConfig` (certificate, key
//! and client CA bundle) behind a lock; every accepted connection takes the
//! config current at that moment, so a reload changes what new handshakes see
//! and leaves established connections alone. [`TlsReloader`] reads the three
//! files every few seconds and rebuilds when their content hash changes — a
//! content hash, not a modification time, so Kubernetes' atomic `..data`
//! symlink swap of a mounted Secret is seen too. New files that do not build a
//! valid config (garbage, a key that does not match, a half-written rotation)
//! are refused with one log line and the old material stays in service.
//!
//! With client certificates required, every handshake ends with TLS 1.3
//! session tickets ([`tickets`]) any gateway serving the same material can
//! open; [`ServerTls::knows_ticket`] checks one read from a ClientHello
//! ([`client_hello`]) before the handshake, for admission.

pub mod client_hello;
pub mod tickets;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use ring::digest;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::TlsConfig;
use crate::stats::Stats;

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the material (e.g. key and certificate do not match).
    #[error("building the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client CA bundle could not make a verifier.
    #[error("client CA bundle: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The three files' bytes as read at one moment.
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Vec<u8>,
}

impl Material {
    fn read(files: &TlsConfig) -> Result<Self> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| Error::Read {
                path: path.to_owned(),
                source,
            })
        };
        Ok(Self {
            cert: read(&files.cert_file)?,
            key: read(&files.key_file)?,
            client_ca: read(&files.client_ca_file)?,
        })
    }

    fn hash(&self) -> [u8; 32] {
        let mut ctx = digest::Context::new(&digest::SHA256);
        for part in [&self.cert, &self.key, &self.client_ca] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// Builds the server config and finds the leaf's notAfter.
    fn build(&self, files: &TlsConfig, alpn: &[Vec<u8>]) -> Result<(ServerConfig, i64)> {
        let pem = |path: &Path, message: String| Error::Pem {
            path: path.to_owned(),
            message,
        };
        let certs = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem(&files.cert_file, e.to_string()))?;
        let leaf = certs
            .first()
            .ok_or_else(|| pem(&files.cert_file, "no certificate".into()))?;
        let not_after = not_after(leaf).ok_or_else(|| {
            pem(
                &files.cert_file,
                "leaf certificate is not valid X.509".into(),
            )
        })?;
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| pem(&files.key_file, e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&self.client_ca) {
            let ca = ca.map_err(|e| pem(&files.client_ca_file, e.to_string()))?;
            roots.add(ca)?;
        }
        if roots.is_empty() {
            return Err(pem(&files.client_ca_file, "no CA certificate".into()));
        }
        let provider = spinlink_tls::config::provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        // Only with JWT bootstrap configured: a certificate, if sent, must
        // still verify; without one the `Hello` must carry a bootstrap JWT.
        let verifier = if files.client_certificate_optional {
            verifier.allow_unauthenticated().build()?
        } else {
            verifier.build()?
        };
        let versions: &[&rustls::SupportedProtocolVersion] = match files.min_version {
            crate::config::TlsVersion::V1_3 => &[&rustls::version::TLS13],
            crate::config::TlsVersion::V1_2 => rustls::DEFAULT_VERSIONS,
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)?;
        config.alpn_protocols = alpn.to_vec();
        // Resumption only where a ticket proves a verified certificate: with
        // JWT bootstrap a session may have none, and the listener must not
        // admit its ticket ahead of strangers.
        if !files.client_certificate_optional {
            config.ticketer = Arc::new(tickets::Tickets::new(&[&self.key, &self.client_ca]));
        }
        Ok((config, not_after))
    }
}

/// The leaf's notAfter in Unix seconds.
fn not_after(leaf: &CertificateDer<'_>) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// What a reload check did.
#[derive(Debug)]
pub enum Reload {
    /// The files did not change.
    Unchanged,
    /// New material is in service.
    Reloaded,
    /// The files changed but were refused; the old material stays.
    Refused(Error),
}

struct State {
    hash: [u8; 32],
    not_after: i64,
    // Hash of the last refused content, so a bad file is logged once rather
    // than on every check.
    refused: Option<[u8; 32]>,
}

/// The listener's current TLS configuration.
pub struct ServerTls {
    files: TlsConfig,
    alpn: Vec<Vec<u8>>,
    current: RwLock<Arc<ServerConfig>>,
    state: Mutex<State>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_file", &self.files.cert_file)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files (an error here stops start-up) and offers `alpn`.
    pub fn load(files: &TlsConfig, alpn: &[&[u8]], stats: Arc<Stats>) -> Result<Self> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let material = Material::read(files)?;
        let (config, not_after) = material.build(files, &alpn)?;
        let tls = Self {
            files: files.clone(),
            alpn,
            current: RwLock::new(Arc::new(config)),
            state: Mutex::new(State {
                hash: material.hash(),
                not_after,
                refused: None,
            }),
            stats,
        };
        tls.update_expiry();
        Ok(tls)
    }

    /// An acceptor with the configuration current now.
    pub fn acceptor(&self) -> TlsAcceptor {
        let config = self.current.read().unwrap_or_else(|e| e.into_inner());
        TlsAcceptor::from(config.clone())
    }

    /// Whether `ticket`, read from a ClientHello, is a session ticket the
    /// current material issued and still in date: the peer finished an
    /// mTLS handshake with this deployment within the last hour or two.
    pub fn knows_ticket(&self, ticket: &[u8]) -> bool {
        let config = self.current.read().unwrap_or_else(|e| e.into_inner());
        config.ticketer.enabled() && config.ticketer.decrypt(ticket).is_some()
    }

    /// The serving certificate's notAfter, Unix seconds.
    pub fn not_after(&self) -> i64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .not_after
    }

    /// Reads the files and puts new material in service when it changed and
    /// is valid.
    pub fn reload(&self) -> Reload {
        let result = self.reload_inner();
        self.update_expiry();
        if !matches!(result, Reload::Unchanged) {
            self.stats.notify();
        }
        result
    }

    fn reload_inner(&self) -> Reload {
        let material = match Material::read(&self.files) {
            Ok(m) => m,
            // A file missing for a moment (mid-rotation) is not a change.
            Err(e) => {
                tracing::debug!(error = %e, "TLS files not readable; keeping current ones");
                return Reload::Unchanged;
            }
        };
        let hash = material.hash();
        {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.hash == hash || state.refused == Some(hash) {
                return Reload::Unchanged;
            }
        }
        match material.build(&self.files, &self.alpn) {
            Ok((config, not_after)) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                *state = State {
                    hash,
                    not_after,
                    refused: None,
                };
                self.stats
                    .metrics()
                    .cert_reloads
                    .get_or_create(&crate::stats::metrics::ResultLabel { result: "ok" })
                    .inc();
                tracing::info!(
                    cert = %self.files.cert_file.display(),
                    not_after,
                    "TLS certificate reloaded"
                );
                Reload::Reloaded
            }
            Err(e) => {
                self.state.lock().unwrap_or_else(|e| e.into_inner()).refused = Some(hash);
                self.stats
                    .metrics()
                    .cert_reloads
                    .get_or_create(&crate::stats::metrics::ResultLabel { result: "failed" })
                    .inc();
                tracing::error!(
                    cert = %self.files.cert_file.display(),
                    error = %e,
                    "new TLS files refused; still serving the previous certificate"
                );
                Reload::Refused(e)
            }
        }
    }

    fn update_expiry(&self) {
        let now = crate::token::unix_seconds(SystemTime::now()) as f64;
        self.stats
            .metrics()
            .cert_expiry
            .set(self.not_after() as f64 - now);
        self.stats.metrics().cert_not_after.set(self.not_after());
    }
}

/// Checks the TLS files every `interval` until shutdown.
#[derive(Debug)]
pub struct TlsReloader {
    tls: Arc<ServerTls>,
    interval: Duration,
}

impl TlsReloader {
    /// A reloader of `tls`.
    pub fn new(tls: Arc<ServerTls>, interval: Duration) -> Self {
        Self { tls, interval }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let tls = self.tls;
        crate::reload::poll_blocking(self.interval, shutdown, "TLS files", move || {
            tls.reload();
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use spinlink_tls::dev::{DevCa, DevPki, Leaf};

    use super::*;

    fn files(pki: &DevPki) -> TlsConfig {
        TlsConfig {
            cert_file: pki.cert("gateway"),
            key_file: pki.key("gateway"),
            client_ca_file: pki.ca_cert(),
            ..TlsConfig::default()
        }
    }

    #[test]
    fn reload_takes_valid_files_and_refuses_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::ensure(dir.path(), &["a1"]).unwrap();
        let stats = Arc::new(Stats::default());
        let tls = ServerTls::load(&files(&pki), &[b"h2"], stats.clone()).unwrap();
        assert!(matches!(tls.reload(), Reload::Unchanged));
        let expiry = stats.metrics().cert_expiry.get();
        assert!(expiry > 86_400.0, "{expiry}");
        let before = Arc::as_ptr(&tls.current.read().unwrap().clone());

        std::fs::write(pki.cert("gateway"), b"not a certificate").unwrap();
        assert!(matches!(tls.reload(), Reload::Refused(_)));
        // Logged once: the same bad content is not "changed" again.
        assert!(matches!(tls.reload(), Reload::Unchanged));
        assert_eq!(Arc::as_ptr(&tls.current.read().unwrap().clone()), before);

        let ca = DevCa::load(&pki.dir).unwrap();
        let issued = ca
            .issue(&Leaf::server("gateway").with_dns("localhost"))
            .unwrap();
        std::fs::write(pki.cert("gateway"), &issued.cert_pem).unwrap();
        // The old key does not match the new certificate: refused.
        assert!(matches!(tls.reload(), Reload::Refused(_)));
        std::fs::write(pki.key("gateway"), &issued.key_pem).unwrap();
        assert!(matches!(tls.reload(), Reload::Reloaded));
        assert_ne!(Arc::as_ptr(&tls.current.read().unwrap().clone()), before);
    }
}
