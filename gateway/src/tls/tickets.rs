//! TLS 1.3 session tickets every gateway of a deployment can open.
//!
//! An agent that reconnects presents the ticket of its last session; a
//! resumed handshake skips the certificate exchange and verification and
//! costs a fraction of a full one, and the ticket is a proof, readable
//! before TLS starts ([`super::client_hello`]), that the peer completed an
//! mTLS handshake with this deployment lately: the listener admits such
//! peers first ([`crate::listener`]).
//!
//! The sealing key is derived (HKDF-SHA256) from the listener's private key
//! and client CA bundle and the current hour, not drawn at random per
//! process: an agent cut by one gateway's restart or drain lands on another
//! (or the restarted one) with a ticket it can open. Rotating the key or
//! the CA bundle makes every outstanding ticket worthless, so a resumed
//! session never outlives the trust that admitted the original one.

use std::time::{SystemTime, UNIX_EPOCH};

use ring::aead::{self, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// How long one sealing key is used to issue tickets; a ticket is accepted
/// during its key's period and the next, and clients are told to drop it
/// after this long.
pub const TICKET_PERIOD_SECONDS: u64 = 3600;

/// Bytes before the sealed session: the period the key belongs to.
const PERIOD_LEN: usize = 8;

/// Issues and opens session tickets with keys derived from `secret`.
pub struct Tickets {
    prk: hkdf::Prk,
    rng: SystemRandom,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tickets").finish_non_exhaustive()
    }
}

impl Tickets {
    /// Tickets keyed by `secret` (the listener's key and client CA bytes).
    pub fn new(secret: &[&[u8]]) -> Self {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"spinlink tls13 session tickets v1");
        let mut ikm = Vec::new();
        for part in secret {
            ikm.extend_from_slice(&(part.len() as u64).to_be_bytes());
            ikm.extend_from_slice(part);
        }
        Self {
            prk: salt.extract(&ikm),
            rng: SystemRandom::new(),
        }
    }

    fn key(&self, period: u64) -> Option<LessSafeKey> {
        let info = period.to_be_bytes();
        let info = [&info[..]];
        let okm = self.prk.expand(&info, &aead::CHACHA20_POLY1305).ok()?;
        Some(LessSafeKey::new(UnboundKey::from(okm)))
    }

    fn period_now() -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        now / TICKET_PERIOD_SECONDS
    }

    /// Seals `plain` with the key of `period`.
    fn seal(&self, period: u64, plain: &[u8]) -> Option<Vec<u8>> {
        let key = self.key(period)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let head = period.to_be_bytes();
        let mut out = Vec::with_capacity(PERIOD_LEN + NONCE_LEN + plain.len() + 16);
        out.extend_from_slice(&head);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(head),
            &mut body,
        )
        .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    /// Opens `ticket` if it was sealed in `now` or the period before.
    fn open(&self, now: u64, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < PERIOD_LEN + NONCE_LEN + aead::CHACHA20_POLY1305.tag_len() {
            return None;
        }
        let (head, rest) = ticket.split_at(PERIOD_LEN);
        let period = u64::from_be_bytes(head.try_into().ok()?);
        if period != now && period.checked_add(1) != Some(now) {
            return None;
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let key = self.key(period)?;
        let mut body = sealed.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(head.to_vec()), &mut body)
            .ok()?;
        Some(plain.to_vec())
    }

    /// Whether `ticket` is one of ours and still in date: checked before
    /// TLS, so it must be cheap (one HKDF and one AEAD open, no allocation
    /// beyond the ticket's size).
    pub fn is_ours(&self, ticket: &[u8]) -> bool {
        self.open(Self::period_now(), ticket).is_some()
    }
}

impl rustls::server::ProducesTickets for Tickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        TICKET_PERIOD_SECONDS as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal(Self::period_now(), plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open(Self::period_now(), cipher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_open_where_sealed_and_in_the_next_period_only() {
        let t = Tickets::new(&[b"key", b"ca"]);
        let sealed = t.seal(100, b"session").unwrap();
        assert_eq!(t.open(100, &sealed).as_deref(), Some(&b"session"[..]));
        assert_eq!(t.open(101, &sealed).as_deref(), Some(&b"session"[..]));
        assert_eq!(t.open(102, &sealed), None);
        assert_eq!(t.open(99, &sealed), None);
        // Another gateway with the same material opens it; other material does not.
        assert!(Tickets::new(&[b"key", b"ca"]).open(100, &sealed).is_some());
        assert!(
            Tickets::new(&[b"key", b"other ca"])
                .open(100, &sealed)
                .is_none()
        );
        // Tampering anywhere, the period included, is refused.
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(t.open(100, &bad), None, "byte {i}");
        }
        assert_eq!(t.open(100, &sealed[..10]), None);
    }
}
