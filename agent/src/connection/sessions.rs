//! TLS session tickets kept across reconnects. Every dial builds a fresh
//! rustls client configuration (the certificate files may have rotated), so
//! the tickets the gateway sent on the last connection would be lost with
//! it; they live here instead, per set of TLS files. A returning agent that
//! offers one resumes its session — no certificate exchange, a fraction of
//! a full handshake's cost — and the gateway admits it ahead of strangers
//! in a reconnect storm (the gateway's `listener::limits::Admission`).
//!
//! Keyed by the *content* of the CA, certificate and key files, never their
//! paths: a ticket speaks for the identity of the certificate it was issued
//! to, so one certificate's tickets must never be offered with another's.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};

use ring::digest;
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore};

/// Gateways' tickets kept per set of files (the gateway names it serves
/// under), as rustls keeps them.
pub const SESSIONS_PER_IDENTITY: usize = 32;
/// Sets of files remembered at once; past it all are forgotten (a process
/// has one or two: the running and a rotated certificate).
pub const MAX_IDENTITIES: usize = 64;

type Stores = HashMap<[u8; 32], Arc<ClientSessionMemoryCache>>;

static STORES: LazyLock<Mutex<Stores>> = LazyLock::new(Mutex::default);

/// The session store for connections made with these files. Files that
/// cannot be read get a store of their own that nothing else shares
/// (building the configuration reports the error).
pub fn store(ca: &Path, identity: Option<(&Path, &Path)>) -> Arc<dyn ClientSessionStore> {
    let Some(key) = content_key(ca, identity) else {
        return Arc::new(ClientSessionMemoryCache::new(SESSIONS_PER_IDENTITY));
    };
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    if stores.len() >= MAX_IDENTITIES && !stores.contains_key(&key) {
        stores.clear();
    }
    stores
        .entry(key)
        .or_insert_with(|| Arc::new(ClientSessionMemoryCache::new(SESSIONS_PER_IDENTITY)))
        .clone()
}

fn content_key(ca: &Path, identity: Option<(&Path, &Path)>) -> Option<[u8; 32]> {
    let mut ctx = digest::Context::new(&digest::SHA256);
    let mut add = |path: &Path| -> Option<()> {
        let bytes = std::fs::read(path).ok()?;
        ctx.update(&(bytes.len() as u64).to_be_bytes());
        ctx.update(&bytes);
        Some(())
    };
    add(ca)?;
    if let Some((cert, key)) = identity {
        add(cert)?;
        add(key)?;
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_files_share_a_store_other_content_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            p
        };
        let (ca, cert, key) = (write("ca", "ca"), write("cert", "a"), write("key", "k"));
        let a = store(&ca, Some((&cert, &key)));
        let again = store(&ca, Some((&cert, &key)));
        assert!(Arc::ptr_eq(&a, &again));
        // Same path, new certificate: a store of its own.
        std::fs::write(&cert, "b").unwrap();
        let rotated = store(&ca, Some((&cert, &key)));
        assert!(!Arc::ptr_eq(&a, &rotated));
        let anonymous = store(&ca, None);
        assert!(!Arc::ptr_eq(&a, &anonymous));
    }
}
