use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use spinlink_tls::dev::{DevCa, Leaf};

use super::SidecarVerifier;
use crate::config::PeerTlsConfig;

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

#[test]
fn a_peer_server_is_trusted_for_its_identity_and_ca_not_for_the_address_dialled() {
    let dir = tempfile::tempdir().unwrap();
    let ca = DevCa::generate("t").unwrap();
    let ca_file = ca.write(dir.path()).unwrap();
    let verifier = SidecarVerifier::new(&PeerTlsConfig {
        ca_file,
        peer_identities: vec!["spiffe://t/sidecar".into()],
        ..PeerTlsConfig::default()
    })
    .unwrap();
    // Dialled at a pod address no certificate names.
    let pod = ServerName::try_from("10.1.2.3").unwrap();
    let verify = |cert: &CertificateDer<'_>| {
        verifier.verify_server_cert(cert, &[], &pod, &[], UnixTime::now())
    };
    let sidecar = ca
        .issue(
            &Leaf::server("s")
                .also_client()
                .with_uri("spiffe://t/sidecar"),
        )
        .unwrap();
    verify(&der(&sidecar.cert_pem)).unwrap();
    // A gateway of the same CA, even one naming the address dialled.
    let gateway = ca
        .issue(
            &Leaf::server("g")
                .with_uri("spiffe://t/gateway")
                .with_ip("10.1.2.3".parse().unwrap()),
        )
        .unwrap();
    assert!(matches!(
        verify(&der(&gateway.cert_pem)),
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure
        ))
    ));
    // The sidecar identity from another CA.
    let other = DevCa::generate("other").unwrap();
    let forged = other
        .issue(&Leaf::server("s").with_uri("spiffe://t/sidecar"))
        .unwrap();
    assert!(matches!(
        verify(&der(&forged.cert_pem)),
        Err(rustls::Error::InvalidCertificate(_))
    ));
}
