//! Which identity serves each account on this gateway replica ([`Owners`]).
//! The first identity granted an account owns it until every connection on
//! which it was granted is gone; another identity offering it meanwhile is
//! refused (never silently ignored). The table is per replica: two replicas
//! behind one load balancer each enforce it for the connections they hold.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Owner {
    identity: Arc<str>,
    /// Connections holding a grant of the account for `identity`.
    conns: usize,
}

/// The account → owning identity table of one gateway replica.
#[derive(Debug, Default)]
pub struct Owners {
    table: Mutex<HashMap<String, Owner>>,
}

impl Owners {
    /// The identity owning `account` now, if any.
    pub fn owner(&self, account: &str) -> Option<Arc<str>> {
        self.lock().get(account).map(|o| o.identity.clone())
    }

    /// Number of owned accounts.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no account is owned.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owner>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self, account: &str, identity: &str) {
        let mut table = self.lock();
        if let Some(owner) = table.get_mut(account)
            && &*owner.identity == identity
        {
            owner.conns -= 1;
            if owner.conns == 0 {
                table.remove(account);
                tracing::debug!(account, identity, "account released");
            }
        }
    }
}

/// What [`ConnGrants::claim`] found on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// The connection did not hold the account yet.
    New,
    /// The connection already held it: the agent is renewing its token.
    Again,
}

/// The grants one connection holds; dropping it (when the connection ends)
/// releases them.
#[derive(Debug, Default)]
pub struct ConnGrants {
    held: Mutex<Option<Held>>,
}

/// The table claimed in, and the (account, identity) pairs claimed.
type Held = (Arc<Owners>, Vec<(String, Arc<str>)>);

impl ConnGrants {
    /// Claims `account` for `identity` on this connection. `Err(owner)` when
    /// another identity owns it. Claiming again what the connection already
    /// holds changes nothing but says so ([`Claimed::Again`]).
    pub fn claim(
        &self,
        owners: &Arc<Owners>,
        account: &str,
        identity: &Arc<str>,
    ) -> Result<Claimed, Arc<str>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (_, list) = held.get_or_insert_with(|| (owners.clone(), Vec::new()));
        if list.iter().any(|(a, i)| a == account && i == identity) {
            return Ok(Claimed::Again);
        }
        let mut table = owners.lock();
        match table.entry(account.to_owned()) {
            Entry::Occupied(mut e) => {
                let owner = e.get_mut();
                if owner.identity != *identity {
                    return Err(owner.identity.clone());
                }
                owner.conns += 1;
            }
            Entry::Vacant(e) => {
                e.insert(Owner {
                    identity: identity.clone(),
                    conns: 1,
                });
            }
        }
        list.push((account.to_owned(), identity.clone()));
        Ok(Claimed::New)
    }
}

impl Drop for ConnGrants {
    fn drop(&mut self) {
        let held = self
            .held
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((owners, list)) = held {
            for (account, identity) in list {
                owners.release(&account, &identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_identity_owns_until_its_last_connection_is_gone() {
        let owners = Arc::new(Owners::default());
        let a: Arc<str> = "spiffe://d/agent/a".into();
        let b: Arc<str> = "spiffe://d/agent/b".into();
        let a1 = ConnGrants::default();
        let a2 = ConnGrants::default();
        let b1 = ConnGrants::default();
        assert_eq!(a1.claim(&owners, "dev", &a), Ok(Claimed::New));
        // Again on the same connection: idempotent, and a renewal.
        assert_eq!(a1.claim(&owners, "dev", &a), Ok(Claimed::Again));
        // Same identity, second connection (make-before-break): fine, and
        // new for that connection.
        assert_eq!(a2.claim(&owners, "dev", &a), Ok(Claimed::New));
        assert_eq!(b1.claim(&owners, "dev", &b), Err(a.clone()));
        assert_eq!(b1.claim(&owners, "other", &b), Ok(Claimed::New));
        drop(a1);
        assert_eq!(b1.claim(&owners, "dev", &b), Err(a.clone()));
        drop(a2);
        assert_eq!(owners.owner("dev"), None);
        assert_eq!(b1.claim(&owners, "dev", &b), Ok(Claimed::New));
        assert_eq!(owners.owner("dev").as_deref(), Some(&*b));
        drop(b1);
        assert!(owners.is_empty());
    }
}
