//! Bootstrap JWTs, for clusters without per-agent certificates
//! ([`JwtVerifier`]). An agent connecting without a client certificate (the
//! TLS layer allows that only when `jwtBootstrap` is configured) presents a
//! signed JWT in its `Hello`'s [`BOOTSTRAP_JWT_HEADER`] metadata; the gateway
//! checks signature (ES256, RS256 or EdDSA with a key from the JWKS file,
//! chosen by `kid`), `exp`, `nbf` and `aud`, then takes the identity from
//! `sub` and the accounts it may serve from the configured claim.
//!
//! The signature is checked by `jsonwebtoken` (on `ring`, the gateway's one
//! crypto provider); time claims are checked here against the caller's clock
//! so tests and fuzzing are deterministic. JWTs are never logged.
//!
//! The JWKS file is re-read while the gateway runs ([`JwksReloader`]): keys
//! rotate by publishing a new set, and a set that does not load is refused
//! with a log line while the old keys stay in service.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::JwtBootstrapConfig;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// The `Hello` metadata key a bootstrap JWT travels in. Dropped before any
/// stream goes upstream.
pub const BOOTSTRAP_JWT_HEADER: &str = "spinlink-bootstrap-jwt";
/// Longest JWT accepted, in bytes: a bound on the work one `Hello` makes.
pub const MAX_JWT_LEN: usize = 16 * 1024;

/// Why the JWKS could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A required key is missing or empty.
    #[error("required")]
    Required(&'static str),
    /// The JWKS file could not be read.
    #[error("reading {path}: {source}")]
    ReadJwks {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The JWKS file is not a JWK set.
    #[error("{path} is not a JWK set: {source}")]
    ParseJwks {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A key of an unsupported type, or one that does not decode.
    #[error("{path}: key {index}: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// Index of the key in `keys`.
        index: usize,
        /// What is wrong.
        message: String,
    },
}

impl LoadError {
    /// The configuration key the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            Self::Required(key) => key,
            _ => "jwtBootstrap.jwksFile",
        }
    }
}

/// Why a bootstrap JWT was refused. The text says why, never what the JWT was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not a JWT (three base64url parts, JSON header and claims), or too long.
    #[error("bootstrap JWT malformed")]
    Malformed,
    /// The header's `kid` names no key in the JWKS (or names none while the
    /// JWKS holds several keys).
    #[error("bootstrap JWT signed with an unknown key")]
    UnknownKey,
    /// The header's `alg` is not the algorithm of the key it names.
    #[error("bootstrap JWT algorithm does not match its key")]
    Algorithm,
    /// The signature does not verify.
    #[error("bootstrap JWT signature invalid")]
    Signature,
    /// Past `exp` (plus leeway).
    #[error("bootstrap JWT expired")]
    Expired,
    /// Before `nbf` (minus leeway).
    #[error("bootstrap JWT not yet valid")]
    NotYetValid,
    /// No accepted `aud`.
    #[error("bootstrap JWT audience not accepted")]
    Audience,
    /// No accepted `iss`.
    #[error("bootstrap JWT issuer not accepted")]
    Issuer,
    /// A required claim is missing, empty or of the wrong type.
    #[error("bootstrap JWT claim {0} missing or invalid")]
    MissingClaim(String),
}

impl JwtError {
    /// A short label, for metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::Algorithm => "algorithm",
            Self::Signature => "signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Audience => "audience",
            Self::Issuer => "issuer",
            Self::MissingClaim(_) => "missing_claim",
        }
    }
}

/// What a valid bootstrap JWT says.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// The identity: the JWT's `sub`.
    pub identity: Arc<str>,
    /// The accounts the JWT grants.
    pub accounts: GlobSet,
    /// `exp`, seconds since the epoch.
    pub expires_at: u64,
}

impl Bootstrap {
    /// Whether the JWT lets its identity serve `account`.
    pub fn allows(&self, account: &str) -> bool {
        self.accounts.is_match(account)
    }
}

struct Key {
    key: DecodingKey,
    algorithm: Algorithm,
    validation: Validation,
}

/// Keys by `kid`; a key without one is stored under "".
type Keys = HashMap<String, Key>;

/// The keys in service, shared with the [`JwksReloader`].
type SharedKeys = Arc<RwLock<Arc<Keys>>>;

/// Checks bootstrap JWTs against the keys of a JWKS file.
pub struct JwtVerifier {
    keys: SharedKeys,
    accounts_claim: String,
    issuers: Vec<String>,
    leeway: u64,
    /// Where the keys came from, when from a file.
    source: Option<Arc<JwksSource>>,
}

