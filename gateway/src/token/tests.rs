use proptest::prelude::*;

use super::*;

const TTL: Duration = Duration::from_secs(900);

fn at(unix: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix)
}

fn claims<'a>(binding: &'a ConnectionBinding, identity: &'a str, account: &'a str) -> Claims<'a> {
    Claims {
        binding,
        identity,
        account,
    }
}

const NOW: u64 = 1_700_000_000;
const A1: &str = "spiffe://spinlink.dev/agent/a1";

#[test]
fn encoded_length_matches_constant() {
    let key = TokenKey::generate().unwrap();
    let b = ConnectionBinding([7; 32]);
    let (token, expiry) = key.issue(claims(&b, A1, "dev"), at(NOW), TTL).unwrap();
    assert_eq!(token.expose().len(), TOKEN_LEN);
    assert_eq!(expiry, NOW + 900);
}

#[test]
fn valid_token_verifies_until_expiry() {
    let key = TokenKey::generate().unwrap();
    let b = ConnectionBinding([1; 32]);
    let c = claims(&b, A1, "dev-1");
    let (token, expiry) = key.issue(c, at(NOW), TTL).unwrap();
    assert_eq!(key.verify(token.expose(), c, at(NOW)), Ok(expiry));
    assert_eq!(key.verify(token.expose(), c, at(expiry - 1)), Ok(expiry));
    assert_eq!(
        key.verify(token.expose(), c, at(expiry)),
        Err(Refused::Expired)
    );
    assert_eq!(
        key.verify(token.expose(), c, at(expiry + 3600)),
        Err(Refused::Expired)
    );
}

#[test]
fn other_binding_identity_account_or_key_refused() {
    let key = TokenKey::generate().unwrap();
    let b = ConnectionBinding([1; 32]);
    let other_b = ConnectionBinding([2; 32]);
    let (token, _) = key.issue(claims(&b, A1, "dev-1"), at(NOW), TTL).unwrap();
    let t = token.expose();
    assert_eq!(
        key.verify(t, claims(&other_b, A1, "dev-1"), at(NOW)),
        Err(Refused::Mismatch)
    );
    assert_eq!(
        key.verify(
            t,
            claims(&b, "spiffe://spinlink.dev/agent/a2", "dev-1"),
            at(NOW)
        ),
        Err(Refused::Mismatch)
    );
    assert_eq!(
        key.verify(t, claims(&b, A1, "dev-2"), at(NOW)),
        Err(Refused::Mismatch)
    );
    let other_key = TokenKey::generate().unwrap();
    assert_eq!(
        other_key.verify(t, claims(&b, A1, "dev-1"), at(NOW)),
        Err(Refused::Mismatch)
    );
}

#[test]
fn field_boundaries_are_unambiguous() {
    let key = TokenKey::generate().unwrap();
    let b = ConnectionBinding([3; 32]);
    let (token, _) = key.issue(claims(&b, "ab", "c"), at(NOW), TTL).unwrap();
    assert_eq!(
        key.verify(token.expose(), claims(&b, "a", "bc"), at(NOW)),
        Err(Refused::Mismatch)
    );
}

#[test]
fn tampered_expiry_or_version_refused() {
    let key = TokenKey::generate().unwrap();
    let b = ConnectionBinding([4; 32]);
    let c = claims(&b, A1, "dev");
    let (token, _) = key.issue(c, at(NOW), TTL).unwrap();
    let mut raw = URL_SAFE_NO_PAD.decode(token.expose()).unwrap();
    // Push the expiry a year out: the MAC no longer matches.
    let later = (NOW + 365 * 86_400).to_be_bytes();
    raw[1..9].copy_from_slice(&later);
    let forged = URL_SAFE_NO_PAD.encode(&raw);
    assert_eq!(key.verify(&forged, c, at(NOW)), Err(Refused::Mismatch));
    raw[0] = 2;
    let forged = URL_SAFE_NO_PAD.encode(&raw);
    assert_eq!(
        key.verify(&forged, c, at(NOW)),
        Err(Refused::UnknownVersion)
    );
}

