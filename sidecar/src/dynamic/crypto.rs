//! Encryption at rest of dynamic accounts' kubeconfigs: AES-256-GCM (ring)
//! under a key read from the file `accounts.encryptionKeyFile` names (32
//! bytes, raw or base64). A sealed value is `version (1) ‖ nonce (12) ‖
//! ciphertext ‖ tag (16)`, with the account name as associated data, so a
//! sealed kubeconfig copied onto another account's row does not open.

use base64::Engine as _;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The first byte of every sealed value: the format.
const VERSION: u8 = 1;
/// Key length of AES-256.
pub const KEY_LEN: usize = 32;

/// Why a key could not be loaded, or a value not sealed or opened. Never
/// carries key material or plaintext.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The key file could not be read.
    #[error("reading the encryption key file {path}: {source}")]
    ReadKey {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The key file holds neither 32 bytes nor base64 of 32 bytes.
    #[error("encryption key file {path}: must hold 32 bytes, raw or base64")]
    BadKey {
        /// The file.
        path: String,
    },
    /// No random nonce could be drawn.
    #[error("no randomness for a nonce")]
    Random,
    /// The value was sealed with another key, for another account, or is
    /// damaged.
    #[error("sealed value does not open (another key, another account, or damaged)")]
    Open,
}

/// A loaded key. Its `Debug` prints nothing of the key.
pub struct Cipher {
    key: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(AES-256-GCM)")
    }
}

impl Cipher {
    /// A cipher over `key` (exactly [`KEY_LEN`] bytes).
    pub fn new(key: &[u8]) -> Option<Self> {
        let key = UnboundKey::new(&AES_256_GCM, key).ok()?;
        Some(Self {
            key: LessSafeKey::new(key),
            random: SystemRandom::new(),
        })
    }

    /// The key in `path`: 32 raw bytes, or their base64 (standard alphabet,
    /// surrounding whitespace ignored).
    pub fn from_file(path: &std::path::Path) -> Result<Self, Error> {
        let named = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| Error::ReadKey {
            path: named.clone(),
            source,
        })?;
        let key = if bytes.len() == KEY_LEN {
            bytes
        } else {
            let text = std::str::from_utf8(&bytes).map_err(|_| Error::BadKey {
                path: named.clone(),
            })?;
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|_| Error::BadKey {
                    path: named.clone(),
                })?
        };
        if key.len() != KEY_LEN {
            return Err(Error::BadKey { path: named });
        }
        Self::new(&key).ok_or(Error::BadKey { path: named })
    }

    /// `plaintext` sealed for `account`, under a fresh random nonce.
    pub fn seal(&self, account: &str, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).map_err(|_| Error::Random)?;
        let mut sealed = Vec::with_capacity(1 + NONCE_LEN + plaintext.len() + 16);
        sealed.push(VERSION);
        sealed.extend_from_slice(&nonce);
        let mut body = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(account.as_bytes()),
                &mut body,
            )
            .map_err(|_| Error::Random)?;
        sealed.extend_from_slice(&body);
        Ok(sealed)
    }

    /// The plaintext of a value [`seal`](Self::seal) made for `account`.
    pub fn open(&self, account: &str, sealed: &[u8]) -> Result<Vec<u8>, Error> {
        let Some((&VERSION, rest)) = sealed.split_first() else {
            return Err(Error::Open);
        };
        if rest.len() < NONCE_LEN {
            return Err(Error::Open);
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Error::Open)?;
        let mut body = body.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(account.as_bytes()), &mut body)
            .map_err(|_| Error::Open)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"users: [{name: u, user: {token: s3cr3t-bearer-token}}]";

    #[test]
    fn seal_and_open_round_trip_without_the_plaintext_in_the_sealed_bytes() {
        let cipher = Cipher::new(&[7; KEY_LEN]).unwrap();
        let sealed = cipher.seal("prod", SECRET).unwrap();
        assert!(
            !sealed.windows(6).any(|w| w == b"s3cr3t"),
            "plaintext visible in the sealed value"
        );
        assert_eq!(sealed.len(), 1 + NONCE_LEN + SECRET.len() + 16);
        assert_eq!(cipher.open("prod", &sealed).unwrap(), SECRET);
        // Fresh nonce each time.
        assert_ne!(cipher.seal("prod", SECRET).unwrap(), sealed);
        // Another account, another key, or a flipped bit: refused.
        assert!(cipher.open("staging", &sealed).is_err());
        let other = Cipher::new(&[8; KEY_LEN]).unwrap();
        assert!(other.open("prod", &sealed).is_err());
        let mut damaged = sealed.clone();
        *damaged.last_mut().unwrap() ^= 1;
        assert!(cipher.open("prod", &damaged).is_err());
        assert!(cipher.open("prod", &[]).is_err());
        assert!(cipher.open("prod", &[VERSION, 1, 2]).is_err());
    }

    #[test]
    fn keys_load_raw_or_base64_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("raw");
        std::fs::write(&raw, [9u8; KEY_LEN]).unwrap();
        let b64 = dir.path().join("b64");
        let encoded = base64::engine::general_purpose::STANDARD.encode([9u8; KEY_LEN]);
        std::fs::write(&b64, format!("{encoded}\n")).unwrap();
        let a = Cipher::from_file(&raw).unwrap();
        let b = Cipher::from_file(&b64).unwrap();
        assert_eq!(
            b.open("x", &a.seal("x", b"same key").unwrap()).unwrap(),
            b"same key"
        );
        let short = dir.path().join("short");
        std::fs::write(&short, b"too short").unwrap();
        let err = Cipher::from_file(&short).unwrap_err().to_string();
        assert!(
            err.contains("32 bytes") && !err.contains("too short"),
            "{err}"
        );
        assert!(Cipher::from_file(&dir.path().join("missing")).is_err());
        assert_eq!(format!("{a:?}"), "Cipher(AES-256-GCM)");
    }
}
