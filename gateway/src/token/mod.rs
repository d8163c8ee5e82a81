//! Channel tokens: stateless, unforgeable proof that `Hello` granted an
//! identity an account on one TLS connection until some time.
//!
//! ```text
//! token = base64url(version || expiry_unix (8, BE) || nonce (16) || tag (32))
//! tag   = HMAC-SHA256(key, version || lp(binding) || lp(identity) || lp(account)
//!                          || expiry || nonce)        lp(x) = len(x) as u32 BE || x
//! ```
//! The key is random per process, so tokens die with the gateway that issued
//! them (agents call `Hello` again after reconnecting anyway: a new connection
//! has a new binding). Length prefixes keep the MAC input unambiguous, so
//! identity `a` + account `bc` never collides with `ab` + `c`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use spinlink_tls::binding::ConnectionBinding;

/// The token format version this gateway issues and accepts.
pub const TOKEN_VERSION: u8 = 1;
const EXPIRY_LEN: usize = 8;
const NONCE_LEN: usize = 16;
const TAG_LEN: usize = 32;
const TOKEN_BYTES: usize = 1 + EXPIRY_LEN + NONCE_LEN + TAG_LEN;
/// Length of an encoded token (base64url without padding).
pub const TOKEN_LEN: usize = (TOKEN_BYTES * 4).div_ceil(3);

/// Why a token could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The system random generator failed.
    #[error("system random number generator failed")]
    Random,
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a presented token was refused. The messages are safe to send to the
/// agent: they say which check failed, never what the right value would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not a token of this format at all.
    #[error("malformed channel token")]
    Malformed,
    /// A format version this gateway does not know.
    #[error("unknown channel token version")]
    UnknownVersion,
    /// The MAC does not match: another connection, identity, account or key.
    #[error("channel token not valid for this connection, identity and account")]
    Mismatch,
    /// The token is past its expiry.
    #[error("channel token expired")]
    Expired,
}

/// An issued token. Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ChannelToken(String);

impl std::fmt::Debug for ChannelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChannelToken(..)")
    }
}

impl ChannelToken {
    /// The token text, for the wire only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The token text, for the wire only.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// What a token is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Claims<'a> {
    /// The connection's binding.
    pub binding: &'a ConnectionBinding,
    /// The agent identity.
    pub identity: &'a str,
    /// The account.
    pub account: &'a str,
}

/// The per-process key that issues and checks tokens.
pub struct TokenKey {
    key: hmac::Key,
    rng: SystemRandom,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// Seconds since the Unix epoch (0 for times before it).
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl TokenKey {
    /// A fresh random key.
    pub fn generate() -> Result<Self> {
        let rng = SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng).map_err(|_| Error::Random)?;
        Ok(Self { key, rng })
    }

    /// Issues a token for `claims`, valid from `now` for `ttl`. Returns the
    /// token and its expiry in Unix seconds.
    pub fn issue(
        &self,
        claims: Claims<'_>,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<(ChannelToken, u64)> {
        let expiry = unix_seconds(now).saturating_add(ttl.as_secs());
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| Error::Random)?;
        let tag = self.tag(claims, expiry, &nonce);
        let mut raw = Vec::with_capacity(TOKEN_BYTES);
        raw.push(TOKEN_VERSION);
        raw.extend_from_slice(&expiry.to_be_bytes());
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(tag.as_ref());
        Ok((ChannelToken(URL_SAFE_NO_PAD.encode(raw)), expiry))
    }

    /// Checks `token` against `claims` at `now`; returns its expiry.
    pub fn verify(&self, token: &str, claims: Claims<'_>, now: SystemTime) -> Result<u64, Refused> {
        // Reject by length before decoding so arbitrary input costs nothing.
        if token.len() != TOKEN_LEN {
            return Err(Refused::Malformed);
        }
        let raw = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| Refused::Malformed)?;
        let [version, rest @ ..] = raw.as_slice() else {
            return Err(Refused::Malformed);
        };
        if *version != TOKEN_VERSION {
            return Err(Refused::UnknownVersion);
        }
        let (expiry, rest) = rest
            .split_first_chunk::<EXPIRY_LEN>()
            .ok_or(Refused::Malformed)?;
        let (nonce, tag) = rest
            .split_first_chunk::<NONCE_LEN>()
            .ok_or(Refused::Malformed)?;
        if tag.len() != TAG_LEN {
            return Err(Refused::Malformed);
        }
        let expiry = u64::from_be_bytes(*expiry);
        hmac::verify(&self.key, &self.message(claims, expiry, nonce), tag)
            .map_err(|_| Refused::Mismatch)?;
        if unix_seconds(now) >= expiry {
            return Err(Refused::Expired);
        }
        Ok(expiry)
    }

    fn tag(&self, claims: Claims<'_>, expiry: u64, nonce: &[u8; NONCE_LEN]) -> hmac::Tag {
        hmac::sign(&self.key, &self.message(claims, expiry, nonce))
    }

    fn message(&self, claims: Claims<'_>, expiry: u64, nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
        let mut msg = Vec::with_capacity(
            1 + 12 + claims.binding.0.len() + claims.identity.len() + claims.account.len() + 24,
        );
        msg.push(TOKEN_VERSION);
        for field in [
            &claims.binding.0[..],
            claims.identity.as_bytes(),
            claims.account.as_bytes(),
        ] {
            // Fields longer than u32::MAX cannot reach here (header limits),
            // but saturate rather than wrap to keep the encoding injective in
            // practice and the code panic-free.
            let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
            msg.extend_from_slice(&len.to_be_bytes());
            msg.extend_from_slice(field);
        }
        msg.extend_from_slice(&expiry.to_be_bytes());
        msg.extend_from_slice(nonce);
        msg
    }
}

/// The channel tokens already verified on one connection, so a stream that
/// presents one again costs a comparison, not an HMAC. An entry is exact:
/// the same identity, account and token text, and still unexpired; since
/// the connection's binding is fixed, that is the check the HMAC made. At
/// most [`VerifiedTokens::MAX`] are kept, the oldest replaced.
#[derive(Debug, Default)]
pub struct VerifiedTokens {
    entries: std::sync::Mutex<Vec<Verified>>,
}

#[derive(Debug)]
struct Verified {
    identity: std::sync::Arc<str>,
    account: Box<str>,
    token: Box<str>,
    expiry: u64,
}

impl VerifiedTokens {
    /// Most tokens kept per connection (one per account it serves, and the
    /// renewed ones during rotation).
    pub const MAX: usize = 64;

    /// Checks `token` as [`TokenKey::verify`] does, from this connection's
    /// record when it holds the token, else with `key` (recording success).
    pub fn verify(
        &self,
        key: &TokenKey,
        token: &str,
        claims: Claims<'_>,
        now: SystemTime,
    ) -> Result<u64, Refused> {
        let seen = |v: &Verified| {
            *v.token == *token && *v.account == *claims.account && *v.identity == *claims.identity
        };
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = entries.iter().find(|v| seen(v)) {
                if unix_seconds(now) >= v.expiry {
                    return Err(Refused::Expired);
                }
                return Ok(v.expiry);
            }
        }
        let expiry = key.verify(token, claims, now)?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        // Expired ones go first; past the bound, the oldest.
        let at = unix_seconds(now);
        entries.retain(|v| v.expiry > at);
        if entries.len() >= Self::MAX {
            entries.remove(0);
        }
        entries.push(Verified {
            identity: claims.identity.into(),
            account: claims.account.into(),
            token: token.into(),
            expiry,
        });
        Ok(expiry)
    }
}

#[cfg(test)]
mod tests;
