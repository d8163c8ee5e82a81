//! Bootstrap JWTs signed with each algorithm, and each way one is refused.

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::json;

use super::*;

/// A signing key and its public JWK, for tests.
pub(crate) struct Signer {
    pub(crate) alg: Algorithm,
    pub(crate) kid: &'static str,
    key: EncodingKey,
    pub(crate) jwk: serde_json::Value,
}

impl Signer {
    pub(crate) fn es256(kid: &'static str) -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let point = pair.public_key().as_ref();
        Self {
            alg: Algorithm::ES256,
            kid,
            key: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid,
                "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                "y": URL_SAFE_NO_PAD.encode(&point[33..65])}),
        }
    }

    pub(crate) fn eddsa(kid: &'static str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        Self {
            alg: Algorithm::EdDSA,
            kid,
            key: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
                "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())}),
        }
    }

    /// A fixed 2048-bit key (ring cannot generate RSA keys).
    pub(crate) fn rs256(kid: &'static str) -> Self {
        Self {
            alg: Algorithm::RS256,
            kid,
            key: EncodingKey::from_rsa_der(include_bytes!("../testdata/rsa-key.der")),
            jwk: json!({"kty": "RSA", "kid": kid, "e": "AQAB",
                "n": include_str!("../testdata/rsa-n.txt").trim()}),
        }
    }

    pub(crate) fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

pub(crate) fn config() -> JwtBootstrapConfig {
    JwtBootstrapConfig {
        audiences: vec!["spinlink-gateway".into()],
        ..JwtBootstrapConfig::default()
    }
}

pub(crate) fn jwks(signers: &[&Signer]) -> serde_json::Value {
    json!({"keys": signers.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()})
}

pub(crate) fn verifier(signers: &[&Signer], config: &JwtBootstrapConfig) -> JwtVerifier {
    let set: JwkSet = serde_json::from_value(jwks(signers)).unwrap();
    JwtVerifier::from_jwks(&set, config).unwrap()
}

const NOW: u64 = 1_700_000_000;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

pub(crate) fn claims(sub: &str, accounts: &[&str], exp: u64) -> serde_json::Value {
    json!({"sub": sub, "aud": "spinlink-gateway", "exp": exp, "nbf": exp - 600,
        "spinlink_accounts": accounts})
}

#[test]
fn each_algorithm_verifies() {
    let signers = [
        Signer::es256("ec"),
        Signer::rs256("rsa"),
        Signer::eddsa("ed"),
    ];
    let v = verifier(&signers.iter().collect::<Vec<_>>(), &config());
    for s in &signers {
        let jwt = s.sign(&claims("cluster-7", &["dev-*", "staging"], NOW + 300));
        let b = v
            .verify(&jwt, now())
            .unwrap_or_else(|e| panic!("{:?}: {e}", s.alg));
        assert_eq!(&*b.identity, "cluster-7");
        assert_eq!(b.expires_at, NOW + 300);
        assert!(b.allows("dev-1") && b.allows("staging"));
        assert!(!b.allows("prod") && !b.allows("staging-2"));
    }
}

#[test]
fn time_claims_are_checked_with_leeway() {
    let s = Signer::es256("ec");
    let v = verifier(&[&s], &config());
    let expired = s.sign(&claims("c", &["dev"], NOW - 31));
    assert_eq!(v.verify(&expired, now()).unwrap_err(), JwtError::Expired);
    // Within the 30 s leeway.
    let just = s.sign(&claims("c", &["dev"], NOW - 10));
    assert!(v.verify(&just, now()).is_ok());
    let mut early = claims("c", &["dev"], NOW + 3600);
    early["nbf"] = json!(NOW + 120);
    assert_eq!(
        v.verify(&s.sign(&early), now()).unwrap_err(),
        JwtError::NotYetValid
    );
}

#[test]
fn wrong_audience_refused() {
    let s = Signer::eddsa("ed");
    let v = verifier(&[&s], &config());
    let mut c = claims("c", &["dev"], NOW + 60);
    c["aud"] = json!("someone-else");
    assert_eq!(
        v.verify(&s.sign(&c), now()).unwrap_err(),
        JwtError::Audience
    );
    c["aud"] = json!(["someone-else", "spinlink-gateway"]);
    assert!(v.verify(&s.sign(&c), now()).is_ok());
}

#[test]
fn unknown_kid_refused() {
    let known = Signer::es256("known");
    let other = Signer::es256("other");
    let v = verifier(&[&known, &Signer::rs256("rsa")], &config());
    let jwt = other.sign(&claims("c", &["dev"], NOW + 60));
    assert_eq!(v.verify(&jwt, now()).unwrap_err(), JwtError::UnknownKey);
}

#[test]
fn bad_signature_refused() {
    let real = Signer::es256("k");
    // Same kid, different key: a forger who knows the kid.
    let forger = Signer::es256("k");
    let v = verifier(&[&real], &config());
    let jwt = forger.sign(&claims("c", &["dev"], NOW + 60));
    assert_eq!(v.verify(&jwt, now()).unwrap_err(), JwtError::Signature);
    // A tampered payload under the real signature.
    let jwt = real.sign(&claims("c", &["dev"], NOW + 60));
    let mut parts: Vec<&str> = jwt.split('.').collect();
    let forged = URL_SAFE_NO_PAD.encode(claims("c", &["*"], NOW + 60).to_string());
    parts[1] = &forged;
    assert_eq!(
        v.verify(&parts.join("."), now()).unwrap_err(),
        JwtError::Signature
    );
}

