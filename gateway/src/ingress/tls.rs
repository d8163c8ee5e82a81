//! TLS for ingress servers, chosen per connection by SNI as nginx does.
//!
//! Each server with certificates gets its own `rustls::ServerConfig`. Client
//! certificates follow nginx's `ssl_verify_client`: with `on` or `optional`
//! a certificate is *requested* but never required at the TLS layer, and a
//! presented one is only checked for proof of key possession during the
//! handshake ([`RequestAnyCert`]); its chain is verified afterwards
//! ([`ServerTlsConfig::verify_peer`]) and the verdict is enforced per request
//! (400, as nginx answers "No required SSL certificate was sent"). So one
//! listener serves browsers without certificates and agents with them.
//!
//! [`ReloadingServerTls`] re-reads a server's files when asked (the gateway
//! asks every few seconds) and puts new material in service when their
//! content changed and builds; new handshakes get it, established
//! connections keep theirs, and files that do not build are refused with a
//! log line while the old ones keep serving.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use rustls::DigitallySignedStruct;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DistinguishedName, ServerConfig, SignatureScheme};
use spinlink_nginx_compat::{Tls, TlsProtocol, VerifyClient};

/// The result of checking a client certificate chain after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientVerify {
    /// No certificate was presented.
    None,
    /// The chain verified against the server's CA bundle.
    Success,
    /// A certificate was presented but did not verify.
    Failed(String),
}

impl ClientVerify {
    /// nginx's `$ssl_client_verify` text.
    pub fn as_nginx(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Self::None => "NONE".into(),
            Self::Success => "SUCCESS".into(),
            Self::Failed(reason) => format!("FAILED:{reason}").into(),
        }
    }
}

/// One server's TLS configuration.
#[derive(Debug)]
pub struct ServerTlsConfig {
    /// What rustls serves.
    pub config: Arc<ServerConfig>,
    /// Checks presented chains after the handshake; `None` with
    /// `ssl_verify_client off` (no certificate is requested) or
    /// `optional_no_ca` (any certificate is taken as it is).
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    mode: VerifyClient,
}

fn read(path: &str, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(Path::new(path)).map_err(|e| format!("reading {what} {path}: {e}"))
}

/// What [`ReloadingServerTls::reload`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The files are as they were (or unreadable for the moment).
    Unchanged,
    /// New material is in service.
    Reloaded,
    /// The new files do not build; the old material stays.
    Refused(String),
}

/// One server's TLS, reloaded from its files.
#[derive(Debug)]
pub struct ReloadingServerTls {
    tls: Tls,
    http2: bool,
    current: RwLock<Arc<ServerTlsConfig>>,
    /// The files in service, and the last refused.
    seen: Mutex<crate::reload::Seen>,
}

impl ReloadingServerTls {
    /// Loads the server's files (an error names what failed).
    pub fn load(tls: &Tls, http2: bool) -> Result<Self, String> {
        let hash = files_hash(tls)?;
        let config = ServerTlsConfig::load(tls, http2)?;
        Ok(Self {
            tls: tls.clone(),
            http2,
            current: RwLock::new(Arc::new(config)),
            seen: Mutex::new(crate::reload::Seen::new(hash)),
        })
    }

    /// The material in service now.
    pub fn current(&self) -> Arc<ServerTlsConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the files again; a content change that builds replaces the
    /// material. Content, not modification times, so the atomic `..data`
    /// symlink swap of a mounted Secret is seen.
    pub fn reload(&self) -> Reload {
        // A file missing for a moment (mid-rotation) is not a change.
        let Ok(hash) = files_hash(&self.tls) else {
            return Reload::Unchanged;
        };
        if !self.seen().is_new(&hash) {
            return Reload::Unchanged;
        }
        match ServerTlsConfig::load(&self.tls, self.http2) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                self.seen().accept(hash);
                Reload::Reloaded
            }
            Err(e) => {
                self.seen().refuse(hash);
                Reload::Refused(e)
            }
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, crate::reload::Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The certificate file, for log lines.
    pub fn certificate_file(&self) -> &str {
        self.tls
            .certificates
            .first()
            .map_or("", |c| c.certificate.as_str())
    }
}

