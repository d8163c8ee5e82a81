//! Private keys as agents migrating from Armory's hold them: PKCS#8, plain
//! or encrypted with a password. The encrypted files were made by OpenSSL
//! (`openssl pkcs8 -topk8 -v2 aes-256-cbc`, `-v2 des3`, `-scrypt`) from
//! `ec-plain.pk8.pem`, with the password `test-password`.

use std::path::PathBuf;

use rustls_pki_types::PrivateKeyDer;
use spinlink_tls::pem::{load_key, load_key_with_password};

const PASSWORD: &str = "test-password";

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn pkcs8_bytes(key: &PrivateKeyDer<'_>) -> Vec<u8> {
    match key {
        PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
        other => panic!("not PKCS#8: {other:?}"),
    }
}

#[test]
fn encrypted_pkcs8_keys_decrypt_to_the_plain_key() {
    let plain = load_key(&data("ec-plain.pk8.pem")).unwrap();
    // Without a password the plain key loads through the same call.
    let same = load_key_with_password(&data("ec-plain.pk8.pem"), None).unwrap();
    assert_eq!(pkcs8_bytes(&plain), pkcs8_bytes(&same));
    for file in ["ec-aes256.pk8.pem", "ec-des3.pk8.pem", "ec-scrypt.pk8.pem"] {
        let key = load_key_with_password(&data(file), Some(PASSWORD))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(pkcs8_bytes(&key), pkcs8_bytes(&plain), "{file}");
        // And rustls takes it as a signing key.
        spinlink_tls::config::provider()
            .key_provider
            .load_private_key(key)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn a_wrong_password_is_refused_without_quoting_it() {
    let err = load_key_with_password(&data("ec-aes256.pk8.pem"), Some("not-the-password"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("ec-aes256.pk8.pem"), "{err}");
    assert!(err.contains("cannot decrypt"), "{err}");
    assert!(!err.contains("not-the-password"), "{err}");
}

#[test]
fn an_encrypted_key_needs_its_password_and_a_plain_key_takes_none() {
    // Without a password an encrypted key is not a key at all.
    let err = load_key(&data("ec-aes256.pk8.pem"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no private key"), "{err}");
    // A password for a plain key says the wrong file is named.
    let err = load_key_with_password(&data("ec-plain.pk8.pem"), Some(PASSWORD))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no encrypted PKCS#8 key"), "{err}");
    assert!(!err.contains(PASSWORD), "{err}");
}
