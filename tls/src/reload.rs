//! TLS material reloaded from its files while a component runs, so a
//! certificate renewed on disk (cert-manager rewriting a mounted Secret) is
//! served without a restart.
//!
//! Each holder reads its files when asked ([`ReloadingServer::check`],
//! [`ReloadingClientCert::check`]; the component polls) and rebuilds when
//! their content changed — content, not modification times, so the atomic
//! `..data` symlink swap of a mounted Secret is seen like any other write.
//! New files that do not build (garbage, a key that does not match, half a
//! rotation) are refused and the material in service stays. New handshakes
//! take the new material; established connections keep theirs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ring::digest;
use rustls::ServerConfig;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use crate::config::{ClientAuth, ServerFiles, provider, server_config};
use crate::pem::{load_certs, load_key};
use crate::{Error, Result};

/// What a check found.
#[derive(Debug)]
pub enum Reload {
    /// The files hold what is in service.
    Unchanged,
    /// New material is in service; the leaf's notAfter (Unix seconds).
    Reloaded {
        /// When the new certificate ends.
        not_after: i64,
    },
    /// The files changed but do not build; the old material stays.
    Refused(Error),
}

/// A digest of files' contents, to tell when they change.
#[derive(Debug)]
struct Seen {
    paths: Vec<PathBuf>,
    digest: Mutex<[u8; 32]>,
}

impl Seen {
    fn new(paths: Vec<PathBuf>) -> Result<Self> {
        let digest = Mutex::new(digest_of(&paths)?);
        Ok(Self { paths, digest })
    }

    /// `None` when the contents changed since last seen (and marks them
    /// seen: in service, or refused once); else what the check found.
    fn take_change(&self) -> Option<Reload> {
        let now = match digest_of(&self.paths) {
            Ok(now) => now,
            Err(e) => return Some(Reload::Refused(e)),
        };
        let mut seen = lock(&self.digest);
        if *seen == now {
            return Some(Reload::Unchanged);
        }
        *seen = now;
        None
    }
}

fn digest_of(paths: &[PathBuf]) -> Result<[u8; 32]> {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for path in paths {
        let bytes = std::fs::read(path).map_err(|source| Error::ReadFile {
            path: path.clone(),
            source,
        })?;
        ctx.update(&(bytes.len() as u64).to_be_bytes());
        ctx.update(&bytes);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn leaf_not_after(certs: &[CertificateDer<'_>], path: &Path) -> Result<i64> {
    let leaf = certs
        .first()
        .ok_or_else(|| Error::NoCertificate(path.to_owned()))?;
    crate::identity::not_after(leaf)
}

/// A server configuration (certificate, key, client CA) rebuilt from its
/// files when they change.
#[derive(Debug)]
pub struct ReloadingServer {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    auth: ClientAuth,
    alpn: Vec<Vec<u8>>,
    seen: Seen,
    current: RwLock<Arc<ServerConfig>>,
}

impl ReloadingServer {
    /// Loads `files` as [`server_config`] does.
    pub fn load(files: ServerFiles<'_>, auth: ClientAuth, alpn: &[&[u8]]) -> Result<Arc<Self>> {
        let mut paths = vec![files.cert.to_owned(), files.key.to_owned()];
        paths.extend(files.client_ca.map(Path::to_owned));
        // Seen before the build: a file changed in between is read again
        // at the first check.
        let seen = Seen::new(paths)?;
        let config = server_config(files, auth, alpn)?;
        Ok(Arc::new(Self {
            cert: files.cert.to_owned(),
            key: files.key.to_owned(),
            client_ca: files.client_ca.map(Path::to_owned),
            auth,
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            seen,
            current: RwLock::new(Arc::new(config)),
        }))
    }

    /// The configuration in service.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// An acceptor for the next handshake.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config())
    }

    /// Reads the files; rebuilds when they changed.
    pub fn check(&self) -> Reload {
        if let Some(unchanged_or_unread) = self.seen.take_change() {
            return unchanged_or_unread;
        }
        let alpn: Vec<&[u8]> = self.alpn.iter().map(Vec::as_slice).collect();
        let files = ServerFiles {
            cert: &self.cert,
            key: &self.key,
            client_ca: self.client_ca.as_deref(),
        };
        let built = server_config(files, self.auth, &alpn).and_then(|config| {
            Ok((
                config,
                leaf_not_after(&load_certs(&self.cert)?, &self.cert)?,
            ))
        });
        match built {
            Ok((config, not_after)) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
                Reload::Reloaded { not_after }
            }
            Err(e) => Reload::Refused(e),
        }
    }
}

/// A client certificate and key presented from their files, re-read when
/// they change; a [`ResolvesClientCert`] for `ClientConfig`.
#[derive(Debug)]
pub struct ReloadingClientCert {
    cert: PathBuf,
    key: PathBuf,
    seen: Seen,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingClientCert {
    /// Loads the certificate chain and key.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>> {
        let seen = Seen::new(vec![cert.to_owned(), key.to_owned()])?;
        let certified = certified(cert, key)?;
        Ok(Arc::new(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            seen,
            current: RwLock::new(Arc::new(certified)),
        }))
    }

    /// Reads the files; takes the new pair when they changed and match.
    pub fn check(&self) -> Reload {
        if let Some(unchanged_or_unread) = self.seen.take_change() {
            return unchanged_or_unread;
        }
        match certified(&self.cert, &self.key) {
            Ok(new) => {
                let not_after = leaf_not_after(&new.cert, &self.cert);
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(new);
                match not_after {
                    Ok(not_after) => Reload::Reloaded { not_after },
                    Err(e) => Reload::Refused(e),
                }
            }
            Err(e) => Reload::Refused(e),
        }
    }
}