#[test]
fn algorithm_must_match_the_key() {
    let ec = Signer::es256("k");
    let v = verifier(&[&Signer::rs256("k")], &config());
    let jwt = ec.sign(&claims("c", &["dev"], NOW + 60));
    assert_eq!(v.verify(&jwt, now()).unwrap_err(), JwtError::Algorithm);
}

#[test]
fn missing_claims_refused() {
    let s = Signer::rs256("k");
    let v = verifier(&[&s], &config());
    for (claim, want) in [
        ("sub", "sub"),
        ("exp", "exp"),
        ("aud", "aud"),
        ("spinlink_accounts", "spinlink_accounts"),
    ] {
        let mut c = claims("c", &["dev"], NOW + 60);
        c.as_object_mut().unwrap().remove(claim);
        assert_eq!(
            v.verify(&s.sign(&c), now()).unwrap_err(),
            JwtError::MissingClaim(want.into()),
            "without {claim}"
        );
    }
    let mut c = claims("", &["dev"], NOW + 60);
    assert_eq!(
        v.verify(&s.sign(&c), now()).unwrap_err(),
        JwtError::MissingClaim("sub".into())
    );
    c = claims("c", &[], NOW + 60);
    assert_eq!(
        v.verify(&s.sign(&c), now()).unwrap_err(),
        JwtError::MissingClaim("spinlink_accounts".into())
    );
    c = claims("c", &["dev"], NOW + 60);
    c["spinlink_accounts"] = json!([1, 2]);
    assert!(matches!(
        v.verify(&s.sign(&c), now()),
        Err(JwtError::MissingClaim(_))
    ));
}

#[test]
fn accounts_claim_and_issuer_are_configurable() {
    let s = Signer::es256("k");
    let config = JwtBootstrapConfig {
        accounts_claim: "accts".into(),
        issuers: vec!["https://issuer.example".into()],
        ..config()
    };
    let v = verifier(&[&s], &config);
    let mut c = claims("c", &[], NOW + 60);
    c["accts"] = json!("dev-1 dev-2");
    assert_eq!(v.verify(&s.sign(&c), now()).unwrap_err(), JwtError::Issuer);
    c["iss"] = json!("https://issuer.example");
    let b = v.verify(&s.sign(&c), now()).unwrap();
    assert!(b.allows("dev-2") && !b.allows("dev-3"));
}

#[test]
fn garbage_is_malformed_and_errors_do_not_echo_the_jwt() {
    let s = Signer::es256("k");
    let v = verifier(&[&s], &config());
    for jwt in ["", "a.b.c", "not a jwt", "..", &"x".repeat(MAX_JWT_LEN + 1)] {
        assert_eq!(v.verify(jwt, now()).unwrap_err(), JwtError::Malformed);
    }
    let jwt = s.sign(&claims("c", &["dev"], NOW - 1000));
    let err = v.verify(&jwt, now()).unwrap_err();
    assert!(!err.to_string().contains(&jwt[..20]));
}

#[test]
fn bad_jwks_named_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    let config = JwtBootstrapConfig {
        jwks_file: path.clone(),
        ..config()
    };
    assert!(matches!(
        JwtVerifier::load(&config),
        Err(LoadError::ReadJwks { .. })
    ));
    std::fs::write(&path, "{}").unwrap();
    assert!(matches!(
        JwtVerifier::load(&config),
        Err(LoadError::ParseJwks { .. })
    ));
    std::fs::write(&path, r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#).unwrap();
    let err = JwtVerifier::load(&config).unwrap_err();
    assert!(matches!(err, LoadError::Key { index: 0, .. }), "{err}");
    std::fs::write(&path, jwks(&[&Signer::eddsa("a")]).to_string()).unwrap();
    assert!(JwtVerifier::load(&config).is_ok());
    assert_eq!(err.key(), "jwtBootstrap.jwksFile");
}

#[test]
fn the_jwks_file_reloads_and_a_bad_one_keeps_the_old_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    let (old, new) = (Signer::es256("old"), Signer::eddsa("new"));
    std::fs::write(&file, jwks(&[&old]).to_string()).unwrap();
    let from_file = JwtBootstrapConfig {
        jwks_file: file.clone(),
        ..config()
    };
    let v = JwtVerifier::load(&from_file).unwrap();
    let reloader = v.reloader().expect("loaded from a file");
    let old_jwt = old.sign(&claims("c", &["a"], NOW + 300));
    let new_jwt = new.sign(&claims("c", &["a"], NOW + 300));
    assert!(matches!(reloader.reload(), JwksReload::Unchanged));
    assert!(v.verify(&old_jwt, now()).is_ok());
    assert!(matches!(
        v.verify(&new_jwt, now()),
        Err(JwtError::UnknownKey)
    ));

    // A rotation: the new key published, the old one withdrawn.
    std::fs::write(&file, jwks(&[&new]).to_string()).unwrap();
    assert!(matches!(reloader.reload(), JwksReload::Reloaded));
    assert!(v.verify(&new_jwt, now()).is_ok());
    assert!(matches!(
        v.verify(&old_jwt, now()),
        Err(JwtError::UnknownKey)
    ));

    // Garbage is refused once and the keys in service stay.
    std::fs::write(&file, "{ not json").unwrap();
    assert!(matches!(reloader.reload(), JwksReload::Refused(_)));
    assert!(matches!(reloader.reload(), JwksReload::Unchanged));
    assert!(v.verify(&new_jwt, now()).is_ok());
    // So does a set without keys.
    std::fs::write(&file, r#"{"keys": []}"#).unwrap();
    assert!(matches!(reloader.reload(), JwksReload::Refused(_)));
    assert!(v.verify(&new_jwt, now()).is_ok());

    // Built from a set in memory: nothing to reload.
    assert!(verifier(&[&old], &config()).reloader().is_none());
}