/// The JWKS file and the content in service.
#[derive(Debug)]
struct JwksSource {
    config: JwtBootstrapConfig,
    /// The content in service, and the last refused.
    seen: Mutex<crate::reload::Seen>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("keys", &self.current().keys().collect::<Vec<_>>())
            .field("accounts_claim", &self.accounts_claim)
            .finish_non_exhaustive()
    }
}

/// What [`JwksReloader::reload`] did.
#[derive(Debug)]
pub enum JwksReload {
    /// The file is as it was (or unreadable for the moment).
    Unchanged,
    /// The new keys are in service.
    Reloaded,
    /// The new content does not load; the old keys stay.
    Refused(LoadError),
}

/// Re-reads the JWKS file of a [`JwtVerifier`].
#[derive(Clone)]
pub struct JwksReloader {
    keys: SharedKeys,
    source: Arc<JwksSource>,
}

impl std::fmt::Debug for JwksReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksReloader")
            .field("file", &self.source.config.jwks_file)
            .finish_non_exhaustive()
    }
}

impl JwksReloader {
    fn seen(&self) -> std::sync::MutexGuard<'_, crate::reload::Seen> {
        self.source.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the file; new content that loads replaces the keys (content is
    /// compared, so a mounted Secret's `..data` swap is seen).
    pub fn reload(&self) -> JwksReload {
        let path = &self.source.config.jwks_file;
        // A file missing for a moment (mid-rotation) is not a change.
        let Ok(text) = std::fs::read(path) else {
            return JwksReload::Unchanged;
        };
        let hash = ring::digest::digest(&ring::digest::SHA256, &text)
            .as_ref()
            .to_vec();
        if !self.seen().is_new(&hash) {
            return JwksReload::Unchanged;
        }
        match parse_keys(&text, &self.source.config) {
            Ok(keys) => {
                let kids = keys.len();
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
                self.seen().accept(hash);
                tracing::info!(file = %path.display(), keys = kids, "bootstrap JWKS reloaded");
                JwksReload::Reloaded
            }
            Err(e) => {
                self.seen().refuse(hash);
                tracing::error!(
                    file = %path.display(),
                    error = %e,
                    "new bootstrap JWKS refused; the previous keys stay in service"
                );
                JwksReload::Refused(e)
            }
        }
    }

    /// Calls [`JwksReloader::reload`] every `interval` until `shutdown`.
    pub async fn run(self, interval: Duration, shutdown: tokio_util::sync::CancellationToken) {
        crate::reload::poll_blocking(interval, shutdown, "bootstrap JWKS", move || {
            self.reload();
        })
        .await;
    }
}

/// The keys of `set`; `Err((index, message))` names a bad key.
fn keys_from_jwks(set: &JwkSet, config: &JwtBootstrapConfig) -> Result<Keys, (usize, String)> {
    if config.audiences.is_empty() {
        return Err((
            0,
            "jwtBootstrap.audiences must name at least one audience".into(),
        ));
    }
    if config.accounts_claim.is_empty() {
        return Err((0, "jwtBootstrap.accountsClaim must not be empty".into()));
    }
    if set.keys.is_empty() {
        return Err((0, "the JWK set has no keys".into()));
    }
    let mut keys = HashMap::new();
    for (index, jwk) in set.keys.iter().enumerate() {
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                Algorithm::EdDSA
            }
            _ => {
                return Err((
                    index,
                    "only EC P-256 (ES256), RSA (RS256) and OKP Ed25519 (EdDSA) keys are \
                     accepted"
                        .into(),
                ));
            }
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| (index, e.to_string()))?;
        let mut validation = Validation::new(algorithm);
        // Time claims are checked in `verify` against the caller's clock.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.required_spec_claims = ["exp", "sub", "aud"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        validation.set_audience(&config.audiences);
        let kid = jwk.common.key_id.clone().unwrap_or_default();
        if keys
            .insert(
                kid.clone(),
                Key {
                    key,
                    algorithm,
                    validation,
                },
            )
            .is_some()
        {
            return Err((index, format!("kid {kid:?} used twice")));
        }
    }
    Ok(keys)
}

/// Parses a JWKS file's bytes into keys.
fn parse_keys(text: &[u8], config: &JwtBootstrapConfig) -> Result<Keys, LoadError> {
    let set: JwkSet = serde_json::from_slice(text).map_err(|source| LoadError::ParseJwks {
        path: config.jwks_file.clone(),
        source,
    })?;
    keys_from_jwks(&set, config).map_err(|(index, message)| LoadError::Key {
        path: config.jwks_file.clone(),
        index,
        message,
    })
}