fn certified(cert: &Path, key: &Path) -> Result<CertifiedKey> {
    let certs = load_certs(cert)?;
    let key = load_key(key)?;
    let certified = CertifiedKey::from_der(certs, key, &provider())?;
    Ok(certified)
}

impl ResolvesClientCert for ReloadingClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{DevCa, DevPki, Leaf};

    #[test]
    fn a_server_takes_new_files_and_refuses_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::ensure(dir.path(), &[]).unwrap();
        let files = ServerFiles {
            cert: &pki.cert("sidecar"),
            key: &pki.key("sidecar"),
            client_ca: Some(&pki.ca_cert()),
        };
        let tls = ReloadingServer::load(files, ClientAuth::Required, &[b"h2"]).unwrap();
        let first = tls.config();
        assert!(matches!(tls.check(), Reload::Unchanged));
        assert!(Arc::ptr_eq(&first, &tls.config()));

        // A renewed certificate (and key) in place: served from now on.
        let renewed = DevCa::load(dir.path())
            .and_then(|ca| ca.issue(&Leaf::server("sidecar").with_dns("localhost")))
            .unwrap();
        renewed.write(dir.path(), "sidecar").unwrap();
        assert!(matches!(tls.check(), Reload::Reloaded { not_after } if not_after > 0));
        let second = tls.config();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(second.alpn_protocols, vec![b"h2".to_vec()]);

        // Garbage: refused once, the renewed material stays in service.
        std::fs::write(pki.cert("sidecar"), b"not a certificate").unwrap();
        assert!(matches!(tls.check(), Reload::Refused(_)));
        assert!(Arc::ptr_eq(&second, &tls.config()));
        assert!(matches!(tls.check(), Reload::Unchanged));
    }

    #[test]
    fn a_client_certificate_is_presented_from_its_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::ensure(dir.path(), &[]).unwrap();
        let client = ReloadingClientCert::load(&pki.cert("sidecar"), &pki.key("sidecar")).unwrap();
        let before = client.resolve(&[], &[]).unwrap();
        let renewed = DevCa::load(dir.path())
            .and_then(|ca| ca.issue(&Leaf::server("sidecar").with_dns("localhost")))
            .unwrap();
        renewed.write(dir.path(), "sidecar").unwrap();
        assert!(matches!(client.check(), Reload::Reloaded { .. }));
        let after = client.resolve(&[], &[]).unwrap();
        assert_ne!(before.cert[0], after.cert[0]);
        // A key that does not match the certificate is refused.
        let other = DevCa::load(dir.path())
            .and_then(|ca| ca.issue(&Leaf::server("other")))
            .unwrap();
        other.write(dir.path(), "other").unwrap();
        std::fs::copy(pki.key("other"), pki.key("sidecar")).unwrap();
        assert!(matches!(client.check(), Reload::Refused(_)));
        assert_eq!(client.resolve(&[], &[]).unwrap().cert[0], after.cert[0]);
    }
}