#[test]
fn debug_does_not_show_the_token() {
    let key = TokenKey::generate().unwrap();
    let b = ConnectionBinding([5; 32]);
    let (token, _) = key.issue(claims(&b, A1, "dev"), at(NOW), TTL).unwrap();
    let shown = format!("{token:?} {key:?}");
    assert!(!shown.contains(token.expose()), "{shown}");
}

#[test]
fn truncated_tokens_refused() {
    let key = TokenKey::generate().unwrap();
    let b = ConnectionBinding([6; 32]);
    let c = claims(&b, A1, "dev");
    let (token, _) = key.issue(c, at(NOW), TTL).unwrap();
    let t = token.expose();
    for end in 0..t.len() {
        assert!(key.verify(&t[..end], c, at(NOW)).is_err(), "prefix {end}");
    }
    assert!(key.verify(&format!("{t}A"), c, at(NOW)).is_err());
}

proptest! {
    #[test]
    fn random_strings_refused_without_panic(s in ".{0,120}") {
        let key = TokenKey::generate().unwrap();
        let b = ConnectionBinding([0; 32]);
        prop_assert!(key.verify(&s, claims(&b, A1, "dev"), at(NOW)).is_err());
    }

    #[test]
    fn random_token_shaped_strings_refused(s in "[A-Za-z0-9_-]{76}") {
        let key = TokenKey::generate().unwrap();
        let b = ConnectionBinding([0; 32]);
        prop_assert!(key.verify(&s, claims(&b, A1, "dev"), at(NOW)).is_err());
    }

    #[test]
    fn any_single_bit_flip_refused(byte in 0usize..TOKEN_BYTES, bit in 0u8..8) {
        let key = TokenKey::generate().unwrap();
        let b = ConnectionBinding([9; 32]);
        let c = claims(&b, A1, "dev");
        let (token, _) = key.issue(c, at(NOW), TTL).unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(token.expose()).unwrap();
        raw[byte] ^= 1 << bit;
        prop_assert!(key.verify(&URL_SAFE_NO_PAD.encode(&raw), c, at(NOW)).is_err());
    }
}

#[test]
fn a_token_seen_on_its_connection_is_taken_without_a_second_hmac_but_still_exactly() {
    let key = TokenKey::generate().unwrap();
    let seen = VerifiedTokens::default();
    let binding = ConnectionBinding([3; 32]);
    let claims = Claims {
        binding: &binding,
        identity: "id-1",
        account: "acct",
    };
    let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
    let (token, expiry) = key.issue(claims, t0, Duration::from_secs(60)).unwrap();
    assert_eq!(seen.verify(&key, token.expose(), claims, t0), Ok(expiry));
    // Recorded: a key that could not verify it still accepts it here…
    let other_key = TokenKey::generate().unwrap();
    assert_eq!(
        seen.verify(&other_key, token.expose(), claims, t0),
        Ok(expiry)
    );
    // …but only for the same identity and account, and not once expired.
    let other_account = Claims {
        account: "acct-2",
        ..claims
    };
    assert!(
        seen.verify(&key, token.expose(), other_account, t0)
            .is_err()
    );
    let other_identity = Claims {
        identity: "id-2",
        ..claims
    };
    assert!(
        seen.verify(&key, token.expose(), other_identity, t0)
            .is_err()
    );
    let late = UNIX_EPOCH + Duration::from_secs(expiry);
    assert_eq!(
        seen.verify(&key, token.expose(), claims, late),
        Err(Refused::Expired)
    );
    // A forged token is never recorded.
    let forged = "A".repeat(token.expose().len());
    assert!(seen.verify(&key, &forged, claims, t0).is_err());
    assert!(seen.verify(&other_key, &forged, claims, t0).is_err());
}