impl JwtVerifier {
    /// Reads the JWKS file `config` names and builds a verifier.
    pub fn load(config: &JwtBootstrapConfig) -> Result<Self, LoadError> {
        if config.jwks_file.as_os_str().is_empty() {
            return Err(LoadError::Required("jwtBootstrap.jwksFile"));
        }
        let text = std::fs::read(&config.jwks_file).map_err(|source| LoadError::ReadJwks {
            path: config.jwks_file.clone(),
            source,
        })?;
        let keys = parse_keys(&text, config)?;
        let hash = ring::digest::digest(&ring::digest::SHA256, &text)
            .as_ref()
            .to_vec();
        let mut verifier = Self::with_keys(keys, config);
        verifier.source = Some(Arc::new(JwksSource {
            config: config.clone(),
            seen: Mutex::new(crate::reload::Seen::new(hash)),
        }));
        Ok(verifier)
    }

    /// A verifier over `set`; `Err((index, message))` names a bad key.
    pub fn from_jwks(set: &JwkSet, config: &JwtBootstrapConfig) -> Result<Self, (usize, String)> {
        Ok(Self::with_keys(keys_from_jwks(set, config)?, config))
    }

    fn with_keys(keys: Keys, config: &JwtBootstrapConfig) -> Self {
        Self {
            keys: Arc::new(RwLock::new(Arc::new(keys))),
            accounts_claim: config.accounts_claim.clone(),
            issuers: config.issuers.clone(),
            leeway: config.leeway_seconds,
            source: None,
        }
    }

    /// The reloader of this verifier's JWKS file (`None` when it was built
    /// from a set in memory).
    pub fn reloader(&self) -> Option<JwksReloader> {
        Some(JwksReloader {
            keys: self.keys.clone(),
            source: self.source.clone()?,
        })
    }

    fn current(&self) -> Arc<Keys> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Checks `jwt` at `now`.
    pub fn verify(&self, jwt: &str, now: SystemTime) -> Result<Bootstrap, JwtError> {
        if jwt.len() > MAX_JWT_LEN {
            return Err(JwtError::Malformed);
        }
        let header = jsonwebtoken::decode_header(jwt).map_err(|_| JwtError::Malformed)?;
        let keys = self.current();
        let key = match &header.kid {
            Some(kid) => keys.get(kid),
            // Without a `kid` only an unambiguous JWKS will do.
            None if keys.len() == 1 => keys.values().next(),
            None => None,
        }
        .ok_or(JwtError::UnknownKey)?;
        if header.alg != key.algorithm {
            return Err(JwtError::Algorithm);
        }
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            jwt,
            &key.key,
            &key.validation,
        )
        .map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::InvalidSignature | K::Crypto(_) => JwtError::Signature,
                K::InvalidAudience => JwtError::Audience,
                K::InvalidAlgorithm => JwtError::Algorithm,
                K::MissingRequiredClaim(claim) => JwtError::MissingClaim(claim.clone()),
                _ => JwtError::Malformed,
            }
        })?;
        let claims = data.claims;
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let number = |name: &str| -> Result<Option<u64>, JwtError> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
                    .map(Some)
                    .ok_or_else(|| JwtError::MissingClaim(name.to_owned())),
            }
        };
        let exp = number("exp")?.ok_or_else(|| JwtError::MissingClaim("exp".into()))?;
        if exp.saturating_add(self.leeway) <= now {
            return Err(JwtError::Expired);
        }
        if let Some(nbf) = number("nbf")?
            && nbf > now.saturating_add(self.leeway)
        {
            return Err(JwtError::NotYetValid);
        }
        if !self.issuers.is_empty() {
            let iss = claims.get("iss").and_then(|v| v.as_str());
            if !iss.is_some_and(|iss| self.issuers.iter().any(|i| i == iss)) {
                return Err(JwtError::Issuer);
            }
        }
        let sub = claims
            .get("sub")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| JwtError::MissingClaim("sub".into()))?;
        let missing = || JwtError::MissingClaim(self.accounts_claim.clone());
        let patterns: Vec<&str> = match claims.get(&self.accounts_claim) {
            Some(serde_json::Value::String(s)) => s.split_whitespace().collect(),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().ok_or_else(missing))
                .collect::<Result<_, _>>()?,
            _ => return Err(missing()),
        };
        if patterns.is_empty() || patterns.iter().any(|p| p.is_empty()) {
            return Err(missing());
        }
        let mut set = GlobSetBuilder::new();
        for pattern in patterns {
            let glob = GlobBuilder::new(pattern)
                .literal_separator(true)
                .build()
                .map_err(|_| missing())?;
            set.add(glob);
        }
        Ok(Bootstrap {
            identity: sub.into(),
            accounts: set.build().map_err(|_| missing())?,
            expires_at: exp,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
