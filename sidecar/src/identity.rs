//! Whose certificate connected: the identity a verified client or server
//! certificate names, judged against a configured list — the tunnel's
//! gateways, the peer port's sidecars. Start with [`listed`].

use std::collections::BTreeSet;

use rustls::pki_types::CertificateDer;
use spinlink_tls::identity::{IdentitySource, identity_from_cert};

/// Where a gateway's or a sidecar's identity is read from its certificate:
/// the gateway's own default order without the common name, which a CA
/// checks least and an agent's certificate carries too (its agent id).
pub const IDENTITY_ORDER: [IdentitySource; 2] = [IdentitySource::UriSan, IdentitySource::DnsSan];

/// Whether a verified chain's leaf names one of a configured set of
/// identities: the tunnel's gateways ([`crate::tunnel::gateways`]), the
/// peer port's sidecars ([`crate::peer`], [`crate::peer_client`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listed {
    /// Its identity, one of the set.
    Yes(String),
    /// Its identity as read, in none of the set (none when it has neither
    /// a URI nor a DNS SAN, or does not parse).
    No(Option<String>),
    /// There is no certificate.
    NoCertificate,
}

/// Reads the identity of `chain`'s leaf (verified by the handshake) as
/// [`IDENTITY_ORDER`] says and looks it up in `identities`, exactly.
pub fn listed(identities: &BTreeSet<String>, chain: Option<&[CertificateDer<'_>]>) -> Listed {
    let Some(leaf) = chain.and_then(<[_]>::first) else {
        return Listed::NoCertificate;
    };
    // A leaf that does not parse names nobody.
    match identity_from_cert(leaf, &IDENTITY_ORDER) {
        Ok(Some(id)) if identities.contains(&id) => Listed::Yes(id),
        Ok(id) => Listed::No(id),
        Err(_) => Listed::No(None),
    }
}
