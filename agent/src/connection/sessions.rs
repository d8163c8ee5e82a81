//! TLS session tickets kept across reconnects, and the client configuration
//! they resume with. The certificate files may rotate between dials, so
//! tickets and configurations live here, per content of the TLS files, not
//! in one connection's configuration. A returning agent that offers a ticket
//! resumes its session — no certificate exchange, a fraction of a full
//! handshake's cost — and the gateway admits it ahead of strangers in a
//! reconnect storm (the gateway's `listener::limits::Admission`).
//!
//! rustls resumes a session only with the very certificate verifier and
//! client certificate (the same `Arc`s) that made it, so a configuration
//! built afresh for each dial never resumes: [`client_config`] builds one
//! per content of the files and every dial clones it.
//!
//! Keyed by the *content* of the CA, certificate and key files, never their
//! paths: a ticket speaks for the identity of the certificate it was issued
//! to, so one certificate's tickets must never be offered with another's.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};

use ring::digest;
use rustls::ClientConfig;
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore};

/// Gateways' tickets kept per set of files (the gateway names it serves
/// under), as rustls keeps them.
pub const SESSIONS_PER_IDENTITY: usize = 32;
/// Sets of files remembered at once; past it all are forgotten (a process
/// has one or two: the running and a rotated certificate).
pub const MAX_IDENTITIES: usize = 64;

type Stores = HashMap<[u8; 32], Arc<ClientSessionMemoryCache>>;

static STORES: LazyLock<Mutex<Stores>> = LazyLock::new(Mutex::default);

static CONFIGS: LazyLock<Mutex<HashMap<[u8; 32], ClientConfig>>> = LazyLock::new(Mutex::default);

/// The client configuration for a dial with these files, resuming from
/// `store` (default: the process's store for the files): built by `build`
/// once per content of the files and cloned for each dial after, so every
/// dial shares the verifier and client certificate its tickets were issued
/// under. The files are read once per dial. Files that cannot be read, or
/// that change while it is built, are built each time.
pub fn client_config<E>(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    store: Option<Arc<dyn ClientSessionStore>>,
    build: impl FnOnce() -> Result<ClientConfig, E>,
) -> Result<ClientConfig, E> {
    let key = content_key(ca, identity);
    let store = store.unwrap_or_else(|| store_for(key));
    let cached = key.and_then(|key| {
        CONFIGS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    });
    let mut config = match (cached, key) {
        (Some(config), _) => config,
        (None, None) => build()?,
        (None, Some(key)) => {
            let built = build()?;
            if content_key(ca, identity) == Some(key) {
                let mut configs = CONFIGS.lock().unwrap_or_else(|e| e.into_inner());
                if configs.len() >= MAX_IDENTITIES {
                    configs.clear();
                }
                configs.insert(key, built.clone());
            }
            built
        }
    };
    config.resumption = rustls::client::Resumption::store(store);
    Ok(config)
}

/// The session store for connections made with these files. Files that
/// cannot be read get a store of their own that nothing else shares
/// (building the configuration reports the error).
pub fn store(ca: &Path, identity: Option<(&Path, &Path)>) -> Arc<dyn ClientSessionStore> {
    store_for(content_key(ca, identity))
}

/// The store for files whose content has `key` (`None`: unreadable).
fn store_for(key: Option<[u8; 32]>) -> Arc<dyn ClientSessionStore> {
    let Some(key) = key else {
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
