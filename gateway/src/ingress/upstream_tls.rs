//! TLS from the gateway to `proxy_pass https://` and `grpc_pass grpcs://`
//! upstreams, from a location's `proxy_ssl_*` / `grpc_ssl_*` settings.
//!
//! Where nginx's defaults are unsafe the gateway differs: an upstream
//! certificate is verified unless the configuration says
//! `proxy_ssl_verify off` in so many words — against
//! `proxy_ssl_trusted_certificate` when given, else the system's roots — and
//! the name checked is `proxy_ssl_name`, else the pass directive's host (the
//! `upstream` block's name for one), as nginx checks it when verifying. SNI
//! is sent only with `proxy_ssl_server_name on`, as nginx.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use spinlink_nginx_compat as nginx;

/// A location's upstream TLS, ready for the connector.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// The client configuration (ALPN is set by the connector).
    pub config: ClientConfig,
    /// The name verified (and sent as SNI when enabled).
    pub name: ServerName<'static>,
}

/// Builds the client side for `t`; `host` is the pass directive's host and
/// `family` `proxy` or `grpc` (for messages naming the directives).
pub fn load(t: &nginx::UpstreamTls, host: &str, family: &str) -> Result<UpstreamTls, String> {
    let provider = spinlink_tls::config::provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(|e| e.to_string())?;
    let builder = if t.verify == Some(false) {
        tracing::warn!(
            directive = format!("{family}_ssl_verify off"),
            upstream = host,
            "upstream certificates are not verified"
        );
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
    } else {
        let roots = match &t.trusted_certificate {
            Some(path) => spinlink_tls::config::root_store(Path::new(path))
                .map_err(|e| format!("{family}_ssl_trusted_certificate {path}: {e}"))?,
            None => system_roots().map_err(|e| {
                format!(
                    "no {family}_ssl_trusted_certificate and no system roots ({e}); \
                     name a CA bundle, or say {family}_ssl_verify off"
                )
            })?,
        };
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("{family}_ssl_trusted_certificate: {e}"))?;
        builder.with_webpki_verifier(verifier)
    };
    let mut config = match (&t.certificate, &t.certificate_key) {
        (Some(cert), Some(key)) => {
            let chain = spinlink_tls::pem::load_certs(Path::new(cert))
                .map_err(|e| format!("{family}_ssl_certificate {cert}: {e}"))?;
            let key_der = spinlink_tls::pem::load_key(Path::new(key))
                .map_err(|e| format!("{family}_ssl_certificate_key {key}: {e}"))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("{family}_ssl_certificate {cert}: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    config.enable_sni = t.server_name;
    let name_text = t.name.as_deref().unwrap_or(host);
    let name = ServerName::try_from(name_text.to_owned()).map_err(|_| {
        format!("\"{name_text}\" is not a name an upstream certificate can be checked against")
    })?;
    Ok(UpstreamTls { config, name })
}

fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(match found.errors.first() {
            Some(e) => e.to_string(),
            None => "none found".to_owned(),
        });
    }
    Ok(roots)
}

/// `proxy_ssl_verify off`: any certificate is taken; the handshake's
/// signatures are still checked, so the peer holds the key it presents.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