/// SHA-256 over every file the server's TLS is built from, in order.
fn files_hash(tls: &Tls) -> Result<Vec<u8>, String> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    if let Some(pair) = tls.certificates.first() {
        for (path, what) in [(&pair.certificate, "certificate"), (&pair.key, "key")] {
            let bytes = read(path, what)?;
            ctx.update(&(bytes.len() as u64).to_be_bytes());
            ctx.update(&bytes);
        }
    }
    if let Some(ca) = &tls.client_certificate {
        let bytes = read(ca, "client CA bundle")?;
        ctx.update(&(bytes.len() as u64).to_be_bytes());
        ctx.update(&bytes);
    }
    Ok(ctx.finish().as_ref().to_vec())
}

impl ServerTlsConfig {
    /// Loads the server's files; `http2` offers `h2` in ALPN besides
    /// `http/1.1`.
    pub fn load(tls: &Tls, http2: bool) -> Result<Self, String> {
        let pair = tls
            .certificates
            .first()
            .ok_or_else(|| "no ssl_certificate".to_owned())?;
        let certs = CertificateDer::pem_slice_iter(&read(&pair.certificate, "certificate")?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", pair.certificate))?;
        if certs.is_empty() {
            return Err(format!("{}: no certificate", pair.certificate));
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&pair.key, "key")?)
            .map_err(|e| format!("{}: {e}", pair.key))?;
        let provider = spinlink_tls::config::provider();
        let versions: Vec<&'static rustls::SupportedProtocolVersion> = {
            let mut v = Vec::new();
            if tls.protocols.contains(&TlsProtocol::TlsV1_3) {
                v.push(&rustls::version::TLS13);
            }
            if tls.protocols.contains(&TlsProtocol::TlsV1_2) {
                v.push(&rustls::version::TLS12);
            }
            v
        };
        if versions.is_empty() {
            return Err("ssl_protocols names neither TLSv1.2 nor TLSv1.3".to_owned());
        }
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| e.to_string())?;
        let verifier: Option<Arc<dyn ClientCertVerifier>> = match tls.verify_client {
            VerifyClient::Off | VerifyClient::OptionalNoCa => None,
            VerifyClient::On | VerifyClient::Optional => {
                let path = tls
                    .client_certificate
                    .as_deref()
                    .ok_or_else(|| "ssl_verify_client needs ssl_client_certificate".to_owned())?;
                let mut roots = rustls::RootCertStore::empty();
                for ca in CertificateDer::pem_slice_iter(&read(path, "client CA")?) {
                    let ca = ca.map_err(|e| format!("{path}: {e}"))?;
                    roots.add(ca).map_err(|e| format!("{path}: {e}"))?;
                }
                if roots.is_empty() {
                    return Err(format!("{path}: no CA certificate"));
                }
                Some(
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| format!("{path}: {e}"))?,
                )
            }
        };
        let builder = match (&verifier, tls.verify_client) {
            (_, VerifyClient::Off) => builder.with_no_client_auth(),
            (inner, _) => builder.with_client_cert_verifier(Arc::new(RequestAnyCert {
                inner: inner.clone(),
                schemes: provider
                    .signature_verification_algorithms
                    .supported_schemes(),
                algorithms: provider.signature_verification_algorithms,
            })),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("{}: {e}", pair.certificate))?;
        config.alpn_protocols = if http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Ok(Self {
            config: Arc::new(config),
            verifier,
            mode: tls.verify_client,
        })
    }

    /// Verifies the chain a client presented (leaf first).
    pub fn verify_peer(&self, chain: Option<&[CertificateDer<'static>]>) -> ClientVerify {
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return ClientVerify::None;
        };
        match (&self.verifier, self.mode) {
            (_, VerifyClient::Off) => ClientVerify::None,
            (None, _) => ClientVerify::Success,
            (Some(v), _) => match v.verify_client_cert(leaf, intermediates, UnixTime::now()) {
                Ok(_) => ClientVerify::Success,
                Err(e) => ClientVerify::Failed(e.to_string()),
            },
        }
    }
}

/// Asks for a client certificate, takes any (after checking the handshake
/// signature proves the key), so the chain can be judged per request.
#[derive(Debug)]
struct RequestAnyCert {
    inner: Option<Arc<dyn ClientCertVerifier>>,
    schemes: Vec<SignatureScheme>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestAnyCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.as_ref().map_or(&[], |v| v.root_hint_subjects())
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Judged after the handshake (`verify_peer`), per request.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}
