//! Who may speak to the tunnel: only the gateways named in
//! `tunnel.tls.gatewayIdentities`. The client CA alone does not say it —
//! the same CA may sign agents' certificates, and whoever is served here
//! sets the `spinlink-verified-*` headers the gateway alone may set.
//!
//! A connection's peer is judged once, when its handshake completes
//! ([`Gateways::judge`]), and every stream it opens is admitted or refused
//! by [`admit`], the tunnel service's interceptor.
//!
//! Refused at the first stream, not at the handshake: a TLS alert reads as
//! a network or certificate fault at the other end, while a
//! `PermissionDenied` naming the key tells the operator of a gateway whose
//! identity is missing from the list what to change. Nothing a refused peer
//! sends reaches a handler: the interceptor runs before any message is read.

use std::collections::BTreeSet;

use rustls::pki_types::CertificateDer;
use tonic::{Request, Status};

use super::ConnectInfo;
use crate::identity::{Listed, listed};
use crate::metrics::Metrics;

/// The `reason` of refusals of a certificate that names no gateway.
pub const REFUSED_NOT_GATEWAY: &str = "not_gateway";
/// The `reason` of refusals of a connection without a verified certificate
/// (cannot happen while the client certificate is required; kept so such a
/// change would refuse rather than admit).
pub const REFUSED_NO_CERTIFICATE: &str = "no_certificate";

/// The gateway identities the tunnel serves.
#[derive(Debug, Clone, Default)]
pub struct Gateways {
    identities: BTreeSet<String>,
}

/// What a tunnel connection's peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A plaintext connection (`tunnel.insecure`, development only):
    /// nothing to check.
    Plaintext,
    /// A certificate naming one of the configured gateways.
    Gateway(String),
    /// A verified certificate naming no configured gateway: its identity
    /// as read (none when it has neither a URI nor a DNS SAN).
    NotGateway(Option<String>),
    /// No certificate was presented.
    NoCertificate,
}

impl Gateways {
    /// Serves exactly `identities`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(identities: I) -> Self {
        Self {
            identities: identities.into_iter().map(Into::into).collect(),
        }
    }

    /// Judges the peer of a TLS connection from its verified chain, leaf
    /// first.
    pub fn judge(&self, chain: Option<&[CertificateDer<'_>]>) -> Peer {
        match listed(&self.identities, chain) {
            Listed::Yes(id) => Peer::Gateway(id),
            Listed::No(id) => Peer::NotGateway(id),
            Listed::NoCertificate => Peer::NoCertificate,
        }
    }
}

/// Admits a stream whose connection's peer is a gateway (or plaintext);
/// refuses any other with `PermissionDenied`, counted by reason. The
/// interceptor of the tunnel service.
pub fn admit(request: Request<()>, metrics: &Metrics) -> Result<Request<()>, Status> {
    let peer = request
        .extensions()
        .get::<ConnectInfo>()
        .map(|c| (c.peer, c.gateway.clone()));
    let (addr, reason) = match peer {
        Some((_, Peer::Plaintext | Peer::Gateway(_))) => return Ok(request),
        Some((addr, Peer::NotGateway(_))) => (Some(addr), REFUSED_NOT_GATEWAY),
        Some((addr, Peer::NoCertificate)) => (Some(addr), REFUSED_NO_CERTIFICATE),
        // Every connection is a `TunnelIo`; if not, nothing vouches for it.
        None => (None, REFUSED_NO_CERTIFICATE),
    };
    metrics.tunnel_refused(reason);
    // Logged per connection when it is accepted; per stream only at debug.
    tracing::debug!(peer = ?addr, reason, "tunnel stream refused: not a gateway");
    Err(Status::permission_denied(
        "the sidecar's tunnel serves only gateways: this client certificate is not \
         one of its tunnel.tls.gatewayIdentities",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject as _;
    use spinlink_tls::dev::{DevCa, Leaf};

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn only_listed_uri_or_dns_sans_are_gateways() {
        let ca = DevCa::generate("t").unwrap();
        let gateways = Gateways::new(["spiffe://t/gateway", "gw.example"]);
        let judge = |leaf: &Leaf| {
            let cert = der(&ca.issue(leaf).unwrap().cert_pem);
            gateways.judge(Some(std::slice::from_ref(&cert)))
        };
        assert_eq!(
            judge(&Leaf::client("gw").with_uri("spiffe://t/gateway")),
            Peer::Gateway("spiffe://t/gateway".into())
        );
        assert_eq!(
            judge(&Leaf::client("x").with_dns("gw.example")),
            Peer::Gateway("gw.example".into())
        );
        // An agent of the same CA.
        assert_eq!(
            judge(&Leaf::client("a").with_uri("spiffe://t/agent/a")),
            Peer::NotGateway(Some("spiffe://t/agent/a".into()))
        );
        // The URI SAN is the identity: a listed DNS name beside another
        // URI does not make a gateway.
        assert_eq!(
            judge(
                &Leaf::client("a")
                    .with_uri("spiffe://t/agent/a")
                    .with_dns("gw.example")
            ),
            Peer::NotGateway(Some("spiffe://t/agent/a".into()))
        );
        // A common name is never read, even one spelling a gateway's name.
        assert_eq!(judge(&Leaf::client("gw.example")), Peer::NotGateway(None));
        assert_eq!(gateways.judge(None), Peer::NoCertificate);
        assert_eq!(
            gateways.judge(Some(&[CertificateDer::from(vec![1, 2, 3])])),
            Peer::NotGateway(None)
        );
    }

    #[test]
    fn admit_counts_what_it_refuses() {
        let metrics = Metrics::new();
        let with = |gateway: Peer| {
            let mut r = Request::new(());
            r.extensions_mut().insert(ConnectInfo {
                peer: "127.0.0.1:1".parse().unwrap(),
                client_certificate: gateway != Peer::Plaintext,
                gateway,
            });
            r
        };
        assert!(admit(with(Peer::Plaintext), &metrics).is_ok());
        assert!(admit(with(Peer::Gateway("g".into())), &metrics).is_ok());
        let refused = admit(with(Peer::NotGateway(Some("a".into()))), &metrics).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(refused.message().contains("tunnel.tls.gatewayIdentities"));
        assert!(admit(Request::new(()), &metrics).is_err());
        let text = metrics.render(&[]);
        assert!(
            text.contains(r#"spinlink_sidecar_tunnel_refused_total{reason="not_gateway"} 1"#)
                && text.contains(
                    r#"spinlink_sidecar_tunnel_refused_total{reason="no_certificate"} 1"#
                ),
            "{text}"
        );
    }
}
