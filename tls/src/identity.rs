//! Naming the peer of a mutually authenticated connection from its verified
//! leaf certificate.

use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{Error, Result};

/// Where in a certificate an identity is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentitySource {
    /// The first URI subject alternative name (e.g. `spiffe://…/agent/a1`).
    UriSan,
    /// The first DNS subject alternative name.
    DnsSan,
    /// The subject's common name.
    CommonName,
}

/// The default order: URI SAN, else DNS SAN, else CN.
pub const DEFAULT_IDENTITY_ORDER: [IdentitySource; 3] = [
    IdentitySource::UriSan,
    IdentitySource::DnsSan,
    IdentitySource::CommonName,
];

/// Reads the identity of a certificate's subject, trying `order` in turn.
/// Returns `Ok(None)` when the certificate names nobody in those places.
pub fn identity_from_cert(
    cert: &CertificateDer<'_>,
    order: &[IdentitySource],
) -> Result<Option<String>> {
    let (_, x509) = X509Certificate::from_der(cert).map_err(|e| Error::X509(e.to_string()))?;
    let sans: Vec<GeneralName<'_>> = match x509.subject_alternative_name() {
        Ok(Some(ext)) => ext.value.general_names.clone(),
        Ok(None) => Vec::new(),
        Err(e) => return Err(Error::X509(e.to_string())),
    };
    for source in order {
        let found = match source {
            IdentitySource::UriSan => sans.iter().find_map(|n| match n {
                GeneralName::URI(uri) => Some((*uri).to_owned()),
                _ => None,
            }),
            IdentitySource::DnsSan => sans.iter().find_map(|n| match n {
                GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                _ => None,
            }),
            IdentitySource::CommonName => x509
                .subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_owned),
        };
        if let Some(identity) = found.filter(|s| !s.is_empty()) {
            return Ok(Some(identity));
        }
    }
    Ok(None)
}

/// Whether `now` (seconds since the Unix epoch) falls within the
/// certificate's validity period. A resumed TLS session carries the
/// certificate of the handshake that issued its ticket without checking it
/// again: the gateway checks this on every resumed connection, so a
/// certificate that expired since cannot keep resuming.
pub fn valid_at(cert: &CertificateDer<'_>, now: i64) -> Result<bool> {
    let (_, x509) = X509Certificate::from_der(cert).map_err(|e| Error::X509(e.to_string()))?;
    let validity = x509.validity();
    Ok(validity.not_before.timestamp() <= now && now <= validity.not_after.timestamp())
}

/// The certificate's notAfter in Unix seconds: what the components export
/// as `certificate_not_after_seconds`, so an alert can warn before it ends.
pub fn not_after(cert: &CertificateDer<'_>) -> Result<i64> {
    let (_, x509) = X509Certificate::from_der(cert).map_err(|e| Error::X509(e.to_string()))?;
    Ok(x509.validity().not_after.timestamp())
}

/// The notAfter (Unix seconds) of the leaf, the first certificate, of the
/// PEM file at `path`.
pub fn leaf_not_after(path: &std::path::Path) -> Result<i64> {
    let certs = crate::pem::load_certs(path)?;
    // load_certs refuses a file without a certificate.
    not_after(&certs[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{DevCa, Leaf};

    fn der(pem: &str) -> CertificateDer<'static> {
        use rustls_pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn validity_is_read_from_the_certificate() {
        let ca = DevCa::generate("test ca").unwrap();
        let leaf = ca
            .issue(&Leaf::client("a").with_validity(std::time::Duration::from_secs(3600)))
            .unwrap();
        let cert = der(&leaf.cert_pem);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(valid_at(&cert, now).unwrap());
        assert!(!valid_at(&cert, now + 7200).unwrap(), "expired");
        assert!(
            !valid_at(&cert, now - 7 * 24 * 3600).unwrap(),
            "not yet valid"
        );
    }

    #[test]
    fn not_after_is_the_end_of_validity_in_unix_seconds() {
        let ca = DevCa::generate("test ca").unwrap();
        let leaf = ca
            .issue(&Leaf::client("a").with_validity(std::time::Duration::from_secs(3600)))
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let end = not_after(&der(&leaf.cert_pem)).unwrap();
        assert!((now + 3500..=now + 3700).contains(&end), "{end} vs {now}");
        // From a file, the leaf: the first certificate, not the CA after it.
        let dir = tempfile::tempdir().unwrap();
        let chain = format!("{}{}", leaf.cert_pem, ca.cert_pem());
        let path = dir.path().join("chain.crt");
        std::fs::write(&path, chain).unwrap();
        assert_eq!(leaf_not_after(&path).unwrap(), end);
        std::fs::write(&path, "not a certificate").unwrap();
        assert!(leaf_not_after(&path).is_err());
    }

    #[test]
    fn uri_san_wins_then_dns_then_cn() {
        let ca = DevCa::generate("test ca").unwrap();
        let both = ca
            .issue(
                &Leaf::client("cn-a")
                    .with_uri("spiffe://t/agent/a")
                    .with_dns("a.example"),
            )
            .unwrap();
        let cert = der(&both.cert_pem);
        assert_eq!(
            identity_from_cert(&cert, &DEFAULT_IDENTITY_ORDER)
                .unwrap()
                .as_deref(),
            Some("spiffe://t/agent/a")
        );
        assert_eq!(
            identity_from_cert(&cert, &[IdentitySource::DnsSan])
                .unwrap()
                .as_deref(),
            Some("a.example")
        );
        let cn_only = ca.issue(&Leaf::client("just-cn")).unwrap();
        assert_eq!(
            identity_from_cert(&der(&cn_only.cert_pem), &DEFAULT_IDENTITY_ORDER)
                .unwrap()
                .as_deref(),
            Some("just-cn")
        );
        assert_eq!(
            identity_from_cert(&der(&cn_only.cert_pem), &[IdentitySource::UriSan]).unwrap(),
            None
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(
            identity_from_cert(
                &CertificateDer::from(vec![1, 2, 3]),
                &DEFAULT_IDENTITY_ORDER
            )
            .is_err()
        );
    }
}
