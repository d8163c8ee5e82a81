//! The client side of the peer port: how a sidecar forwards a facade request
//! to the owner of its account and fetches the cache of an account it takes
//! over. With `peer.tls` it presents its own certificate and accepts only a
//! server whose certificate chains to `peer.tls.caFile` and names one of
//! `peer.tls.peerIdentities` ([`SidecarVerifier`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use spinlink_tls::config::{provider, root_store};
use spinlink_tls::reload::ReloadingClientCert;

use crate::config::PeerTlsConfig;
use crate::http::body::BoxError;
use crate::identity::{Listed, listed};

/// How long connecting to a peer may take: an unreachable pod address
/// otherwise waits out the kernel's SYN retries, minutes.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The body of a request to a peer.
pub type PeerBody = UnsyncBoxBody<Bytes, BoxError>;

/// A client of other sidecars' peer ports; cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    inner: hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, PeerBody>,
    /// The certificate presented, re-read from its files while the sidecar
    /// runs (`None` in plain HTTP).
    cert: Option<Arc<ReloadingClientCert>>,
}

impl Default for Client {
    fn default() -> Self {
        Self::plaintext()
    }
}

impl Client {
    /// Plain HTTP only (`peer.insecure`): an `https://` peer fails its
    /// handshake, as there is nothing to trust.
    pub fn plaintext() -> Self {
        let tls = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("the provider supports the default protocol versions")
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        Self::build(tls, false)
    }

    /// Mutual TLS as `tls` says: this sidecar's certificate presented, the
    /// peer's checked against the CA and the identities.
    pub fn tls(tls: &PeerTlsConfig) -> spinlink_tls::Result<Self> {
        let verifier = SidecarVerifier::new(tls)?;
        let cert = ReloadingClientCert::load(&tls.cert_file, &tls.key_file)?;
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_cert_resolver(cert.clone());
        Ok(Self {
            cert: Some(cert),
            ..Self::build(config, true)
        })
    }

    /// The certificate presented, for reloading.
    pub fn certificate(&self) -> Option<&Arc<ReloadingClientCert>> {
        self.cert.as_ref()
    }

    fn build(tls: ClientConfig, https_only: bool) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(DEFAULT_CONNECT_TIMEOUT));
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
        let connector = if https_only {
            builder.https_only().enable_http1().wrap_connector(http)
        } else {
            builder.https_or_http().enable_http1().wrap_connector(http)
        };
        Self {
            inner: hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .build(connector),
            cert: None,
        }
    }

    /// Sends `req` to the peer its URI names.
    pub async fn request(
        &self,
        req: Request<PeerBody>,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        self.inner.request(req).await
    }
}

/// Accepts a peer's server certificate when it chains to the CA and names
/// one of the sidecar identities — the same check the peer port makes of
/// its clients. The address dialled is not checked against the
/// certificate's names: peers are dialled at their pod addresses, which no
/// certificate an issuer signs ahead of time can name; the identity is what
/// says the other end is a sidecar.
#[derive(Debug)]
pub struct SidecarVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    identities: BTreeSet<String>,
}

impl SidecarVerifier {
    /// Trusts `tls.caFile` for the identities `tls.peerIdentities`.
    pub fn new(tls: &PeerTlsConfig) -> spinlink_tls::Result<Self> {
        let roots = Arc::new(root_store(&tls.ca_file)?);
        Ok(Self {
            webpki: WebPkiServerVerifier::builder_with_provider(roots, provider()).build()?,
            identities: tls.peer_identities.iter().cloned().collect(),
        })
    }
}

impl ServerCertVerifier for SidecarVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain (and validity, usage) before the name, so
        // a name mismatch means the chain is good.
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(_)
            | Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => {}
            Err(e) => return Err(e),
        }
        match listed(&self.identities, Some(std::slice::from_ref(end_entity))) {
            Listed::Yes(_) => Ok(ServerCertVerified::assertion()),
            Listed::No(id) => {
                tracing::warn!(peer = %server_name.to_str(), identity = id.as_deref().unwrap_or("<none>"),
                    "a peer's certificate is not one of peer.tls.peerIdentities; not speaking to it");
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::ApplicationVerificationFailure,
                ))
            }
            Listed::NoCertificate => Err(rustls::Error::NoCertificatesPresented),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests;
