//! Reading certificates, private keys and CA bundles from PEM files.

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{Error, Result};

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        path: path.to_owned(),
        source,
    })
}

/// Reads every certificate in a PEM file (a chain or a CA bundle).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::InvalidPem {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => Error::NoPrivateKey(path.to_owned()),
        other => Error::InvalidPem {
            path: path.to_owned(),
            message: other.to_string(),
        },
    })
}

/// PEM label of an encrypted PKCS#8 key (RFC 5958).
const ENCRYPTED_LABEL: &str = "ENCRYPTED PRIVATE KEY";

/// Reads a private key as [`load_key`] does, or, with a `password`, the
/// encrypted PKCS#8 key (`ENCRYPTED PRIVATE KEY`, PBES2 with PBKDF2 or
/// scrypt and AES-CBC, or 3DES) in the file. A password for a key that is
/// not encrypted is refused rather than ignored: it says the wrong file is
/// named. Errors never contain the password or the key.
pub fn load_key_with_password(
    path: &Path,
    password: Option<&str>,
) -> Result<PrivateKeyDer<'static>> {
    let Some(password) = password else {
        return load_key(path);
    };
    let bytes = zeroize::Zeroizing::new(read(path)?);
    let decrypt_error = |message: &str| Error::KeyDecrypt {
        path: path.to_owned(),
        message: message.to_owned(),
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| decrypt_error("not a PEM file"))?;
    let begin = format!("-----BEGIN {ENCRYPTED_LABEL}-----");
    let end = format!("-----END {ENCRYPTED_LABEL}-----");
    let block = text.find(&begin).and_then(|start| {
        let stop = start + text[start..].find(&end)? + end.len();
        Some(&text[start..stop])
    });
    let Some(block) = block else {
        return Err(decrypt_error(
            "a key password is set but the file holds no encrypted PKCS#8 key \
             (ENCRYPTED PRIVATE KEY)",
        ));
    };
    let (_, document) = pkcs8::SecretDocument::from_pem(block)
        .map_err(|_| decrypt_error("invalid encrypted PKCS#8 PEM"))?;
    let info: pkcs8::EncryptedPrivateKeyInfo<'_> = document
        .decode_msg()
        .map_err(|_| decrypt_error("invalid encrypted PKCS#8 key"))?;
    let plain = info.decrypt(password.as_bytes()).map_err(|_| {
        decrypt_error("cannot decrypt the key: wrong password or unsupported encryption")
    })?;
    Ok(PrivateKeyDer::Pkcs8(plain.as_bytes().to_vec().into()))
}
